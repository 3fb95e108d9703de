"""The engine thread: intake, scheduling and stepping for one loaded model.

Ownership: the engine thread owns the model, tokenizer, runner (and its KV cache), the
waiting/prefilling/decoding sets and every ``RequestState``. Other threads talk to it
only through ``inbox`` (bounded, submissions), ``aborts`` (client left) and
``between_steps`` (changes to the runner: a new LoRA bank), and it talks back only
through ``post`` — called once per step with all of that step's events, which
the backend forwards with a single ``loop.call_soon_threadsafe``. Each event carries its
request's own sink, so no token can reach the wrong client.

Modes: ``continuous`` and ``sequential`` share the iteration-level loop in
``ContinuousScheduler`` (``scheduler.py``; sequential admits one request at a time) over
a slot runner: the packed ``DecoderRunner``, or for a model type it does not cover the
``ModuleRunner`` (transformers' own modules over the same slot cache; ``backends.hf.model``).
``static`` runs padded batches to completion with transformers' own forward
(``static_scheduler.py``), only when ``scheduling: static`` is configured; it is also
what the load error suggests for a model neither runner computes exactly.

A reasoning model (``reasoning``, the markup ``assemble`` resolved): each chat request's
choices start their thought where the rendered prompt leaves it (``thought.py``); a
completion is never split.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from backends.base import (
    BackendCrashed,
    BackendError,
    ContextLengthExceeded,
    GenerationRequest,
    InvalidRequest,
    RequestKind,
    effective_max_tokens,
)
from backends.errors import StepFailed
from backends.hf.engine.detokenizer import TokenTable
from backends.hf.engine.outputs import StepOutputs
from backends.hf.engine.sequence import RequestState, make_choices
from backends.hf.engine.thought import ThoughtMarkup
from backends.hop_metrics import WorkerObserver
from backends.tool_markup.prompt import render_chat

log = logging.getLogger(__name__)

# Consecutive failed steps after which the engine is taken for broken (its thread ends
# and the registry restarts the model); fewer cost only the requests of those steps.
MAX_FAILED_STEPS = 3


@dataclass(frozen=True, slots=True)
class Submission:
    request: GenerationRequest
    sink: Any
    queued_at: float
    grammar: Any = None  # compiled off this thread (GrammarBook.compile), None when free


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_context: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_batch_size: int
    batch_window_s: float
    default_max_tokens: int | None = None  # the model's, for a request that sets none


class _Stop:
    """Sentinel put into the inbox to wake the thread for shutdown."""


class StepPolicy(Protocol):
    """What a scheduling mode implements; all calls happen on the engine thread."""

    def add(self, state: RequestState, out: StepOutputs) -> None: ...

    def abort(self, state: RequestState) -> None: ...

    def has_work(self) -> bool: ...

    def wait_hint(self) -> float | None:
        """Seconds the policy would rather wait for more submissions (static batching)."""
        ...

    def step(self, out: StepOutputs) -> None: ...

    def open_requests(self) -> list[RequestState]: ...

    def report_load(self) -> None:
        """Tell the observer the current running/waiting counts and cache usage."""

    def fail_step(self) -> list[RequestState]:
        """After ``step`` raised: drop every request that step was computing (their cache
        slots may hold half-written keys) and return them; the policy is then ready for
        the next step, with requests the step did not touch kept as they were."""
        ...


class Engine:
    """See the module docstring. ``post`` and ``on_crash`` are thread-safe callables
    supplied by the backend; ``observer`` is called from this thread."""

    def __init__(
        self,
        *,
        tokenizer: Any,
        eos_ids: frozenset[int],
        limits: EngineLimits,
        policy_factory: Callable[[TokenTable], StepPolicy],
        post: Callable[[StepOutputs], None],
        on_crash: Callable[[str], None],
        observer: WorkerObserver | None,
        max_queue: int,
        threads: int,
        device: torch.device,
        reasoning: ThoughtMarkup | None = None,
    ) -> None:
        self.inbox: queue.Queue[Submission | _Stop] = queue.Queue(maxsize=max_queue + 1)
        self.aborts: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Changes to the runner (a new LoRA bank) made by other threads, applied here
        # between steps in the order posted: before any submission posted after them.
        self.between_steps: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._tok = tokenizer
        self._eos = eos_ids
        self._limits = limits
        self._policy_factory = policy_factory
        self._post = post
        self._on_crash = on_crash
        self._observer = observer
        self._threads = threads
        self._device = device
        self._reasoning = reasoning
        self._stopping = threading.Event()
        self._by_sink: dict[int, RequestState] = {}
        self._failed_steps = 0  # consecutive
        self.thread = threading.Thread(target=self._run, name="llmso-hf-engine", daemon=True)

    # ------------------------------------------------------------------ any thread

    def start(self) -> None:
        self.thread.start()

    def request_stop(self) -> None:
        self._stopping.set()
        # A full inbox means a busy thread, which sees the flag at its next step.
        with contextlib.suppress(queue.Full):
            self.inbox.put_nowait(_Stop())

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        torch.set_num_threads(self._threads)
        policy: StepPolicy | None = None
        try:
            with torch.inference_mode():
                policy = self._policy_factory(TokenTable(self._tok))
                self._loop(policy)
        except BaseException as exc:  # the thread must report any death, then end
            log.exception("hf engine thread crashed")
            reason = f"engine thread crashed: {type(exc).__name__}: {exc}"
            self._fail_all(policy, BackendCrashed(reason))
            self._on_crash(reason)
            return
        self._fail_all(policy, BackendCrashed("backend stopped"))

    def _loop(self, policy: StepPolicy) -> None:
        while not self._stopping.is_set():
            out: StepOutputs = []
            self._intake(policy, out, block=not policy.has_work())
            self._apply_aborts(policy)
            self._apply_between_steps()
            if policy.has_work() and not self._stopping.is_set():
                self._step(policy, out)
                self._forget_finished(policy)
            if out:
                self._post(out)

    def _step(self, policy: StepPolicy, out: StepOutputs) -> None:
        """One step; an exception costs the requests of that step, not the engine,
        unless steps keep failing (then it propagates and the thread ends)."""
        try:
            policy.step(out)
        except Exception as exc:
            self._failed_steps += 1
            if self._failed_steps >= MAX_FAILED_STEPS:
                raise
            log.exception("hf engine step failed; failing the requests of that step")
            if self._observer is not None:
                self._observer.on_step_error()
            error = StepFailed(f"the engine step failed: {type(exc).__name__}: {exc}")
            for state in policy.fail_step():
                state.aborted = True
                self._by_sink.pop(id(state.sink), None)
                out.append((state.sink, error))
            policy.report_load()
            return
        self._failed_steps = 0

    def _intake(self, policy: StepPolicy, out: StepOutputs, *, block: bool) -> None:
        timeout: float | None = 0.5 if block else policy.wait_hint()
        while True:
            try:
                item = self.inbox.get(timeout=timeout) if timeout else self.inbox.get_nowait()
            except queue.Empty:
                return
            timeout = None
            if isinstance(item, _Stop):
                return
            if getattr(item.sink, "cancelled", False):
                # The client left before the engine took the request in: skip it.
                if self._observer is not None:
                    self._observer.on_abort()
                continue
            state = self._admit(item, out)
            if state is not None:
                self._by_sink[id(item.sink)] = state
                policy.add(state, out)
            timeout = policy.wait_hint()

    def _admit(self, sub: Submission, out: StepOutputs) -> RequestState | None:
        try:
            prompt_ids, rendered = self._tokenize(sub.request)
            max_tokens = self._max_tokens(sub.request, len(prompt_ids))
            if sub.request.sampling.n > self._limits.max_num_seqs:
                raise InvalidRequest(
                    f"n may be at most {self._limits.max_num_seqs} for this model", param="n"
                )
        except BackendError as exc:
            out.append((sub.sink, exc))
            return None
        except Exception as exc:  # a template or tokenizer rejecting this input
            log.info("cannot tokenize request %s: %s", sub.request.request_id, exc)
            out.append((sub.sink, InvalidRequest(f"cannot tokenize the request: {exc}")))
            return None
        state = RequestState(
            request=sub.request,
            sink=sub.sink,
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            queued_at=sub.queued_at,
            eos_ids=self._eos,
            grammar=sub.grammar,
            in_thought=self._in_thought(sub.request, rendered),
        )
        make_choices(state, self._tok, self._device, self._reasoning)
        return state

    def _in_thought(self, request: GenerationRequest, rendered: str | None) -> bool | None:
        """Where a chat request's output starts, for a reasoning model (None: no split;
        a completion's text is raw, as vLLM's is)."""
        if self._reasoning is None or rendered is None:
            return None
        return self._reasoning.format.starts_in_thought(rendered, request.reasoning.thinking)

    def _tokenize(self, request: GenerationRequest) -> tuple[list[int], str | None]:
        """The prompt's token ids, and its text where a chat template rendered it."""
        rendered = None
        if request.kind is RequestKind.CHAT:
            rendered = render_chat(self._tok, request)
            ids = list(self._tok(rendered, add_special_tokens=False)["input_ids"])
        elif request.prompt_token_ids:
            ids = list(request.prompt_token_ids)
            vocab = len(self._tok)
            if not all(0 <= token < vocab for token in ids):
                raise InvalidRequest(
                    f"prompt holds a token id outside 0..{vocab - 1}", param="prompt"
                )
        else:
            ids = list(self._tok(request.prompt)["input_ids"])
        if not ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        return ids, rendered

    def _max_tokens(self, request: GenerationRequest, prompt_tokens: int) -> int:
        limit = self._limits.max_context
        requested = request.sampling.max_tokens
        if prompt_tokens >= limit or (requested is not None and prompt_tokens + requested > limit):
            shown = "not set" if requested is None else str(requested)
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens; the prompt has "
                f"{prompt_tokens} tokens and max_tokens is {shown}.",
                param="messages" if requested is None else "max_tokens",
            )
        room = limit - prompt_tokens
        tokens = effective_max_tokens(requested, self._limits.default_max_tokens, room)
        return room if tokens is None else tokens  # 0: the prompt scored, nothing generated

    def _apply_aborts(self, policy: StepPolicy) -> None:
        aborted = False
        while True:
            try:
                sink = self.aborts.get_nowait()
            except queue.Empty:
                break
            state = self._by_sink.pop(id(sink), None)
            if state is None or state.done or state.aborted:
                continue
            state.aborted = True
            aborted = True
            policy.abort(state)
            if self._observer is not None:
                self._observer.on_abort()
        if aborted:  # the engine may go idle now: no step would report the drop
            policy.report_load()

    def _apply_between_steps(self) -> None:
        while True:
            try:
                change = self.between_steps.get_nowait()
            except queue.Empty:
                return
            change()

    def _forget_finished(self, policy: StepPolicy) -> None:
        if len(self._by_sink) > len(policy.open_requests()):
            open_ids = {id(s.sink) for s in policy.open_requests()}
            for key in [k for k in self._by_sink if k not in open_ids]:
                del self._by_sink[key]

    def _fail_all(self, policy: StepPolicy | None, error: BackendError) -> None:
        out: StepOutputs = [(s.sink, error) for s in self._by_sink.values() if not s.done]
        while True:  # submissions never taken in
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Submission):
                out.append((item.sink, error))
        self._by_sink.clear()
        if out:
            self._post(out)
