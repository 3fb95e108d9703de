"""Turn an upstream's SSE byte stream into ``BackendEvent`` values. No I/O here.

``SSEDecoder`` splits bytes into ``data:`` payloads; ``ChunkTranslator`` turns each
payload (an OpenAI ``chat.completion.chunk`` or ``text_completion`` object) into
``TextDelta`` and ``Finished`` events and remembers the usage. Both are owned by the one
coroutine relaying a single stream.

Parsing is tolerant where engines differ and strict where the data would be wrong:
``object`` and ``id`` are never checked (mlx-lm labels its usage chunk
``chat.completion``); chat text is read only from ``delta`` (never from a ``message``
that some engines add to their final chunk); unknown fields are ignored; a payload that
is not JSON, or an ``{"error": ...}`` object, raises.

Token counting without usage (llama.cpp ignores ``include_usage``): each content delta
counts as one token (or as many tokens as it carries logprobs). Engines stream one token
per chunk unless they coalesce, so this is exact for llama.cpp and a lower bound in
general; ``Usage`` from the upstream always wins when present.

Reasoning: a chat delta's thought is read from ``reasoning_content`` (DeepSeek's name,
llama.cpp's) or ``reasoning`` (vLLM 0.32's) and relayed as ``ReasoningDelta``. Where the
upstream sends no such field and the model names a reasoning parser
(``reasoning_parser:``), the content is split here by the same parser code the other
backends use (``backends.reasoning``); the first reasoning field the upstream sends
turns that off for the rest of the stream (it splits itself). Completions are relayed
raw. Reasoning tokens: the upstream's ``completion_tokens_details.reasoning_tokens``
when it reports more than 0 (vLLM 0.32 reports 0 even after a thought), else counted
here the same way as above: each chunk that carried thought (or, split here, held back
a marker inside one) counts as one token, or as many as its logprobs. Cached prompt
tokens: the usage's ``prompt_tokens_details.cached_tokens`` (vLLM sends it with
``--enable-prompt-tokens-details``, OpenAI always), 0 where the upstream says nothing.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import (
    BackendEvent,
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    UpstreamBadResponse,
)
from backends.openai_proxy.errors import from_stream_error
from backends.openai_proxy.shapes import Shape, learn
from backends.reasoning import Phase, ReasoningFormat, ReasoningParser, Split
from backends.tool_markup.markup import new_call_id

DONE = b"[DONE]"
_MAX_SHAPES = 4  # shapes kept per stream: one per choice and kind for n <= 2
# Shapes learnt in a row that no payload matched before this stream stops learning: an
# upstream whose plain deltas differ in more than their text (a per-token counter) would
# otherwise pay for a learn (~3 parses' worth) on every chunk.
_MAX_UNUSED = 4
REASONS: dict[str, FinishReason] = {
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
}


class SSEDecoder:
    """Splits a byte stream into the payloads of its ``data:`` lines.

    Each OpenAI stream event is one ``data:`` line, so a line is a payload; comments,
    ``event:``/``id:`` fields and blank separators are dropped. Partial lines are kept
    until the rest arrives.
    """

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, data: bytes) -> list[bytes]:
        if (  # one whole event in one read: a token-by-token stream's every read
            not self._tail
            and data.endswith(b"\n\n")
            and data.startswith(b"data:")
            and data.find(b"\n") == len(data) - 2  # (memchr; `count` walks every byte)
        ):
            return [data[5:-2].strip()]
        if self._tail:
            data = self._tail + data
        lines = data.split(b"\n")
        self._tail = lines.pop()
        return [line[5:].strip() for line in lines if line.startswith(b"data:")]

    def flush(self) -> list[bytes]:
        """Payload of a last line that ended without a newline, at end of stream."""
        tail, self._tail = self._tail, b""
        return [tail[5:].strip()] if tail.startswith(b"data:") else []


class ChunkTranslator:
    """Stateful translation of one stream's chunks (one request, ``n`` choices).

    ``reasoning``: the parser's format that splits a thought off the content when the
    upstream does not (chat only), its parsers starting ``in_thought`` or not."""

    __slots__ = (
        "_calls",
        "_chat",
        "_finished",
        "_format",
        "_in_thought",
        "_n",
        "_parsers",
        "_run",
        "_run_index",
        "_run_thought",
        "_run_tokens",
        "_shapes",
        "_unused",
        "_upstream_splits",
        "counted_reasoning",
        "counted_tokens",
        "done",
        "reported_cached",
        "reported_reasoning",
        "usage",
    )

    def __init__(
        self,
        *,
        chat: bool,
        n: int,
        reasoning: ReasoningFormat | None = None,
        in_thought: bool = False,
    ) -> None:
        self._chat = chat
        self._n = n
        self._finished: set[int] = set()
        self._calls: set[tuple[int, int]] = set()  # (choice, call index) already named
        self._format = reasoning if chat else None
        self._in_thought = in_thought
        self._parsers: dict[int, ReasoningParser] = {}
        self._upstream_splits = False
        self._shapes: list[Shape] = []
        """Shapes of this stream's plain deltas (``shapes``), the latest learnt first."""
        self._unused = 0  # shapes learnt since a payload last matched one
        self.done = False
        """The upstream sent ``[DONE]``."""
        self.usage: tuple[int, int] | None = None
        """``(prompt_tokens, completion_tokens)`` reported by the upstream."""
        self.reported_reasoning = 0
        """The upstream's ``completion_tokens_details.reasoning_tokens`` (0: none said)."""
        self.reported_cached = 0
        """The upstream's ``prompt_tokens_details.cached_tokens`` (0: none said)."""
        self.counted_tokens = 0
        """Completion tokens counted from the deltas (fallback when ``usage`` is None)."""
        self.counted_reasoning = 0
        """Of those, the thought's (see the module doc)."""
        # The run of same-choice, same-kind deltas of the read being translated, not
        # emitted yet, as (text, logprobs); empty between reads.
        self._run: list[tuple[str, tuple[TokenLogprob, ...]]] = []
        self._run_index = 0
        self._run_thought = False
        self._run_tokens = 0

    @property
    def reasoning_tokens(self) -> int:
        """The thought's tokens: the upstream's count where it gave one, else ours."""
        return self.reported_reasoning or self.counted_reasoning

    @property
    def all_finished(self) -> bool:
        return len(self._finished) >= self._n

    def translate_all(self, payloads: list[bytes], out: list[BackendEvent]) -> None:
        """Append the events of every ``data:`` payload of one read to ``out``, merging
        adjacent deltas of the same choice and kind into one ``TextDelta`` (or
        ``ReasoningDelta``: an engine that is ahead of us leaves several chunks in a read;
        relayed as one delta they cost the gateway one SSE frame, and the client sees what
        vLLM itself sends under load). A merged delta's ``logprobs`` and ``num_tokens``
        cover exactly the tokens behind its text; each run is built once.

        A payload shaped like an earlier plain delta of this stream gives its text
        without a JSON parse (``shapes``); the others are parsed, in order."""
        try:
            waiting: list[bytes] | None = None  # payloads to parse, in order
            for payload in payloads:
                if payload == DONE:
                    self.done = True
                    continue
                if not payload:
                    continue
                for shape in self._shapes:
                    text = shape.text(payload)
                    if text is not None:
                        if waiting:
                            self._parse(waiting, out)
                            waiting = None
                        self._shaped(shape, text, out)
                        break
                else:
                    if waiting is None:
                        waiting = []
                    waiting.append(payload)
            if waiting:
                self._parse(waiting, out)
            self._end_run(out)
        finally:
            if self._run:  # a read that raised: its run is dropped with the stream
                self._run.clear()
                self._run_tokens = 0

    def _parse(self, payloads: list[bytes], out: list[BackendEvent]) -> None:
        """Translate payloads by their parsed JSON; a plain delta teaches its shape
        (unless shapes learnt here stopped matching: ``_MAX_UNUSED``)."""
        for chunk, payload in zip(self._decode(payloads), payloads, strict=True):
            self._chunk(chunk, out)
            if self._unused < _MAX_UNUSED:
                shape = learn(chunk, payload, chat=self._chat)
                if shape is not None:
                    self._learnt(shape)

    def _chunk(self, chunk: Any, out: list[BackendEvent]) -> None:
        if type(chunk) is not dict:
            raise UpstreamBadResponse("upstream sent a stream event that is not an object")
        if chunk.get("error"):
            raise from_stream_error(chunk)
        choices = chunk.get("choices")
        if choices:
            for choice in choices:
                self._choice(choice, out)
        usage = chunk.get("usage")
        if usage:
            prompt = int(usage.get("prompt_tokens") or 0)
            self.usage = (prompt, int(usage.get("completion_tokens") or 0))
            details = usage.get("completion_tokens_details")
            if isinstance(details, dict):
                self.reported_reasoning = int(details.get("reasoning_tokens") or 0)
            prompt_details = usage.get("prompt_tokens_details")
            if isinstance(prompt_details, dict):
                self.reported_cached = int(prompt_details.get("cached_tokens") or 0)

    def _learnt(self, shape: Shape) -> None:
        """Keep ``shape`` in place of the one of its choice and kind (a few at most)."""
        shapes = [known for known in self._shapes if not known.same_slot(shape)]
        self._shapes = [shape, *shapes[: _MAX_SHAPES - 1]]
        self._unused += 1

    def _shaped(self, shape: Shape, text: str, out: list[BackendEvent]) -> None:
        """A payload of ``shape`` carrying ``text``: what ``_choice`` does with its parse."""
        self._unused = 0
        index = shape.index
        if text and index not in self._finished:
            if shape.thought:
                self._delta(index, None, text, (), out)
            else:
                self._delta(index, text, None, (), out)

    def _decode(self, payloads: list[bytes]) -> list[Any]:
        """The JSON values of one read's payloads, in order. Parsed as one array when
        there are several: one parser call instead of one per chunk. If that fails, or
        yields another count (a payload holding more or less than one value), each is
        parsed alone, which names the bad one."""
        if len(payloads) > 1:
            try:
                parsed = orjson.loads(b"[" + b",".join(payloads) + b"]")
            except orjson.JSONDecodeError:
                pass
            else:
                if len(parsed) == len(payloads):
                    return parsed  # type: ignore[no-any-return]
        return [_loads(payload) for payload in payloads]

    def finish(self, out: list[BackendEvent]) -> None:
        """At end of stream: close choices the upstream left open (only after ``[DONE]``)."""
        for index in range(self._n):
            if index not in self._finished:
                self._flush_parser(index, out)
                self._finished.add(index)
                out.append(Finished(index, "stop"))

    def _choice(self, choice: dict[str, Any], out: list[BackendEvent]) -> None:
        index = choice.get("index") or 0
        if index in self._finished:
            return
        thought: Any = None
        if self._chat:
            delta = choice.get("delta")
            text = delta.get("content") if delta else None
            if delta:
                thought = delta.get("reasoning_content") or delta.get("reasoning")
                if delta.get("tool_calls"):
                    self._tool_calls(index, delta["tool_calls"], out)
        else:
            text = choice.get("text")
        raw_logprobs = choice.get("logprobs")
        logprobs = self._logprobs(raw_logprobs) if raw_logprobs else ()
        if text or thought or logprobs:
            self._delta(index, text, thought, logprobs, out)
        reason = choice.get("finish_reason")
        if reason:
            self._flush_parser(index, out)
            self._end_run(out)
            self._finished.add(index)
            # vLLM names the stop string that matched in `stop_reason` (a token id or
            # null otherwise); other engines send nothing there.
            matched = choice.get("stop_reason")
            stop = matched if reason == "stop" and isinstance(matched, str) else None
            out.append(Finished(index, REASONS.get(reason, "stop"), stop_sequence=stop))

    def _delta(
        self,
        index: Any,
        text: Any,
        thought: Any,
        logprobs: tuple[TokenLogprob, ...],
        out: list[BackendEvent],
    ) -> None:
        """One chunk's text, thought and logprobs (at least one of them) for ``index``."""
        num_tokens = len(logprobs) or 1
        self.counted_tokens += num_tokens
        if thought:
            if not isinstance(thought, str):
                raise UpstreamBadResponse("upstream sent a reasoning field that is not text")
            self._upstream_splits = True
        if thought or (text and self._format is not None and not self._upstream_splits):
            self._relay(out, index, thought or "", text or "", logprobs=logprobs, tokens=num_tokens)
        else:  # the common case, inline: answer text, nothing to split
            if self._run and (self._run_index != index or self._run_thought):
                out.append(self._run_event())
            self._run_index = index
            self._run_thought = False
            self._run_tokens += num_tokens
            self._run.append((text or "", logprobs))

    def _relay(
        self,
        out: list[BackendEvent],
        index: int,
        thought: str,
        text: str,
        *,
        logprobs: tuple[TokenLogprob, ...],
        tokens: int,
    ) -> None:
        """Queue one chunk's thought and text (split here where the parser applies); its
        tokens ride on the thought when it has one, else on the text."""
        parser = None
        if text and self._format is not None and not self._upstream_splits:
            parser = self._parsers.get(index)
            if parser is None:
                parser = self._parsers[index] = self._format.parser(in_thought=self._in_thought)
            split = parser.feed(text)
            thought, text = thought + split.reasoning, split.content
        thinking = bool(thought) or (
            not text and parser is not None and parser.phase is Phase.THINKING
        )
        if thinking:
            self.counted_reasoning += tokens
        if thought:
            self._add(out, index, thought, thought=True, tokens=tokens)
        if text or logprobs:
            self._add(
                out, index, text, thought=False, logprobs=logprobs, tokens=0 if thought else tokens
            )
        elif not thought:
            self._run_tokens += tokens  # a marker held back: its token still counts

    def _add(
        self,
        out: list[BackendEvent],
        index: int,
        text: str,
        *,
        thought: bool,
        logprobs: tuple[TokenLogprob, ...] = (),
        tokens: int = 0,
    ) -> None:
        if self._run and (self._run_index != index or self._run_thought != thought):
            out.append(self._run_event())
        self._run_index = index
        self._run_thought = thought
        self._run_tokens += tokens
        self._run.append((text, logprobs))

    def _flush_parser(self, index: int, out: list[BackendEvent]) -> None:
        """At the end of a choice: the text its parser held back (a marker cut short)."""
        parser = self._parsers.pop(index, None)
        split = parser.finish() if parser is not None else Split()
        if split.reasoning:
            self._add(out, index, split.reasoning, thought=True)
        if split.content:
            self._add(out, index, split.content, thought=False)
        self._end_run(out)

    def _end_run(self, out: list[BackendEvent]) -> None:
        """Emit the pending run of deltas as one event (tokens of held-back markers with
        no run to ride on wait for the next one)."""
        if self._run:
            out.append(self._run_event())

    def _run_event(self) -> TextDelta | ReasoningDelta:
        """The run of deltas as one event; the run is then empty."""
        run = self._run
        if len(run) == 1:
            text, logprobs = run[0]
        else:
            text = "".join([part for part, _ in run])
            logprobs = tuple([entry for _, entries in run for entry in entries])
        tokens, self._run_tokens = self._run_tokens, 0
        run.clear()
        if self._run_thought:
            return ReasoningDelta(self._run_index, text, tokens)
        return TextDelta(self._run_index, text, logprobs, tokens)

    def _tool_calls(self, index: int, calls: Any, out: list[BackendEvent]) -> None:
        """Relay tool-call deltas as they came, normalised to OpenAI's framing: id and
        name on a call's first delta only (some engines repeat them on every delta, some
        omit the id), argument fragments untouched."""
        self._end_run(out)
        for call in calls if isinstance(calls, list) else ():
            if not isinstance(call, dict):
                raise UpstreamBadResponse("upstream sent a tool call that is not an object")
            position = call.get("index") or 0
            function = call.get("function") or {}
            fragment = function.get("arguments") or ""
            if not isinstance(fragment, str):
                raise UpstreamBadResponse("upstream sent tool-call arguments that are not text")
            self.counted_tokens += 1
            if (index, position) in self._calls:
                if fragment:
                    out.append(ToolCallDelta(index, position, arguments_fragment=fragment))
                continue
            self._calls.add((index, position))
            call_id = call.get("id") or new_call_id()
            out.append(
                ToolCallDelta(index, position, call_id, function.get("name") or "", fragment)
            )

    def _logprobs(self, raw: Any) -> tuple[TokenLogprob, ...]:
        if not isinstance(raw, dict):
            return ()
        if self._chat:
            return tuple(_chat_logprob(item) for item in raw.get("content") or ())
        return completion_logprobs(raw)


