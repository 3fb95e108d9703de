"""Mid-stream failover: continue a broken upstream stream on another replica.

A stream that breaks after text reached the client (connection reset, EOF without
``[DONE]``, an error event or invalid data mid-stream, a read timeout) is sent again with
the text already delivered as the start of the answer, so an engine continues it instead
of starting over. The client's stream goes on (same id: the gateway names the response,
not the upstream) with neither repeated nor missing text.

How a request is continued depends on the engine (``continuation``):

- chat on vLLM, or a ``generic`` server speaking vLLM's extension: the original messages
  plus an assistant message holding the delivered text, with
  ``continue_final_message: true, add_generation_prompt: false``;
- chat on llama.cpp: llama-cpp-python's chat route always opens a new assistant turn
  (its template is rendered with ``add_generation_prompt`` on and no way to turn it off),
  so the gateway renders the prompt with the model's chat template (``tokenizer:``),
  appends the delivered text and continues on ``/v1/completions``: the same prompt text
  the chat route would have tokenised, plus the answer so far;
- completions on any engine: the prompt extended by the delivered text.

``max_tokens`` shrinks by the tokens delivered; sampling settings and seed stay. A greedy
request continues as the uninterrupted run would, as far as the engine computes a token
the same in a prompt batch as in decoding one at a time and the text it is sent
tokenises into the ids that produced it; a sampled one continues plausibly, not
identically (its random state is not carried over).

Text is all llama-cpp-python takes (no token-id prompts), and a text can tokenise into
other ids than the ones generated (an engine may spell a word in two tokens that BPE
merges into one), which gives the next token another context. Where the model's
tokenizer is loaded (llama.cpp's ``tokenizer:``) a greedy continuation therefore carries
only the delivered deltas that tokenise back into their own ids (``exact_seam``) and
withholds the rest: the engine regenerates them, the relay checks that they match what
the client already has and drops them, and relays what follows. A continuation that does
not regenerate them (``SeamMismatch``) is replaced by one carrying the whole text.

Requests a continuation cannot rebuild are never resumed (``refusal``; the client gets
the SSE error event, as before): ``n`` > 1, ``logprobs``, a ``response_format`` (the
engine's grammar would restart at the seam), a prompt of token ids, a tool call already
streamed, chat on an engine that cannot continue a message, a thought already streamed
or split here (a continuation would have to carry the thought back into the prompt in the
model's markup, and a parser here would start over). ``Resume`` holds one
request's delivered answer: owned by the coroutine relaying it. ``Resumer`` is the
backend's read-only plan, built once from its config.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal

import orjson

from backends.base import (
    BackendError,
    BackendEvent,
    ChatMessage,
    Finished,
    GenerationRequest,
    ReasoningDelta,
    RequestKind,
    SamplingParams,
    TextDelta,
    ToolCallDelta,
    UpstreamBadResponse,
    UpstreamTimeout,
    UpstreamUnavailable,
    Usage,
    effective_max_tokens,
)
from backends.openai_proxy.engines import EngineProfile
from backends.openai_proxy.payload import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    engine_body,
    estimate_prompt_tokens,
)
from backends.openai_proxy.stream import ChunkTranslator
from backends.prompter import Prompter
from backends.replicas.metrics import ReplicaMetrics
from backends.replicas.replica import Replica
from config.schema import OpenAIModelConfig

log = logging.getLogger("llmso.route")

Failover = Literal["mid_stream", "before_first_byte", "off"]
Outcome = Literal["resumed", "refused", "failed"]

_CONTINUES_MESSAGES = frozenset({"vllm", "generic"})
"""Engines taking ``continue_final_message`` (vLLM's extension; SGLang's too)."""
_MID_STREAM_BY_DEFAULT = frozenset({"vllm", "llamacpp"})
_BROKEN = (UpstreamUnavailable, UpstreamTimeout, UpstreamBadResponse)
"""Errors of a stream that broke (``BackendCrashed`` is a stopping backend: never resumed)."""


class SeamMismatch(UpstreamBadResponse):
    """A continuation whose first text is not the withheld part of the delivered answer
    (the engine computed the seam's tokens otherwise): it is replaced, never relayed."""


def exact_seam(encode: Callable[[str], list[int]], prompt: str, parts: Sequence[str]) -> int:
    """How many of the delivered ``parts`` (one streamed delta each, one token each as a
    llama.cpp stream sends them) a continuation may carry as text after ``prompt``: the
    most whose text tokenises into the prompt's ids followed by each part's own ids, the
    ids the engine generated. Usually all of them; 0 when even the first does not."""
    expected = encode(prompt)
    bounds = [len(expected)]
    for part in parts:
        expected += encode(part)
        bounds.append(len(expected))
    whole = encode(prompt + "".join(parts))
    common = 0
    for have, want in zip(whole, expected, strict=False):
        if have != want:
            break
        common += 1
    # The parts whose ids all lie in the common prefix; a prefix of the text can still
    # tokenise otherwise at its end (a merge with what followed it), so check each.
    count = max((j for j, bound in enumerate(bounds) if bound <= common), default=0)
    while count > 0 and encode(prompt + "".join(parts[:count])) != expected[: bounds[count]]:
        count -= 1
    return count


def failover_mode(config: OpenAIModelConfig) -> Failover:
    """The configured mode, else ``mid_stream`` where the engine can continue an answer."""
    if config.failover is not None:
        return config.failover
    return "mid_stream" if config.engine in _MID_STREAM_BY_DEFAULT else "before_first_byte"


def refusal(
    request: GenerationRequest, engine: str, renders_chat: bool, *, parses_thought: bool = False
) -> str | None:
    """Why ``request`` cannot be continued on ``engine`` (a short label), or None;
    ``parses_thought``: the gateway splits the model's thought itself."""
    sampling = request.sampling
    if sampling.n != 1:
        return "n"
    if sampling.logprobs is not None:
        return "logprobs"
    if request.response_format.type != "text":
        return "response_format"
    if request.kind is RequestKind.COMPLETION:
        return "token_ids" if request.prompt_token_ids else None
    if parses_thought:
        return "reasoning"
    if engine in _CONTINUES_MESSAGES or (engine == "llamacpp" and renders_chat):
        return None
    return "engine"


class Resume:
    """The answer delivered so far to one request's client, and its resumes."""

    __slots__ = (
        "_counts",
        "_default",
        "_parts",
        "carried",
        "exact",
        "finished",
        "points",
        "refused",
        "thought",
        "tokens",
        "tool_call",
        "waited",
        "withheld",
        "withheld_tokens",
    )

    def __init__(self, refused: str | None, default_max_tokens: int | None = None) -> None:
        self._default = default_max_tokens
        """The model's ``default_max_tokens``: the limit when the client set none."""
        self.refused = refused
        """Why this request can never be resumed (``refusal``), or None."""
        self._parts: list[str] = []
        self._counts: list[int] = []
        """Tokens behind each of ``_parts``."""
        self.tokens = 0
        """Completion tokens delivered (counted from the deltas relayed)."""
        self.withheld = ""
        """Delivered text the current continuation must regenerate before new text."""
        self.withheld_tokens = 0
        self.carried = (0, 0)
        """Characters and tokens of the delivered answer the current continuation carries."""
        self.exact = True
        """False once a continuation failed to regenerate its withheld text: later ones
        carry the whole text."""
        self.tool_call = False
        self.thought = False
        """A thought was relayed: never resumed (see the module doc)."""
        self.finished = False
        self.points: list[int] = []
        """Tokens delivered when each resume began."""
        self.waited = 0.0
        """Upstream seconds of the streams that broke."""

    def record(self, events: list[BackendEvent]) -> None:
        """Note the events about to be relayed to the client."""
        for event in events:
            kind = type(event)
            if kind is TextDelta:
                self._parts.append(event.text)  # type: ignore[union-attr]
                self._counts.append(event.num_tokens)  # type: ignore[union-attr]
                self.tokens += event.num_tokens  # type: ignore[union-attr]
            elif kind is ToolCallDelta:
                self.tool_call = True
            elif kind is ReasoningDelta:
                self.thought = True
            elif kind is Finished:
                self.finished = True

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self._parts)

    def carry(self, count: int) -> str:
        """The text of the first ``count`` delivered parts, for the continuation to carry;
        the rest is withheld until the continuation has regenerated it (``replay``)."""
        self.withheld = "".join(self._parts[count:])
        self.withheld_tokens = sum(self._counts[count:])
        text = "".join(self._parts[:count])
        self.carried = (len(text), sum(self._counts[:count]))
        return text

    def replay(self, events: list[BackendEvent]) -> list[BackendEvent]:
        """``events`` of a continuation less the withheld text it regenerates; raises
        ``SeamMismatch`` (and gives up withholding) where they differ."""
        if not self.withheld:
            return events
        kept: list[BackendEvent] = []
        for event in events:
            if self.withheld and type(event) is TextDelta:
                rest = self._regenerated(event.text)  # type: ignore[union-attr]
                if rest is None:
                    continue
                kept.append(replace(event, text=rest))  # type: ignore[type-var]
                continue
            if self.withheld and type(event) in (Finished, ToolCallDelta):
                self._mismatch("")
            kept.append(event)
        return kept

    def _regenerated(self, text: str) -> str | None:
        """Consume ``text`` against the withheld text: None when all of it was withheld,
        else what follows the withheld text (which is then used up)."""
        if self.withheld.startswith(text):
            self.withheld = self.withheld[len(text) :]
            return None
        if not text.startswith(self.withheld):
            self._mismatch(text)
        rest, self.withheld = text[len(self.withheld) :], ""
        return rest

    def _mismatch(self, text: str) -> None:
        withheld, self.withheld, self.exact = self.withheld, "", False
        raise SeamMismatch(
            f"the continuation regenerated {text[:40]!r} where the answer had {withheld[:40]!r}"
        )

    @property
    def resumes(self) -> int:
        return len(self.points)

    def tokens_left(self, request: GenerationRequest) -> int | None:
        """``max_tokens`` of a continuation: the request's effective limit less the tokens
        delivered; None when there is no limit (the upstream's own applies)."""
        limit = effective_max_tokens(request.sampling.max_tokens, self._default, None)
        return None if limit is None else limit - self.tokens

    def complete(self, request: GenerationRequest) -> bool:
        """Whether the answer needs no continuation: finished, or at its length limit."""
        left = self.tokens_left(request)
        return self.finished or (left is not None and left <= 0)

    def closing(self) -> list[BackendEvent]:
        """The events ending an answer that needs no continuation: nothing if it was
        finished, else its length limit was reached."""
        return [] if self.finished else [Finished(0, "length")]

    def usage(self, final: ChunkTranslator, request: GenerationRequest, waited: float) -> Usage:
        """Usage of a resumed answer: the original prompt billed once, every delivered
        token once; each resume's prompt (original prompt plus the text it carried) is the
        gateway's cost. With the upstream's counts, the original prompt is the last
        resume's prompt less the tokens it carried; without, the usual estimate."""
        carried = self.points[-1]
        if final.usage is not None:
            prompt_again, completion = final.usage
            prompt = max(prompt_again - carried, 0)
            completion += carried
        else:
            prompt, completion = estimate_prompt_tokens(request), self.tokens
        cost = sum(prompt + point for point in self.points)
        return Usage(prompt, completion, waited, self.resumes, cost)


