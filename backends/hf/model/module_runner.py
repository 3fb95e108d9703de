"""The generic path: transformers' own modules over the slot KV cache.

For a decoder that ``families.py`` has no packed runner for (GPT-NeoX, StableLM, OLMo,
...), the model's own forward runs each step, on the same packed batch the fast runner
gets (decode rows of the running sequences, then prefill chunks, one row of tokens with
their true position ids), so requests join and leave a running batch exactly as on the
fast path. The seam is transformers' attention interface: the model is switched to an
attention function registered here, which writes each layer's new keys and values into
the slot cache and attends over it (``slot_attention.py``). With a custom attention
function transformers builds no mask, so nothing sees the packing but our attention.

A model is taken only when that is exact, checked at load:

- its config: no RoPE whose frequencies follow the sequence length;
- a probe forward: every layer calls the interface once, with one head layout, and
  with no argument this function does not implement (a ``softcap`` and a
  ``sliding_window`` are implemented);
- a self-check: logits of a packed schedule (two sequences at different positions,
  prefilled together, then decoded together beside a third's prefill) match the
  model's own forward on each sequence alone. A model that positions tokens from an
  attention mask, keeps recurrent state, or mixes tokens outside attention fails here.

Otherwise ``Unsupported`` says why, and the backend refuses the model at load.

Owner: the engine thread; the step being run is thread-local (a process may run
several models, each on its own engine thread).
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from backends.hf.model.families import Unsupported, length_dependent_rope
from backends.hf.model.slot_attention import PrefillChunk, SlotAttention, SlotStep
from backends.hf.model.step_threads import StepThreads

IMPLEMENTATION = "llmso_slots"
# Keyword arguments a model may pass to its attention function that do not change what
# eval-mode causal attention computes (dropout is 0 in eval; the rest is bookkeeping).
_INERT = frozenset(
    {
        "dropout",
        "position_ids",
        "cache_position",
        "output_attentions",
        "use_cache",
        "past_key_values",
        "layer_past",
        "head_mask",
        "is_causal",
        "position_embeddings",
    }
)
_PROBE_TOKENS = 8


@dataclass(slots=True)
class _Layout:
    """What the probe forward saw, per layer."""

    heads: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    windows: dict[int, int | None] = field(default_factory=dict)
    softcaps: set[float | None] = field(default_factory=set)
    calls: int = 0
    foreign: set[str] = field(default_factory=set)


class _Context(threading.local):
    """The step the current thread's forward runs (or the probe's record)."""

    runner: ModuleRunner | None = None
    step: SlotStep | None = None
    layout: _Layout | None = None


_ACTIVE = _Context()


def _slot_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [1, heads, n, hd]``, keys and
    values ``[1, kv_heads, n, hd]`` for the step's new tokens; returns ``[1, n, heads, hd]``."""
    layer = int(module.layer_idx)
    _, heads, n, hd = query.shape
    layout = _ACTIVE.layout
    if layout is not None:  # the probe: record, compute nothing
        layout.calls += 1
        layout.heads[layer] = (heads, int(key.shape[1]), hd)
        layout.windows[layer] = int(sliding_window) if sliding_window else None
        layout.softcaps.add(float(softcap) if softcap else None)
        layout.foreign |= {
            name
            for name, value_ in kwargs.items()
            if name not in _INERT and value_ is not None and value_ is not False
        }
        if kwargs.get("is_causal") is False:
            layout.foreign.add("is_causal=False")
        return query.new_zeros(1, n, heads, hd), None
    runner, step = _ACTIVE.runner, _ACTIVE.step
    assert runner is not None and step is not None, "slot attention outside a runner step"
    attention = runner.attention
    scale = scaling if scaling is not None else hd**-0.5
    window = int(sliding_window) if sliding_window else None
    out = attention.layer(
        layer,
        (query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)),
        step,
        window=window,
        scale=scale,
    )
    return out.view(1, n, heads, hd), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, _slot_attention)


