"""``assemble``: build the hf engine's parts for one loaded model, in one place.

What it builds, from the model's config, in this order:

- the grammar book (``constrained.grammar``): compiles each constrained request's grammar;
- the thought markup (``engine.thought.resolve``): the reasoning parser the config names,
  or the one ``auto`` finds in the chat template and tokens (None: all answer);
- ``scheduling: static``: the ``StaticScheduler`` (``engine.static_scheduler``) over
  transformers' own forward; nothing else;
- otherwise the LoRA adapter pool (``adapters.pool``, when ``enable_lora``), whose first
  bank goes into the runner; the runner: the packed ``DecoderRunner``
  (``model.packed_runner``) when ``model.families`` covers the model, else the
  ``ModuleRunner`` (``model.module_runner``: transformers' own modules over the slot
  cache), else the load is refused; the prefix cache over the runner's KV cache
  (``prefix_caching``); the ``ContinuousScheduler`` (``engine.scheduler``) over them;
- the memory the registry counts: the loaded weights, plus the largest LoRA bank
  ``max_loras`` allows and the prefix pool at its full budget (both grow while serving).

Runs on the load's worker thread under the process's load lock (``HFBackend._load``), and
returns a frozen ``EngineParts`` that the backend reads; it sets nothing on the backend.
The scheduler itself is built by the engine thread (``EngineParts.policy``, called once
with the tokenizer's ``TokenTable``), which owns it and the runner from then on.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from backends.base import InvalidRequest
from backends.hf.adapters.bank import LoraBank, bank_bytes
from backends.hf.adapters.pool import AdapterPool
from backends.hf.constrained.grammar import GrammarBook
from backends.hf.engine.detokenizer import TokenTable
from backends.hf.engine.engine import StepPolicy
from backends.hf.engine.scheduler import ContinuousScheduler
from backends.hf.engine.static_scheduler import StaticScheduler
from backends.hf.engine.thought import ThoughtMarkup, resolve
from backends.hf.loading.loader import LoadedModel, ModelLoadError, threads_for
from backends.hf.loading.quantization import quant_plan
from backends.hf.model.families import Unsupported
from backends.hf.model.glue import Glue
from backends.hf.model.glue import load as load_glue
from backends.hf.model.module_runner import ModuleRunner
from backends.hf.model.packed_runner import DecoderRunner, unsupported_reason
from backends.hf.model.prefix_cache import PrefixCache
from backends.hf.model.step_threads import StepThreads
from backends.hop_metrics import WorkerObserver
from config.schema import HFModelConfig

log = logging.getLogger(__name__)

STATIC_PATH = "transformers' generate (static)"


@dataclass(frozen=True, slots=True)
class EngineParts:
    """What ``assemble`` built, for the backend to read; built once per load."""

    loaded: LoadedModel  # ``memory_bytes`` counts the LoRA bank's and prefix pool's budgets
    grammars: GrammarBook
    policy: Callable[[TokenTable], StepPolicy]  # called once, on the engine thread
    runner_path: str  # how each step's forward runs, for ``ModelInfo.extra["runner"]``
    # The continuous modes' runner (None under static). The engine thread owns it once it
    # runs; other threads change it only through ``Engine.between_steps``.
    runner: DecoderRunner | ModuleRunner | None = None
    adapters: AdapterPool | None = None  # LoRA (``enable_lora``); the runner is packed then
    reasoning: ThoughtMarkup | None = None  # the model's thought markup (None: all answer)


def assemble(
    config: HFModelConfig,
    loaded: LoadedModel,
    *,
    observer: WorkerObserver | None,
    install_bank: Callable[[LoraBank | None], None],
) -> EngineParts:
    """The engine's parts for ``loaded`` (see the module docstring). ``install_bank``
    moves the runner onto a new LoRA bank (the pool calls it on the event loop). Raises
    ``ModelLoadError`` for a model the configured runner cannot compute exactly."""
    grammars = GrammarBook(
        loaded.tokenizer,
        vocab_size=int(loaded.model.config.vocab_size),
        stop_ids=loaded.eos_ids,
        close_by_budget=config.close_json_by_budget,
    )
    reasoning = resolve(config.name, config.reasoning_parser, loaded.tokenizer)
    torch.set_num_threads(threads_for(config))
    if config.scheduling == "static":
        static = functools.partial(
            StaticScheduler,
            loaded.model,
            pad_id=loaded.pad_id,
            max_batch_size=config.max_batch_size,
            batch_window_s=config.batch_window_ms / 1000.0,
            observer=observer,
        )
        return EngineParts(loaded, grammars, static, STATIC_PATH, reasoning=reasoning)
    adapters = _adapter_pool(config, loaded, install_bank) if config.lora else None
    runner = _runner(config, loaded, adapters)
    _log_runner(config, runner)
    memory = loaded.memory_bytes
    place: Callable[[str], tuple[int, int]] | None = None
    if isinstance(runner, DecoderRunner) and adapters is not None:
        place = functools.partial(_place, runner)
        # The budget counts the largest bank max_loras allows, not today's.
        memory += bank_bytes(adapters.layers, config.max_loras, config.max_lora_rank, loaded.dtype)
    prefix = None
    if config.prefix_caching:
        prefix = PrefixCache(runner.cache, max_tokens=config.prefix_cache_tokens)
        memory += prefix.max_nbytes  # the pool grows up to its budget while serving
    continuous = functools.partial(
        ContinuousScheduler,
        runner,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        observer=observer,
        one_at_a_time=config.scheduling == "sequential",
        newcomer_steps=config.newcomer_steps,
        prefix_cache=prefix,
        adapter_place=place,
        fixed_prefill=runner.fixed_prefill if isinstance(runner, DecoderRunner) else None,
    )
    loaded = dataclasses.replace(loaded, memory_bytes=memory)
    return EngineParts(loaded, grammars, continuous, runner.path, runner, adapters, reasoning)


def _adapter_pool(
    config: HFModelConfig,
    loaded: LoadedModel,
    install_bank: Callable[[LoraBank | None], None],
) -> AdapterPool:
    param = next(loaded.model.parameters())
    return AdapterPool(
        config.name,
        list(loaded.model.model.layers),
        {adapter.name: adapter.source for adapter in config.adapters},
        max_loras=config.max_loras,
        max_rank=config.max_lora_rank,
        dtype=param.dtype,
        device=param.device,
        install=install_bank,
    )


def _runner(
    config: HFModelConfig, loaded: LoadedModel, adapters: AdapterPool | None
) -> DecoderRunner | ModuleRunner:
    """The packed runner when it covers the model's family, else transformers' own
    modules over the slot cache; a model neither computes exactly is refused."""
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
    if fast is not None and config.batch_invariant and loaded.dtype != torch.float32:
        raise ModelLoadError(
            f"{config.name}: batch_invariant in {loaded.dtype} needs the packed runner, "
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
                functools.partial(
                    DecoderRunner,
                    quantization=plan,
                    lora=_first_bank(adapters),
                    glue=_glue(config, loaded),
                    batch_invariant=config.batch_invariant,
                )
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
                step_threads=StepThreads.for_engine(
                    config.adaptive_threads, threads_for(config), loaded.device
                ),
            )
        except ValueError as exc:
            raise ModelLoadError(f"{config.name}: {exc}") from exc
        except Unsupported as exc:
            raise ModelLoadError(
                f"{config.name}: cannot batch {config.source!r} continuously: {fast}, and "
                f"transformers' own modules over the slot cache are not exact: {exc} "
                "(scheduling: static runs it with transformers' own generate)"
            ) from exc


def _glue(config: HFModelConfig, loaded: LoadedModel) -> Glue | None:
    """The C glue kernels when the config wants them, the model runs in bf16 on CPU, and
    they are built (else None; a missing build is logged with the reason)."""
    if not config.glue_kernels or loaded.device.type != "cpu" or loaded.dtype != torch.bfloat16:
        return None
    found = load_glue()
    if isinstance(found, str):
        log.warning("%s: C glue kernels %s; running the framework ops", config.name, found)
        return None
    return found


def _log_runner(config: HFModelConfig, runner: DecoderRunner | ModuleRunner) -> None:
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
