"""``HFBackend``: the event-loop face of the in-process Transformers engine.

Ownership: the event loop owns this object, the per-request sinks and the count of
requests not yet started (the bound behind ``Overloaded``); the engine thread
(``engine.engine``) owns model, tokenizer, runner, scheduler and sequences. Requests
cross into the thread through the engine's bounded inbox; aborts through its abort queue;
events come back in one ``loop.call_soon_threadsafe`` per engine step and are sorted into
each request's own ``asyncio.Queue``.

Lifecycle: ``start()`` loads weights and tokenizer on a thread of its own, builds the
engine's parts there (``assemble``), and starts the engine thread; ``generate()`` may then
be called concurrently; ``stop()`` ends every open stream with ``BackendCrashed`` and
joins the thread. Closing a ``generate()`` iterator early (client gone) aborts its
request at the engine's next step boundary. ``tokenize``/``detokenize`` never reach the
engine: they use a copy of the tokenizer (``tokenize.ModelTokenizer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from backends.base import (
    TEXT_GENERATION,
    AdapterSpec,
    BackendError,
    BackendEvent,
    Feature,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
    NotReady,
    Overloaded,
    RequestKind,
    Started,
    Usage,
)
from backends.hf.adapters.bank import LoraBank
from backends.hf.adapters.pool import AdapterPool
from backends.hf.assemble import EngineParts, assemble
from backends.hf.constrained.grammar import GrammarBook, check_budget, grammar_spec
from backends.hf.engine.engine import Engine, EngineLimits, Submission
from backends.hf.engine.outputs import Item, StepOutputs
from backends.hf.engine.thought import ThoughtMarkup
from backends.hf.engine.waiting import shed_limit
from backends.hf.loading.load_thread import run_in_own_thread
from backends.hf.loading.loader import LoadedModel, load, threads_for
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.tokenize import ModelTokenizer
from backends.hop_metrics import WorkerObserver
from backends.process_wide import exclusive
from backends.tokenizing import DetokenizeRequest, TokenizeRequest, TokenizeResult
from config.schema import HFModelConfig

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0
# Tools (Hermes markup, forced by grammar for required/named), both JSON modes, token ids,
# and /tokenize with the model's own tokenizer.
FEATURES = TEXT_GENERATION | {
    Feature.TOOLS,
    Feature.JSON_OBJECT,
    Feature.JSON_SCHEMA,
    Feature.PROMPT_TOKEN_IDS,
    Feature.TOKENIZE,
}


class _Sink:
    """Where the engine's events for one request land (owned by the event loop)."""

    __slots__ = ("cancelled", "queue")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        # Set (on the loop) when the client leaves; the engine reads it at intake, so a
        # request still in the inbox is never started.
        self.cancelled = False


