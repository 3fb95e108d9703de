"""``HFBackend``: the event-loop face of the in-process Transformers engine.

Ownership: the event loop owns this object, the per-request sinks and the count of
requests not yet started (the bound behind ``Overloaded``); the engine thread
(``engine.py``) owns model, tokenizer, scheduler and sequences. Requests cross into the
thread through the engine's bounded inbox; aborts through its abort queue; events come
back in one ``loop.call_soon_threadsafe`` per engine step and are sorted into each
request's own ``asyncio.Queue``.

Lifecycle: ``start()`` loads weights and tokenizer in a worker thread and starts the
engine thread; ``generate()`` may then be called concurrently; ``stop()`` ends every open
stream with ``BackendCrashed`` and joins the thread. Closing a ``generate()`` iterator
early (client gone) aborts its request at the engine's next step boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import queue
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING

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
    Started,
    Usage,
)
from backends.hf.adapters import AdapterPool
from backends.hf.detokenizer import TokenTable
from backends.hf.engine import Engine, EngineLimits, StepPolicy, Submission
from backends.hf.families import Unsupported
from backends.hf.grammar import GrammarBook, check_budget, grammar_spec
from backends.hf.loader import LoadedModel, ModelLoadError, load, threads_for
from backends.hf.lora import LoraBank, bank_bytes
from backends.hf.model_source import gguf_behind
from backends.hf.module_runner import ModuleRunner
from backends.hf.outputs import Item, StepOutputs
from backends.hf.own_thread import run_in_own_thread
from backends.hf.prefix_cache import PrefixCache
from backends.hf.quantization import QuantPlan, from_gguf, uniform
from backends.hf.runner import DecoderRunner, unsupported_reason
from backends.hf.scheduler import ContinuousScheduler
from backends.hf.static import StaticScheduler
from backends.hf.threads import StepThreads
from backends.hf.waiting import shed_limit
from backends.hop_metrics import WorkerObserver
from backends.process_wide import exclusive
from config.schema import HFModelConfig

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0
# Tools (Hermes markup, forced by grammar for required/named), both JSON modes, token ids.
FEATURES = TEXT_GENERATION | {
    Feature.TOOLS,
    Feature.JSON_OBJECT,
    Feature.JSON_SCHEMA,
    Feature.PROMPT_TOKEN_IDS,
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
        self._pool: AdapterPool | None = None  # LoRA adapters (set at load when enabled)
        self._decoder: DecoderRunner | None = None  # the packed runner, whose bank swaps
        self._observer = observer
        self._on_crash = on_crash
        self._loaded: LoadedModel | None = None
        self._grammars: GrammarBook | None = None
        self._engine: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._not_started = 0
        self._failed: str | None = None
        self.scheduling = config.scheduling
        self.runner_path = "transformers' generate (static)"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._engine is not None:
            return
        self._loop = asyncio.get_running_loop()
        loaded, grammars, policy_factory = await run_in_own_thread(
            self._load, f"load-{self._config.name}"
        )
        self._loaded = loaded
        self._grammars = grammars
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
            policy_factory=policy_factory,
            post=self._post,
            on_crash=self._crash_from_thread,
            observer=self._observer,
            max_queue=self._config.max_queue,
            threads=threads_for(self._config),
            device=loaded.device,
        )
        self._failed = None
        self._engine.start()

    def _load(self) -> tuple[LoadedModel, GrammarBook, Callable[[TokenTable], StepPolicy]]:
        """Load weights, the grammar compiler and, for the continuous modes, the runner
        (worker thread), all under the process's load lock (``backends.process_wide``):
        the runner and the grammar book construct tensors and import libraries too."""
        with exclusive(f"load of {self._config.name}"):
            loaded = load(self._config)
            grammars = GrammarBook(
                loaded.tokenizer,
                vocab_size=int(loaded.model.config.vocab_size),
                stop_ids=loaded.eos_ids,
                close_by_budget=self._config.close_json_by_budget,
            )
            loaded, policy_factory = self._policy_factory(loaded)
            return loaded, grammars, policy_factory

    def _policy_factory(
        self, loaded: LoadedModel
    ) -> tuple[LoadedModel, Callable[[TokenTable], StepPolicy]]:
        """The scheduling policy's constructor (called on the engine thread), and the
        loaded model with its memory grown by the prefix cache's budget."""
        import torch

        torch.set_num_threads(threads_for(self._config))
        config = self._config
        mode = config.scheduling
        self.scheduling = mode
        if mode == "static":
            batch = config.max_batch_size

            def static_policy(table: TokenTable) -> StepPolicy:
                return StaticScheduler(
                    loaded.model,
                    table,
                    pad_id=loaded.pad_id,
                    max_batch_size=batch,
                    batch_window_s=config.batch_window_ms / 1000.0,
                    observer=self._observer,
                )

            return loaded, static_policy
        if config.lora:
            self._pool = self._adapter_pool(loaded)
        runner = _runner(config, loaded, self._pool)
        self.runner_path = runner.path
        log.info(
            "%s: %s; decode attention via %s (long spans: %s); timed at load, ms per 3 calls: %s",
            config.name,
            runner.path,
            runner.attention.decode_impl,
            runner.attention.decode_impl_long,
            {
                shape: {impl: round(t * 1e3, 3) for impl, t in runs.items()}
                for shape, runs in runner.attention.decode_timings.items()
            },
        )
        place: Callable[[str], tuple[int, int]] | None = None
        if isinstance(runner, DecoderRunner) and self._pool is not None:
            self._decoder = runner
            place = functools.partial(_place, runner)
            # The budget counts the largest bank max_loras allows, not today's.
            lora_bytes = bank_bytes(
                self._pool.layers, config.max_loras, config.max_lora_rank, loaded.dtype
            )
            loaded = dataclasses.replace(loaded, memory_bytes=loaded.memory_bytes + lora_bytes)
        prefix = None
        if config.prefix_caching:
            prefix = PrefixCache(runner.cache, max_tokens=config.prefix_cache_tokens)
            # The pool grows up to its budget while serving: the registry's budget counts it.
            loaded = dataclasses.replace(
                loaded, memory_bytes=loaded.memory_bytes + prefix.max_nbytes
            )

        def continuous_policy(table: TokenTable) -> StepPolicy:
            return ContinuousScheduler(
                runner,
                table,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                observer=self._observer,
                one_at_a_time=mode == "sequential",
                prefix_cache=prefix,
                adapter_place=place,
            )

        return loaded, continuous_policy

    def _adapter_pool(self, loaded: LoadedModel) -> AdapterPool:
        config = self._config
        param = next(loaded.model.parameters())
        return AdapterPool(
            config.name,
            list(loaded.model.model.layers),
            {adapter.name: adapter.source for adapter in config.adapters},
            max_loras=config.max_loras,
            max_rank=config.max_lora_rank,
            dtype=param.dtype,
            device=param.device,
            install=self._install_bank,
        )

    def _install_bank(self, bank: LoraBank | None) -> None:
        """Move the runner onto ``bank`` on the engine thread, between steps."""
        engine, runner = self._engine, self._decoder
        if engine is not None and runner is not None:
            engine.between_steps.put(functools.partial(setattr, runner, "lora", bank))

    async def add_adapter(self, adapter: AdapterSpec) -> None:
        pool = self._lora_pool()
        if adapter.source is None:
            raise InvalidRequest(f"adapter {adapter.name!r} needs a source", param="source")
        await pool.add(adapter.name, adapter.source)

    async def remove_adapter(self, name: str) -> None:
        await self._lora_pool().remove(name)

    def _lora_pool(self) -> AdapterPool:
        if self._pool is None or self._decoder is None:
            raise InvalidRequest(
                f"model {self._config.name!r} serves no LoRA adapters (set enable_lora)",
                param="model",
            )
        return self._pool

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

    @property
    def grammars(self) -> GrammarBook | None:
        """The compiled-grammar cache (None before ``start``); for tools and benchmarks."""
        return self._grammars

    async def ready(self) -> bool:
        return self._engine is not None and self._failed is None and self._engine.thread.is_alive()

    def info(self) -> ModelInfo:
        features = FEATURES | (
            {Feature.CLOSES_BY_BUDGET} if self._config.close_json_by_budget else set()
        )
        if self._config.scheduling != "static":  # scored in the slot runners' prefill
            features |= {Feature.PROMPT_LOGPROBS}
        loaded = self._loaded
        if loaded is None:
            return ModelInfo(max_context=self._config.max_context, features=features)
        return ModelInfo(
            features=features,
            max_context=loaded.max_context,
            memory_bytes=loaded.memory_bytes,
            extra={
                "dtype": str(loaded.dtype).removeprefix("torch."),
                "device": str(loaded.device),
                "scheduling": self.scheduling,
                "runner": self.runner_path,
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
        if adapter is not None:
            if self._pool is None:
                raise InvalidRequest(
                    f"model {request.model!r} has no adapter {adapter!r}", param="model"
                )
            await self._pool.acquire(adapter)  # pinned resident until the request ends
        try:
            # Closed before the pin goes: its abort reaches the engine before any bank
            # that reuses the slot.
            async with contextlib.aclosing(self._submit(engine, request)) as events:
                async for item in events:
                    yield item
        finally:
            if adapter is not None and self._pool is not None:
                self._pool.release(adapter)

    async def _submit(
        self, engine: Engine, request: GenerationRequest
    ) -> AsyncGenerator[BackendEvent, None]:
        sink = _Sink()
        queued_at = request.arrival_time or time.time()
        grammar = None
        if self._grammars is not None and grammar_spec(request) is not None:
            # Compiling takes milliseconds to seconds: never on the loop or engine thread.
            grammar = await asyncio.to_thread(self._grammars.compile, request)
            if grammar is not None:
                check_budget(grammar, request)
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


def _dispatch(out: StepOutputs) -> None:
    for sink, item in out:
        sink.queue.put_nowait(item)


def _runner(
    config: HFModelConfig, loaded: LoadedModel, adapters: AdapterPool | None
) -> DecoderRunner | ModuleRunner:
    """The packed runner when it covers the model's family, else transformers' own
    modules over the slot cache; a model neither computes exactly is refused."""
    import torch

    fast = unsupported_reason(loaded.model)
    plan = quant_plan(config)
    if fast is not None and adapters is not None:
        raise ModelLoadError(
            f"{config.name}: adapters need the packed runner, which does not cover this "
            f"model: {fast}"
        )
    if fast is not None and plan.quantized:
        raise ModelLoadError(
            f"{config.name}: quantization {config.quantization!r} needs the packed runner, "
            f"which does not cover this model: {fast}"
        )
    if plan.quantized and loaded.device.type != "cpu":
        raise ModelLoadError(
            f"{config.name}: quantization {config.quantization!r} runs on CPU only "
            f"(device {loaded.device})"
        )
    with torch.inference_mode():
        try:
            make: Callable[..., DecoderRunner | ModuleRunner] = (
                functools.partial(DecoderRunner, quantization=plan, lora=_first_bank(adapters))
                if fast is None
                else ModuleRunner
            )
            return make(
                loaded.model,
                # One spare slot: moving a half-prefilled request out of the way when
                # another request's choices take their places never runs out of room.
                max_slots=config.max_num_seqs + 1,
                max_context=loaded.max_context,
                compile_attention=config.compile_attention,
                step_threads=_step_threads(config, loaded.device),
            )
        except Unsupported as exc:
            raise ModelLoadError(
                f"{config.name}: cannot batch {config.source!r} continuously: {fast}, and "
                f"transformers' own modules over the slot cache are not exact: {exc} "
                "(scheduling: static runs it with transformers' own generate)"
            ) from exc


def _first_bank(adapters: AdapterPool | None) -> LoraBank | None:
    """The bank the runner starts with: the configured adapters (None: none)."""
    if adapters is None:
        return None
    try:
        return adapters.preload()
    except InvalidRequest as exc:
        raise ModelLoadError(str(exc)) from exc


def _place(runner: DecoderRunner, adapter: str) -> tuple[int, int]:
    """A pinned adapter's slot and load key in the runner's bank (engine thread)."""
    bank = runner.lora
    if bank is None:  # a pinned adapter is resident: unreachable
        raise KeyError(adapter)
    return bank.place(adapter)


def quant_plan(config: HFModelConfig) -> QuantPlan:
    """The model's ``quantization:`` as a plan (reads a GGUF's header for ``gguf``)."""
    if config.quantization == "gguf":
        gguf = gguf_behind(config.source)
        if gguf is None:
            raise ModelLoadError(
                f"{config.name}: quantization 'gguf' needs a GGUF source, not {config.source!r}"
            )
        return from_gguf(gguf)
    return uniform(config.quantization, config.quantization_group_size)


def _step_threads(config: HFModelConfig, device: torch.device) -> StepThreads | None:
    return StepThreads.for_engine(config.adaptive_threads, threads_for(config), device)