class Resumer:
    """How one ``openai`` model continues broken streams (its config, read-only)."""

    def __init__(
        self, config: OpenAIModelConfig, profile: EngineProfile, metrics: ReplicaMetrics
    ) -> None:
        self.mode = failover_mode(config)
        self._engine = config.engine
        self._profile = profile
        self._budget = config.retries
        self._default_max_tokens = config.default_max_tokens
        self._parses_thought = config.reasoning_parser is not None
        renders = self.mode == "mid_stream" and config.engine == "llamacpp"
        self._prompter = Prompter(config.tokenizer if renders else None)
        self._outcomes = {
            outcome: metrics.resumes.labels(config.name, outcome)
            for outcome in ("resumed", "refused", "failed")
        }
        self._cost = metrics.resume_prompt_tokens.labels(config.name)

    async def load(self) -> None:
        """Load the tokenizer whose template renders llama.cpp chat prompts (if any)."""
        await asyncio.to_thread(self._prompter.load)

    def track(self, request: GenerationRequest) -> Resume | None:
        """The state that lets ``request`` resume; None unless failover is mid_stream."""
        if self.mode != "mid_stream" or self._budget == 0:
            return None
        refused = refusal(
            request, self._engine, self._prompter.loaded, parses_thought=self._parses_thought
        )
        return Resume(refused, self._default_max_tokens)

    def check(self, resume: Resume, error: BackendError) -> None:
        """Raise ``error`` unless the stream it broke may resume now."""
        if not isinstance(error, _BROKEN):
            raise error
        if resume.refused is not None or resume.tool_call or resume.thought:
            self.count("refused")
            raise error
        if resume.resumes >= self._budget:
            self.count("failed")
            raise error

    def retries_left(self, resume: Resume) -> int:
        """Retries the walk for the next resume may spend (shared with the resumes)."""
        return max(self._budget - resume.resumes - 1, 0)

    def count(self, outcome: Outcome) -> None:
        self._outcomes[outcome].inc()

    def resumed(
        self,
        request: GenerationRequest,
        resume: Resume,
        broken: Replica,
        replica: Replica,
        error: BackendError,
    ) -> None:
        """Count and log a resume (where the seam is: tokens and characters delivered, and
        the characters of them the continuation carries)."""
        self.count("resumed")
        log.info(
            "resume request=%s model=%s from=%s to=%s tokens=%d chars=%d carried=%d/%d "
            "error=%s", request.request_id, request.model, broken.url, replica.url,
            resume.tokens, len(resume.text), *resume.carried, error.error_type,
        )  # fmt: skip

    def mismatched(self, request: GenerationRequest) -> None:
        log.info(
            "resume request=%s: the continuation differed at the seam; the next one "
            "carries the whole delivered text", request.request_id,
        )  # fmt: skip

    def charge(self, usage: Usage) -> None:
        self._cost.inc(usage.resume_prompt_tokens)

    async def continuation(
        self, request: GenerationRequest, resume: Resume, model: str
    ) -> tuple[str, bytes]:
        """``(path, body)`` asking for the rest of the answer (see the module doc)."""
        profile = self._profile
        if request.kind is RequestKind.CHAT and self._engine in _CONTINUES_MESSAGES:
            answer = ChatMessage("assistant", resume.carry(len(resume.parts)))
            sampling = self._sampling(request, resume)
            rest = replace(request, messages=(*request.messages, answer), sampling=sampling)
            body = engine_body(rest, model, profile)
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
            return CHAT_PATH, orjson.dumps(body)
        if request.kind is RequestKind.COMPLETION:
            prompt = request.prompt
        else:
            prompt = await asyncio.to_thread(self._prompter.render, request)
        carried = await self._carried(request, resume, prompt)
        rest = replace(
            request,
            kind=RequestKind.COMPLETION,
            prompt=prompt + carried,
            messages=(),
            tools=(),
            tool_choice=None,
            parallel_tool_calls=None,
            sampling=self._sampling(request, resume),
        )
        body = engine_body(rest, model, profile)
        return COMPLETIONS_PATH, orjson.dumps(body)

    async def _carried(self, request: GenerationRequest, resume: Resume, prompt: str) -> str:
        """The delivered text a completions continuation carries: all of it, or for a
        greedy request with the tokenizer at hand the part that tokenises back into the
        generated ids (``exact_seam``; the rest is withheld)."""
        parts = resume.parts
        if not (resume.exact and request.sampling.greedy and self._prompter.loaded):
            return resume.carry(len(parts))
        count = await asyncio.to_thread(exact_seam, self._prompter.ids, prompt, parts)
        if count < len(parts):
            log.info(
                "resume request=%s withholds %d of %d delivered parts (they tokenise into "
                "other ids than generated)", request.request_id, len(parts) - count, len(parts),
            )  # fmt: skip
        return resume.carry(count)

    @staticmethod
    def _sampling(request: GenerationRequest, resume: Resume) -> SamplingParams:
        """The request's sampling with ``max_tokens`` less what the client has (the
        withheld tokens are generated again, so they count as not delivered)."""
        left = resume.tokens_left(request)
        if left is None:
            return request.sampling
        return replace(request.sampling, max_tokens=left + resume.withheld_tokens)