class HFBackend:
    """See the module docstring."""

    def __init__(
        self,
        config: HFModelConfig,
        observer: WorkerObserver | None = None,
        on_crash: Callable[[str], None] | None = None,
    ) -> None:
        self._config = config
        self._observer = observer
        self._on_crash = on_crash
        self._parts: EngineParts | None = None  # what the last load assembled
        self._loaded: LoadedModel | None = None  # its model, while started
        self._tokens: ModelTokenizer | None = None  # /tokenize's copy, while started
        self._engine: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._not_started = 0
        self._failed: str | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._engine is not None:
            return
        self._loop = asyncio.get_running_loop()
        parts, tokens = await run_in_own_thread(self._load, f"load-{self._config.name}")
        self._parts = parts
        self._tokens = tokens
        self._loaded = loaded = parts.loaded
        limits = EngineLimits(
            max_context=loaded.max_context,
            max_num_seqs=self._config.max_num_seqs,
            max_num_batched_tokens=self._config.max_num_batched_tokens,
            max_batch_size=self._config.max_batch_size,
            batch_window_s=self._config.batch_window_ms / 1000.0,
            default_max_tokens=self._config.default_max_tokens,
        )
        self._engine = Engine(
            tokenizer=loaded.tokenizer,
            eos_ids=loaded.eos_ids,
            limits=limits,
            policy_factory=parts.policy,
            post=self._post,
            on_crash=self._crash_from_thread,
            observer=self._observer,
            max_queue=self._config.max_queue,
            threads=threads_for(self._config),
            device=loaded.device,
            reasoning=parts.reasoning,
        )
        self._failed = None
        self._engine.start()

    def _load(self) -> tuple[EngineParts, ModelTokenizer]:
        """Load weights and tokenizer, then assemble the engine's parts and copy the
        tokenizer for ``tokenize`` (worker thread), all under the process's load lock
        (``backends.process_wide``): assembling constructs tensors and imports libraries
        too."""
        with exclusive(f"load of {self._config.name}"):
            parts = assemble(
                self._config,
                load(self._config),
                observer=self._observer,
                install_bank=self._install_bank,
            )
            loaded = parts.loaded
            return parts, ModelTokenizer(loaded.tokenizer, loaded.max_context)

    def _install_bank(self, bank: LoraBank | None) -> None:
        """Move the runner onto ``bank`` on the engine thread, between steps."""
        engine, parts = self._engine, self._parts
        if engine is not None and parts is not None and isinstance(parts.runner, DecoderRunner):
            engine.between_steps.put(functools.partial(setattr, parts.runner, "lora", bank))

    async def add_adapter(self, adapter: AdapterSpec) -> None:
        pool = self._lora_pool()
        if adapter.source is None:
            raise InvalidRequest(f"adapter {adapter.name!r} needs a source", param="source")
        await pool.add(adapter.name, adapter.source)

    async def remove_adapter(self, name: str) -> None:
        await self._lora_pool().remove(name)

    def _lora_pool(self) -> AdapterPool:
        pool = self._adapters()
        if pool is None:
            raise InvalidRequest(
                f"model {self._config.name!r} serves no LoRA adapters (set enable_lora)",
                param="model",
            )
        return pool

    def _adapters(self) -> AdapterPool | None:
        return None if self._parts is None else self._parts.adapters

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        engine.request_stop()
        await asyncio.to_thread(engine.thread.join, STOP_TIMEOUT_S)
        if engine.thread.is_alive():
            log.error(
                "%s: engine thread did not stop within %ss", self._config.name, STOP_TIMEOUT_S
            )
        self._loaded = None
        self._tokens = None

    @property
    def grammars(self) -> GrammarBook | None:
        """The compiled-grammar cache (None before ``start``); for tools and benchmarks."""
        return None if self._parts is None else self._parts.grammars

    async def ready(self) -> bool:
        return self._engine is not None and self._failed is None and self._engine.thread.is_alive()

    def info(self) -> ModelInfo:
        features = FEATURES | (
            {Feature.CLOSES_BY_BUDGET} if self._config.close_json_by_budget else set()
        )
        if self._config.scheduling != "static":  # scored in the slot runners' prefill
            features |= {Feature.PROMPT_LOGPROBS}
        parts, loaded = self._parts, self._loaded
        if parts is None or loaded is None:
            return ModelInfo(max_context=self._config.max_context, features=features)
        features |= _reasoning_features(parts.reasoning)
        return ModelInfo(
            features=features,
            max_context=loaded.max_context,
            memory_bytes=loaded.memory_bytes,
            extra={
                "dtype": str(loaded.dtype).removeprefix("torch."),
                "device": str(loaded.device),
                "scheduling": self._config.scheduling,
                "runner": parts.runner_path,
            },
        )

    # ------------------------------------------------------------------ requests

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        engine = self._engine
        if engine is None or self._failed is not None:
            raise NotReady(f"model {request.model!r} is not loaded", retry_after=1.0)
        if self._not_started >= shed_limit(self._config.max_queue, request.priority):
            raise Overloaded("too many requests waiting for this model", retry_after=1.0)
        adapter = request.adapter
        pool = self._adapters()
        if adapter is not None:
            if pool is None:
                raise InvalidRequest(
                    f"model {request.model!r} has no adapter {adapter!r}", param="model"
                )
            await pool.acquire(adapter)  # pinned resident until the request ends
        try:
            # Closed before the pin goes: its abort reaches the engine before any bank
            # that reuses the slot.
            async with contextlib.aclosing(self._submit(engine, request)) as events:
                async for item in events:
                    yield item
        finally:
            if adapter is not None and pool is not None:
                pool.release(adapter)

    async def _submit(
        self, engine: Engine, request: GenerationRequest
    ) -> AsyncGenerator[BackendEvent, None]:
        sink = _Sink()
        queued_at = request.arrival_time or time.time()
        grammar = None
        grammars = self.grammars
        if grammars is not None and grammar_spec(request) is not None:
            # Compiling takes milliseconds to seconds: never on the loop or engine thread.
            grammar = await asyncio.to_thread(grammars.compile, request)
            if grammar is not None:
                check_budget(grammar, request, self._closing_tokens(request))
        try:
            engine.inbox.put_nowait(Submission(request, sink, queued_at, grammar))
        except queue.Full:
            raise Overloaded("too many requests waiting for this model", retry_after=1.0) from None
        self._not_started += 1
        waiting = True
        complete = False
        try:
            while True:
                item = await sink.queue.get()
                if waiting and isinstance(item, Started | BackendError):
                    self._not_started -= 1
                    waiting = False
                if isinstance(item, BackendError):
                    complete = True
                    raise item
                if isinstance(item, Usage):
                    complete = True
                    yield item
                    return
                yield item
        finally:
            if waiting:
                self._not_started -= 1
            if not complete:
                sink.cancelled = True
                engine.aborts.put(sink)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        return await self._tokenizer(request.model).tokenize(request)

    async def detokenize(self, request: DetokenizeRequest) -> str:
        return await self._tokenizer(request.model).detokenize(request)

    def _tokenizer(self, model: str) -> ModelTokenizer:
        tokens = self._tokens
        if tokens is None or self._engine is None:
            raise NotReady(f"model {model!r} is not loaded", retry_after=1.0)
        return tokens

    def _closing_tokens(self, request: GenerationRequest) -> int:
        """The tokens a thought's closing takes before a constrained answer: those of the
        model's closing for a chat request that may think, else 0."""
        markup = None if self._parts is None else self._parts.reasoning
        if markup is None or request.kind is not RequestKind.CHAT:
            return 0
        return 0 if request.reasoning.thinking is False else len(markup.closing_ids)

    # ------------------------------------------------------------------ engine thread -> loop

    def _post(self, out: StepOutputs) -> None:
        """Called on the engine thread once per step with all of its events."""
        loop = self._loop
        if loop is None:
            return
        # A closed loop (shutdown) has nobody left to listen.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_dispatch, out)

    def _crash_from_thread(self, reason: str) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._crashed, reason)

    def _crashed(self, reason: str) -> None:
        self._failed = reason
        if self._on_crash is not None:
            self._on_crash(reason)


def _reasoning_features(markup: ThoughtMarkup | None) -> set[Feature]:
    """A reasoning model's thought is split off; the switch and the effort are honoured
    where the chat template reads them, a budget where the closing can be forced."""
    if markup is None:
        return set()
    features = {Feature.REASONING}
    if markup.switch is not None:
        features.add(Feature.THINKING_SWITCH)
    if markup.effort:
        features.add(Feature.REASONING_EFFORT)
    if markup.closing_ids:
        features.add(Feature.THINKING_BUDGET)
    return features


def _dispatch(out: StepOutputs) -> None:
    for sink, item in out:
        sink.queue.put_nowait(item)