def _loads(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise UpstreamBadResponse(f"upstream sent invalid JSON in its stream: {exc}") from exc


def _chat_logprob(item: dict[str, Any]) -> TokenLogprob:
    token = item.get("token") or ""
    top = tuple(
        TopLogprob(
            alt.get("token") or "", _float(alt.get("logprob")), _bytes(alt.get("bytes"), alt)
        )
        for alt in item.get("top_logprobs") or ()
    )
    return TokenLogprob(token, _float(item.get("logprob")), _bytes(item.get("bytes"), item), top)


def completion_logprobs(raw: dict[str, Any]) -> tuple[TokenLogprob, ...]:
    tokens = raw.get("tokens") or ()
    values = raw.get("token_logprobs") or ()
    tops = raw.get("top_logprobs") or ()
    result = []
    for i, token in enumerate(tokens):
        top_map = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        top = tuple(
            TopLogprob(alt, _float(lp), tuple(alt.encode()))
            for alt, lp in sorted(top_map.items(), key=lambda kv: -_float(kv[1]))
        )
        value = values[i] if i < len(values) else None
        result.append(TokenLogprob(token, _float(value), tuple(token.encode()), top))
    return tuple(result)


def _float(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else -9999.0


def _bytes(value: Any, item: dict[str, Any]) -> tuple[int, ...]:
    if isinstance(value, list):
        return tuple(value)
    return tuple(str(item.get("token") or "").encode())
