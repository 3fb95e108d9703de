"""A small deterministic ``Backend`` for tests, usable in-process or in a worker process.

``FakeBackend(config, observer=None, on_crash=None)`` echoes the words of the prompt
(or of the last chat message) back as tokens, one ``TextDelta`` per word, ``delay``
seconds apart, for each of ``sampling.n`` choices; ``max_tokens`` cuts it short with
finish reason ``length``; a stop string cuts the text before it (finish reason ``stop``).
It reports every step, load change and abort to ``observer``.

A model configured with a ``reasoning_parser`` (a name; ``auto`` counts as none) runs the
echo of a chat request through that parser, so a prompt written in the model's markup
(``<think> a b </think> c`` for ``qwen3``) comes back as thought and answer, and declares
``Feature.REASONING`` and ``Feature.THINKING_SWITCH``: with thinking switched off the
thought is dropped (as a template switch would keep the model from thinking). It
declares neither an effort nor a budget, so those are refused by capability.

Knobs, as keyword arguments or (so a worker process can be configured) environment
variables read once in the constructor:

- ``delay`` / ``LLMSO_FAKE_DELAY``: seconds between tokens (default 0);
- ``load_delay`` / ``LLMSO_FAKE_LOAD_DELAY``: seconds ``start()`` takes (default 0);
- ``load_error`` / ``LLMSO_FAKE_LOAD_ERROR``: ``start()`` raises ``RuntimeError`` with it;
- ``stop_delay`` / ``LLMSO_FAKE_STOP_DELAY``: seconds ``stop()`` takes (default 0);
- ``yield_each`` / ``LLMSO_FAKE_YIELD_EACH=1``: with no delay, still give the event loop
  a turn after every token (so a relay sees one token at a time, like a real engine);
- ``max_running`` / ``LLMSO_FAKE_MAX_RUNNING``: more requests at once are refused with
  ``Overloaded`` before ``Started`` (default: no limit).

Directives in the prompt make a request misbehave on purpose:

- ``!error <ErrorClass> <param|-> <message...>``: raise that ``backends.base`` error
  (``Overloaded``/``NotReady`` get ``retry_after=7.5``) at admission, before ``Started``;
- ``!error-after <n> <ErrorClass> <param|-> <message...>``: the same after ``n`` deltas;
- ``!bug``: raise a ``ZeroDivisionError`` (a programming error, not a ``BackendError``);
- ``!crash``: call ``on_crash`` as if the engine thread died, then stall.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from backends import base
from backends.base import (
    BackendEvent,
    Finished,
    GenerationRequest,
    ModelInfo,
    NotReady,
    ReasoningDelta,
    RequestKind,
    Started,
    TextDelta,
    Usage,
)
from backends.hop_metrics import WorkerObserver
from backends.reasoning import FORMATS, Phase, ReasoningFormat, Split


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


class FakeBackend:
    """See the module docstring. State is owned by the event loop that runs it."""

    def __init__(
        self,
        config: Any,
        observer: WorkerObserver | None = None,
        on_crash: Callable[[str], None] | None = None,
        *,
        delay: float | None = None,
        load_delay: float | None = None,
        load_error: str | None = None,
        stop_delay: float | None = None,
        yield_each: bool | None = None,
        max_running: int | None = None,
    ) -> None:
        self.config = config
        self.observer = observer
        self.on_crash = on_crash
        self.delay = _env_float("LLMSO_FAKE_DELAY", 0.0) if delay is None else delay
        self.load_delay = (
            _env_float("LLMSO_FAKE_LOAD_DELAY", 0.0) if load_delay is None else load_delay
        )
        self.load_error = load_error or os.environ.get("LLMSO_FAKE_LOAD_ERROR") or None
        self.stop_delay = (
            _env_float("LLMSO_FAKE_STOP_DELAY", 0.0) if stop_delay is None else stop_delay
        )
        self.yield_each = (
            os.environ.get("LLMSO_FAKE_YIELD_EACH") == "1" if yield_each is None else yield_each
        )
        self.max_running = (
            int(_env_float("LLMSO_FAKE_MAX_RUNNING", 0)) or None
            if max_running is None
            else max_running
        )
        self.started = False
        self.running = 0
        self.aborted = 0

    async def start(self) -> None:
        if self.load_delay:
            await asyncio.sleep(self.load_delay)
        if self.load_error:
            raise RuntimeError(self.load_error)
        self.started = True

    async def stop(self) -> None:
        if self.stop_delay:
            await asyncio.sleep(self.stop_delay)
        self.started = False

    async def ready(self) -> bool:
        return self.started

    @property
    def reasoning(self) -> ReasoningFormat | None:
        return FORMATS.get(getattr(self.config, "reasoning_parser", None) or "")

    def info(self) -> ModelInfo:
        features = base.TEXT_GENERATION
        if self.reasoning is not None:
            features |= {base.Feature.REASONING, base.Feature.THINKING_SWITCH}
        return ModelInfo(
            max_context=getattr(self.config, "max_context", None) or 2048,
            extra={"engine": "fake", "worker_pid": str(os.getpid())},
            features=features,
        )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        if not self.started:
            raise NotReady("fake backend is not started")
        text = request.prompt if request.kind is RequestKind.COMPLETION else ""
        if request.messages:
            text = request.messages[-1].content
        words = text.split()
        fail_after = self._check_directives(words)
        if fail_after is not None and fail_after[0] < 0:
            raise fail_after[1]
        if self.max_running is not None and self.running >= self.max_running:
            raise base.Overloaded(f"fake backend runs {self.running} requests already")
        pieces = _cut_at_stop(words, request.sampling.stop)
        queued = time.time()
        self.running += 1
        self._report_load()
        completed = False
        try:
            yield Started(queued_at=queued, started_at=time.time())
            total = thought = 0
            for index in range(request.sampling.n):
                budget = len(pieces[: request.sampling.max_tokens])
                split = _Splitter(self.reasoning, request)
                for piece in pieces[:budget]:
                    if fail_after is not None and total >= fail_after[0]:
                        raise fail_after[1]
                    if self.delay or self.yield_each:
                        await asyncio.sleep(self.delay)
                    if not self.started:
                        raise base.BackendCrashed("fake backend was stopped")
                    total += 1
                    if self.observer is not None:
                        self.observer.on_step(1, 1, self.delay)
                    for event in split.feed(index, piece):
                        yield event
                for event in split.finish(index):
                    yield event
                thought += split.tokens
                yield Finished(index=index, reason="length" if budget < len(pieces) else "stop")
            yield Usage(prompt_tokens=len(words), completion_tokens=total, reasoning_tokens=thought)
            completed = True
        finally:
            self.running -= 1
            if not completed:
                self.aborted += 1
                if self.observer is not None:
                    self.observer.on_abort()
            self._report_load()

    def _report_load(self) -> None:
        if self.observer is not None:
            self.observer.on_load(self.running, 0, self.running / 100)

    def _check_directives(self, words: list[str]) -> tuple[int, base.BackendError] | None:
        """The error a directive asks for and after how many deltas (-1: at admission)."""
        if not words or not words[0].startswith("!"):
            return None
        head = words[0]
        if head == "!bug":
            raise ZeroDivisionError("fake bug")
        if head == "!crash":
            if self.on_crash is not None:
                self.on_crash("fake engine thread died")
            return (0, base.BackendCrashed("fake engine thread died"))
        if head == "!error":
            return (-1, _build_error(words[1:]))
        if head == "!error-after":
            return (int(words[1]), _build_error(words[2:]))
        return None


class _Splitter:
    """One choice's echo, through the model's reasoning parser when it has one."""

    def __init__(self, fmt: ReasoningFormat | None, request: GenerationRequest) -> None:
        self._parser = None
        self._shown = request.reasoning.thinking is not False
        self.tokens = 0
        """Pieces that were thought (shown)."""
        if fmt is not None and request.kind is RequestKind.CHAT:
            in_thought = fmt.starts_in_thought(None, request.reasoning.thinking)
            self._parser = fmt.parser(in_thought=in_thought)

    def feed(self, index: int, piece: str) -> list[BackendEvent]:
        if self._parser is None:
            return [TextDelta(index=index, text=piece)]
        events = self._events(index, self._parser.feed(piece), 1)
        held = not events and self._parser.phase is Phase.THINKING
        if self._shown and (held or (events and isinstance(events[0], ReasoningDelta))):
            self.tokens += 1
        return events

    def finish(self, index: int) -> list[BackendEvent]:
        return [] if self._parser is None else self._events(index, self._parser.finish(), 0)

    def _events(self, index: int, split: Split, tokens: int) -> list[BackendEvent]:
        events: list[BackendEvent] = []
        if split.reasoning and self._shown:
            events.append(ReasoningDelta(index, split.reasoning, tokens))
            tokens = 0
        if split.content:
            events.append(TextDelta(index=index, text=split.content, num_tokens=tokens))
        return events


def _cut_at_stop(words: list[str], stops: tuple[str, ...]) -> list[str]:
    """The text pieces (one per word, with its leading space) before the first stop."""
    pieces = [word if i == 0 else " " + word for i, word in enumerate(words)]
    text = "".join(pieces)
    found = [text.index(stop) for stop in stops if stop in text]
    if not found:
        return pieces
    end, kept, out = min(found), 0, []
    for piece in pieces:
        if kept + len(piece) > end:
            if end > kept:
                out.append(piece[: end - kept])
            break
        out.append(piece)
        kept += len(piece)
    return out


def _build_error(words: list[str]) -> base.BackendError:
    name, param, *message = words
    cls: Any = getattr(base, name)
    text = " ".join(message)
    if issubclass(cls, base.Overloaded | base.NotReady):
        error: base.BackendError = cls(text, retry_after=7.5)
        return error
    if issubclass(cls, base.UpstreamRejected):
        error = cls(text, status=422, param=None if param == "-" else param, code="bad")
        return error
    error = cls(text, param=None if param == "-" else param)
    return error