class ModuleRunner:
    """The model's own forward over slot-cached sequences (see the module docstring);
    ``forward`` has ``DecoderRunner``'s contract."""

    def __init__(
        self,
        model: Any,
        *,
        max_slots: int,
        max_context: int,
        compile_attention: bool = False,
        step_threads: StepThreads | None = None,
    ) -> None:
        config = model.config
        if getattr(config, "is_encoder_decoder", False):
            raise Unsupported("an encoder-decoder model is not a decoder")
        rope = length_dependent_rope(config)
        if rope is not None:
            raise Unsupported(f"RoPE type {rope!r} depends on the sequence length")
        self.model = model
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.vocab_size = int(config.vocab_size)
        self.max_context = max_context
        self.step_threads = step_threads
        self._keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        probe = [(7 + 131 * i) % self.vocab_size for i in range(_PROBE_TOKENS)]
        reference = self._own_logits(probe)
        _register()
        try:
            model.set_attn_implementation(IMPLEMENTATION)
        except (ValueError, ImportError, AttributeError) as exc:
            raise Unsupported(f"it takes no custom attention function ({exc})") from exc
        layout = self._probe_layout(_layer_count(config))
        heads, kv_heads, head_dim = next(iter(layout.heads.values()))
        self.attention = SlotAttention(
            layers=len(layout.heads),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            windows=set(layout.windows.values()),
            max_slots=max(max_slots, 3),
            max_context=max_context,
            dtype=self.dtype,
            device=self.device,
            softcap=next(iter(layout.softcaps)),
            compile_attention=compile_attention,
            step_threads=step_threads,
        )
        self.cache = self.attention.cache
        self.path = f"generic runner ({getattr(config, 'model_type', '?')}: its own modules)"
        self._self_check(probe, reference)

    # ------------------------------------------------------------------ load-time checks

    @torch.inference_mode()
    def _own_logits(self, tokens: list[int]) -> torch.Tensor:
        """The model's own forward (its configured attention) over one sequence."""
        ids = torch.tensor([tokens], device=self.device)
        return self.model(input_ids=ids, use_cache=False).logits[0].float()  # type: ignore[no-any-return]

    @torch.inference_mode()
    def _probe_layout(self, layers: int) -> _Layout:
        layout = _Layout()
        _ACTIVE.layout = layout
        try:
            ids = torch.tensor([[1, 2]], device=self.device)
            positions = torch.tensor([[0, 1]], device=self.device)
            self.model(input_ids=ids, position_ids=positions, use_cache=False)
        finally:
            _ACTIVE.layout = None
        if layout.calls != layers or sorted(layout.heads) != list(range(layers)):
            raise Unsupported(
                f"{layout.calls} of its {layers} layers attend through transformers' "
                "attention interface (one call per layer is needed)"
            )
        if layout.foreign:
            raise Unsupported(f"its attention takes {sorted(layout.foreign)}, not implemented")
        if len(set(layout.heads.values())) != 1 or len(layout.softcaps) != 1:
            raise Unsupported("its layers differ in head layout or soft-capping")
        return layout

    def _self_check(self, probe: list[int], reference: torch.Tensor) -> None:
        """Two sequences prefilled together (lengths 5 and 3), then decoded together
        beside a third's prefill (length 7): each logit row must match the model's own
        forward over that sequence alone."""
        first = self.forward(
            [],
            [],
            [
                PrefillChunk(slot=0, tokens=tuple(probe[:5]), start=0, want_logits=True),
                PrefillChunk(slot=1, tokens=tuple(probe[:3]), start=0, want_logits=True),
            ],
        )
        second = self.forward(
            [probe[5], probe[3]],
            [5, 3],
            [PrefillChunk(slot=2, tokens=tuple(probe[:7]), start=0, want_logits=True)],
        )
        got = torch.cat((first, second))
        want = reference[[4, 2, 5, 3, 6]]
        scale = max(1.0, float(want.abs().max()))
        tolerance = (1e-3 if self.dtype == torch.float32 else 0.1) * scale
        error = float((got - want).abs().max())
        if not error <= tolerance:
            raise Unsupported(
                f"its packed forward differs from its own (max logit error {error:.3g} > "
                f"{tolerance:.3g}): it reads more than attention over its own tokens"
            )

    # ------------------------------------------------------------------ steps

    @torch.inference_mode()
    def forward(
        self,
        decode_tokens: list[int],
        decode_positions: list[int],
        prefills: list[PrefillChunk],
        decode_adapters: list[int] | None = None,  # no adapters here (refused at load)
    ) -> torch.Tensor:
        """One packed step; returns fp32 logits for every decode row, then the rows of
        each prefill chunk (``PrefillChunk.logit_rows``), in that order
        (``DecoderRunner.forward``)."""
        if self.step_threads is not None:
            self.step_threads.apply(len(decode_tokens) + sum(len(c.tokens) for c in prefills))
        packed = self.attention.pack(decode_tokens, decode_positions, prefills)
        rows = torch.tensor(packed.logit_rows, dtype=torch.long, device=self.device)
        extra: dict[str, Any] = {"logits_to_keep": rows} if self._keep else {}
        _ACTIVE.runner, _ACTIVE.step = self, packed.step
        try:
            out = self.model(
                input_ids=packed.ids[None],
                position_ids=packed.positions[None],
                use_cache=False,
                **extra,
            )
        finally:
            _ACTIVE.runner, _ACTIVE.step = None, None
        logits: torch.Tensor = out.logits[0]
        if not self._keep:
            logits = logits.index_select(0, rows)
        return logits.float()


def _layer_count(config: Any) -> int:
    """How many layers the config declares (``num_hidden_layers``, or GPT-2's ``n_layer``)."""
    count: Any = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 0)
    return int(count)
