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
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import (
    BackendEvent,
    Finished,
    FinishReason,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    UpstreamBadResponse,
)
from backends.openai_proxy.errors import from_stream_error
from backends.tool_markup.markup import new_call_id

DONE = b"[DONE]"
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
    """Stateful translation of one stream's chunks (one request, ``n`` choices)."""

    __slots__ = (
        "_calls",
        "_chat",
        "_finished",
        "_n",
        "_run",
        "_run_index",
        "_run_tokens",
        "counted_tokens",
        "done",
        "usage",
    )

    def __init__(self, *, chat: bool, n: int) -> None:
        self._chat = chat
        self._n = n
        self._finished: set[int] = set()
        self._calls: set[tuple[int, int]] = set()  # (choice, call index) already named
        self.done = False
        """The upstream sent ``[DONE]``."""
        self.usage: tuple[int, int] | None = None
        """``(prompt_tokens, completion_tokens)`` reported by the upstream."""
        self.counted_tokens = 0
        """Completion tokens counted from the deltas (fallback when ``usage`` is None)."""
        # The run of same-choice deltas of the read being translated, not emitted yet, as
        # (text, logprobs); empty between reads.
        self._run: list[tuple[str, tuple[TokenLogprob, ...]]] = []
        self._run_index = 0
        self._run_tokens = 0

    @property
    def all_finished(self) -> bool:
        return len(self._finished) >= self._n

    def translate_all(self, payloads: list[bytes], out: list[BackendEvent]) -> None:
        """Append the events of every ``data:`` payload of one read to ``out``, merging
        adjacent deltas of the same choice into one ``TextDelta`` (an engine that is ahead
        of us leaves several chunks in a read; relayed as one delta they cost the gateway
        one SSE frame, and the client sees what vLLM itself sends under load). A merged
        delta's ``logprobs`` and ``num_tokens`` cover exactly the tokens behind its text;
        each run is built once."""
        try:
            for chunk in self._decode(payloads):
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
            self._end_run(out)
        finally:
            self._run.clear()
            self._run_tokens = 0

    def _decode(self, payloads: list[bytes]) -> list[Any]:
        """The JSON values of one read's payloads, in order (``[DONE]`` noted, empty ones
        skipped). Parsed as one array when there are several: one parser call instead of
        one per chunk. If that fails, or yields another count (a payload holding more or
        less than one value), each is parsed alone, which names the bad one."""
        values: list[bytes] = []
        for payload in payloads:
            if payload == DONE:
                self.done = True
            elif payload:
                values.append(payload)
        if len(values) > 1:
            try:
                parsed = orjson.loads(b"[" + b",".join(values) + b"]")
            except orjson.JSONDecodeError:
                pass
            else:
                if len(parsed) == len(values):
                    return parsed  # type: ignore[no-any-return]
        return [_loads(value) for value in values]

    def finish(self, out: list[BackendEvent]) -> None:
        """At end of stream: close choices the upstream left open (only after ``[DONE]``)."""
        for index in range(self._n):
            if index not in self._finished:
                self._finished.add(index)
                out.append(Finished(index, "stop"))

    def _choice(self, choice: dict[str, Any], out: list[BackendEvent]) -> None:
        index = choice.get("index") or 0
        if index in self._finished:
            return
        if self._chat:
            delta = choice.get("delta")
            text = delta.get("content") if delta else None
            if delta and delta.get("tool_calls"):
                self._tool_calls(index, delta["tool_calls"], out)
        else:
            text = choice.get("text")
        raw_logprobs = choice.get("logprobs")
        logprobs = self._logprobs(raw_logprobs) if raw_logprobs else ()
        if text or logprobs:
            num_tokens = len(logprobs) or 1
            self.counted_tokens += num_tokens
            if self._run and self._run_index != index:
                self._end_run(out)
            self._run_index = index
            self._run_tokens += num_tokens
            self._run.append((text or "", logprobs))
        reason = choice.get("finish_reason")
        if reason:
            self._end_run(out)
            self._finished.add(index)
            # vLLM names the stop string that matched in `stop_reason` (a token id or
            # null otherwise); other engines send nothing there.
            matched = choice.get("stop_reason")
            stop = matched if reason == "stop" and isinstance(matched, str) else None
            out.append(Finished(index, REASONS.get(reason, "stop"), stop_sequence=stop))

    def _end_run(self, out: list[BackendEvent]) -> None:
        """Emit the pending run of deltas as one ``TextDelta``."""
        run = self._run
        if not run:
            return
        if len(run) == 1:
            text, logprobs = run[0]
        else:
            text = "".join([part for part, _ in run])
            logprobs = tuple([entry for _, entries in run for entry in entries])
        out.append(TextDelta(self._run_index, text, logprobs, self._run_tokens))
        run.clear()
        self._run_tokens = 0

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
