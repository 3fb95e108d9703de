"""One hand-written forward for the common decoder families over a ``SlotKVCache``.

Why not ``model(...)``: for a 135M model with 30 layers, transformers' forward spends
more time in Python (mask building, cache objects, hooks) than in matmuls, and its caches
cannot let one sequence join or leave a running batch without recomputing or copying the
others. This runner takes the weights out of a loaded model once (fused QKV and gate/up
matrices, RoPE tables taken from the model's own rotary module, so variants such as
llama3 scaling or Gemma 3's local base stay exact) and runs one *packed* forward per
engine step: the decode tokens of all running sequences (rows ``0..D-1``, sequence in
slot ``i`` on row ``i``) followed by any number of prefill chunks. Projections and MLPs
run once over all packed tokens; attention runs as one batched matmul over the decode rows
(grouped-query heads folded into the matmul, no key repetition) and one SDPA call per
prefill chunk. What differs between Llama, Mistral, Qwen2/3, Phi-3 and Gemma 1/2/3 is a
``Family`` of switches read from the config (``families.py``), not a copy per family.

Owner: the engine thread. Not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from backends.hf.adapters.bank import LoraBank, LoraStep
from backends.hf.loading.quantization import NONE, QuantPlan
from backends.hf.model.families import Family, Unsupported, family_of
from backends.hf.model.glue import Glue, GlueNorm
from backends.hf.model.linears import Int4Tiles, Linear, make_linear
from backends.hf.model.norms import OffsetRMSNorm, RMSNorm, offset_weight
from backends.hf.model.slot_attention import PrefillChunk, SlotAttention, SlotStep
from backends.hf.model.step_threads import StepThreads

Norm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class _Step:
    """One step's attention plan and its RoPE rows, keyed by rotary kind."""

    slots: SlotStep
    cos: dict[str | None, torch.Tensor]
    sin: dict[str | None, torch.Tensor]
    fixed_from: int  # rows from here on take fixed-size calls (``Linear``)
    lora: LoraStep | None = None


@dataclass(frozen=True, slots=True)
class _Layer:
    ln_in: torch.Tensor
    qkv: Linear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Linear
    ln_attn_out: torch.Tensor | None  # Gemma 2/3 only
    ln_mlp_in: torch.Tensor
    gate_up: Linear
    down: Linear
    ln_mlp_out: torch.Tensor | None  # Gemma 2/3 only
    window: int | None
    rope: str | None


def unsupported_reason(model: Any) -> str | None:
    """Why this runner cannot compute exactly what ``model`` computes (None: it can)."""
    try:
        family_of(model)
    except Unsupported as exc:
        return str(exc)
    return None


def supports(model: Any) -> bool:
    """Whether this runner computes exactly what ``model`` computes."""
    return unsupported_reason(model) is None


def _detach(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach()


def _bias(*linears: Any) -> torch.Tensor | None:
    biases = [linear.bias for linear in linears]
    if all(b is None for b in biases):
        return None
    if any(b is None for b in biases):
        raise Unsupported("a fused projection with a bias on only some of its parts")
    return torch.cat(biases).detach()


def _activation(mlp: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLP's own activation; SiLU as the bare function (the module call is pure
    Python overhead per layer, and the glue fuses ``SiLU(gate) * up``)."""
    # transformers' own SiLU module (``ACT2FN["silu"]`` since transformers 5) as well as
    # torch's: with only torch's here, SmolLM2's steps ran SiLU and a multiply as framework
    # ops per layer instead of the glue's one call. Imported here: a model is loaded by
    # now, and importing the product must not import transformers.
    from transformers.activations import SiLUActivation

    act = getattr(mlp, "act_fn", None) or mlp.activation_fn
    if isinstance(act, torch.nn.SiLU | SiLUActivation):
        return F.silu
    return act  # type: ignore[no-any-return]


class DecoderRunner:
    """Packed forward over slot-cached sequences. See the module docstring."""

    def __init__(
        self,
        model: Any,
        *,
        max_slots: int,
        max_context: int,
        compile_attention: bool = False,
        step_threads: StepThreads | None = None,
        quantization: QuantPlan = NONE,
        lora: LoraBank | None = None,
        glue: Glue | None = None,
        batch_invariant: bool = False,
    ) -> None:
        config = model.config
        inner = model.model
        self.family: Family = family_of(model)
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        # Half precision keeps norms (backends/hf/model/norms.py) and softmax in fp32 (bf16
        # alone measurably degrades answers of this small model).
        self.upcast = self.dtype != torch.float32
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.group = self.heads // self.kv_heads
        self.hidden = int(config.hidden_size)
        self.eps = float(config.rms_norm_eps)
        # The C glue covers Llama's norm in bf16 on CPU (Gemma's offset norm rounds
        # differently and keeps the framework ops).
        fits = self.dtype == torch.bfloat16 and self.device.type == "cpu"
        usable = glue if fits else None  # its RoPE and decode attention serve every family
        self.glue = None if self.family.offset_norms else usable
        self._rope_glue = usable  # RoPE with the KV-cache write: the same bits in C
        self._norm, self._head_norm = self._norms()
        self.scale = self.family.scale
        self.vocab_size = int(config.vocab_size)
        self.embed = inner.embed_tokens.weight.detach()
        scale = getattr(inner.embed_tokens, "embed_scale", None)  # Gemma: sqrt(hidden)
        self.embed_scale = None if scale is None else scale.to(self.dtype)
        self.norm = self._norm_weight(inner.norm)
        self.quantization = quantization
        # The LM head stays as loaded under int8 / int4 / gguf: with it at int8 too,
        # SmolLM2's greedy first token agreed with bf16 on 95 % of 200 prompts, and no
        # step got faster: on Gemma 3 270M (262k vocabulary) an int8 head read 167 MB a
        # step less yet one row took 19.9 ms against 17.4, sixteen 78 against 45 ms
        # (docs/hf.md, Quantized weights). Dense, it is prepacked: at
        # 1-16 decode rows the vocabulary projection measured 3.6/5.3 ms unpacked vs
        # 2.4/3.2 ms packed on the AMD box. w4a8 takes it at 8-bit weights
        # (``quantization.W4A8`` says why).
        self.lm_head = make_linear(model.lm_head.weight.detach(), None, quantization.head)
        self.max_context = max_context
        self.cos: dict[str | None, torch.Tensor] = {}
        self.sin_signed: dict[str | None, torch.Tensor] = {}
        for kind in sorted(set(self.family.rope_kinds), key=str):
            cos, sin = self._rope_table(inner, max_context, kind)
            half = cos.shape[-1] // 2
            self.cos[kind] = cos
            # rotate_half(x) * sin == flip_halves(x) * [-sin_lo, sin_hi]
            self.sin_signed[kind] = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        # Phi-3's partial rotary: RoPE covers the first rotary_dim features of a head
        self.rotary_dim = next(iter(self.cos.values())).shape[-1]
        self.act = _activation(inner.layers[0].mlp)
        self.layers = [self._take_layer(i, layer) for i, layer in enumerate(inner.layers)]
        self.attention = SlotAttention(
            layers=len(self.layers),
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            windows=set(self.family.windows),
            max_slots=max_slots,
            max_context=max_context,
            dtype=self.dtype,
            device=self.device,
            softcap=self.family.attn_softcap,
            compile_attention=compile_attention,
            step_threads=step_threads,
            glue=self._invariant(usable) if batch_invariant else usable,
            invariant=batch_invariant and self.upcast,
        )
        self.cache = self.attention.cache
        thresholds = [
            linear.prompt_tokens
            for linear in self._projections()
            if linear.prompt_tokens is not None
        ]
        # None: no projection has a way of its own for a prompt's rows; else the length
        # from which all that have one take it (a prompt is one kind in every projection)
        self.fixed_tokens = max(thresholds) if thresholds else None
        self.lora = lora
        self.step_threads = step_threads  # None: the caller's thread count for every step
        self.path = self._described()

    def _described(self) -> str:
        """What runs the model, for the load log (the backend's ``runner``)."""
        parts = [f"packed runner ({self.family.model_type})"]
        if self.quantization.quantized:
            parts.append(f"weights: {self.quantization.described}")
        if any(isinstance(linear, Int4Tiles) for linear in self._projections()):
            parts.append("int4 projections on AMX tiles")
        if self.glue is not None:
            parts.append("norms, RoPE and SiLU in the C glue")
        if self.lora is not None:
            parts.append(f"LoRA adapters: {', '.join(self.lora.names)} (rank {self.lora.rank})")
        return "; ".join(parts)

    def _projections(self) -> list[Linear]:
        return [
            linear
            for layer in self.layers
            for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)
        ]

    def _invariant(self, glue: Glue | None) -> Glue | None:
        """The kernels for batch-invariant decode attention (``glue``: those usable here,
        bf16 on CPU; None returned: fp32, where the matmuls already are); ValueError where
        this runner has none."""
        if not self.upcast:
            return None
        if self.family.attn_softcap is not None:
            raise ValueError("batch_invariant: no invariant kernel for soft-capped attention")
        if glue is None:
            raise ValueError(
                "batch_invariant needs fp32, or bf16 on CPU with the C glue kernels "
                "(glue_kernels: true, built by make install)"
            )
        return glue

    def _norms(self) -> tuple[Norm, Norm]:
        """The hidden-state norm and the per-head (q/k) norm."""
        eps = self.eps
        if self.family.offset_norms:
            return OffsetRMSNorm(self.hidden, eps), OffsetRMSNorm(self.head_dim, eps)
        head = RMSNorm(self.head_dim, eps, self.dtype, self.device)
        if self.glue is not None:
            return GlueNorm(self.glue, eps), head
        return RMSNorm(self.hidden, eps, self.dtype, self.device), head

    def _norm_weight(self, norm: Any) -> torch.Tensor:
        if self.family.offset_norms:
            return offset_weight(norm.weight)
        return norm.weight.detach()  # type: ignore[no-any-return]

    def _take_layer(self, index: int, layer: Any) -> _Layer:
        attn = layer.self_attn
        mlp = layer.mlp
        if hasattr(attn, "qkv_proj"):  # Phi-3 ships it fused
            w_qkv = attn.qkv_proj.weight
            b_qkv = _detach(attn.qkv_proj.bias)
        else:
            parts = (attn.q_proj, attn.k_proj, attn.v_proj)
            w_qkv = torch.cat([p.weight for p in parts]).detach()
            b_qkv = _bias(*parts)
        if hasattr(mlp, "gate_up_proj"):
            w_gate_up = mlp.gate_up_proj.weight
            b_gate_up = _detach(mlp.gate_up_proj.bias)
        else:
            w_gate_up = torch.cat((mlp.gate_proj.weight, mlp.up_proj.weight), dim=0).detach()
            b_gate_up = _bias(mlp.gate_proj, mlp.up_proj)
        family = self.family
        sandwich = family.sandwich_norms
        return _Layer(
            ln_in=self._norm_weight(layer.input_layernorm),
            qkv=self._linear(index, "qkv", w_qkv, b_qkv),
            q_norm=self._norm_weight(attn.q_norm) if family.qk_norm else None,
            k_norm=self._norm_weight(attn.k_norm) if family.qk_norm else None,
            o=self._linear(index, "o", attn.o_proj.weight, _detach(attn.o_proj.bias)),
            ln_attn_out=self._norm_weight(layer.post_attention_layernorm) if sandwich else None,
            ln_mlp_in=self._norm_weight(
                layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm
            ),
            gate_up=self._linear(index, "gate_up", w_gate_up, b_gate_up),
            down=self._linear(index, "down", mlp.down_proj.weight, _detach(mlp.down_proj.bias)),
            ln_mlp_out=self._norm_weight(layer.post_feedforward_layernorm) if sandwich else None,
            window=family.windows[index],
            rope=family.rope_kinds[index],
        )

    def _linear(
        self, index: int, part: str, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> Linear:
        plan = self.quantization
        scheme = plan.scheme(index, part)
        return make_linear(weight.detach(), bias, scheme, plan.group, prompt_rows=True)

    def fixed_prefill(self, prompt_tokens: int) -> bool:
        """Whether a prompt of ``prompt_tokens`` tokens is prefilled in the projections'
        own way for a prompt's rows (``PrefillChunk.fixed``; ``Linear.prompt_tokens``:
        bf16 ones in fixed-size calls on AMX, from 33 tokens there; quantized ones on
        unpacked weights: int8, int4 on PyTorch's kernel and integer-dot from 64, int4 on
        AMX tiles from 256)."""
        return self.fixed_tokens is not None and prompt_tokens >= self.fixed_tokens

    @property
    def weight_bytes(self) -> int:
        """Bytes of projection weights one step reads (the LM head included)."""
        per_layer = (
            layer.qkv.nbytes + layer.o.nbytes + layer.gate_up.nbytes + layer.down.nbytes
            for layer in self.layers
        )
        return sum(per_layer) + self.lm_head.nbytes

    def _rope_table(
        self, inner: Any, length: int, kind: str | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(length, device=self.device)[None, :]
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        if kind is None:
            cos, sin = inner.rotary_emb(probe, positions)
        else:
            cos, sin = inner.rotary_emb(probe, positions, kind)
        return cos[0].to(self.dtype).contiguous(), sin[0].to(self.dtype).contiguous()

    @torch.inference_mode()
    def forward(
        self,
        decode_tokens: list[int],
        decode_positions: list[int],
        prefills: list[PrefillChunk],
        decode_adapters: list[int] | None = None,
    ) -> torch.Tensor:
        """One packed step; returns fp32 logits for every decode row, then one row per
        prefill chunk with ``want_logits`` (its last token), or one per token of a scoring
        chunk (``PrefillChunk.logit_rows``), in that order.

        Decode row ``i`` must belong to the sequence in cache slot ``i``; its LoRA adapter
        slot is ``decode_adapters[i]`` (-1 or None: the base model), a chunk's its own."""
        if self.step_threads is not None:
            self.step_threads.apply(len(decode_tokens) + sum(len(c.tokens) for c in prefills))
        # Chunks whose rows take fixed-size calls go last, so that each projection sees
        # one boundary (``_Step.fixed_from``); the logits come back in the caller's order.
        ordered = sorted(prefills, key=lambda chunk: chunk.fixed)
        packed = self.attention.pack(decode_tokens, decode_positions, ordered)
        step = _Step(
            slots=packed.step,
            cos={kind: table[packed.positions][:, None, :] for kind, table in self.cos.items()},
            sin={
                kind: table[packed.positions][:, None, :] for kind, table in self.sin_signed.items()
            },
            fixed_from=len(decode_tokens) + sum(len(c.tokens) for c in ordered if not c.fixed),
            lora=self._lora_step(decode_adapters, len(decode_tokens), ordered),
        )
        logit_rows = _caller_order(packed.logit_rows, len(decode_tokens), ordered, prefills)
        x = F.embedding(packed.ids, self.embed)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        pending: torch.Tensor | None = None  # the last layer's output, not yet in x
        for index, layer in enumerate(self.layers):
            x, pending = self._layer(index, layer, x, pending, step)
        rows = torch.tensor(logit_rows, dtype=torch.long, device=self.device)
        if pending is None or self.glue is None:
            h = self._norm(x.index_select(0, rows), self.norm)
        else:  # only the rows that give logits
            picked = (x.index_select(0, rows), pending.index_select(0, rows))
            _, h = self.glue.add_rms_norm(*picked, self.norm, self.eps)
        logits = self.lm_head(h)
        cap = self.family.final_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def _lora_step(
        self, decode_adapters: list[int] | None, decode_rows: int, prefills: list[PrefillChunk]
    ) -> LoraStep | None:
        if self.lora is None:
            return None
        decode = list(decode_adapters) if decode_adapters is not None else [-1] * decode_rows
        return self.lora.step(decode, [(len(c.tokens), c.adapter) for c in prefills])

    def _rope(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The framework ops' RoPE (the glue's is fused with the cache write)."""
        rd, n, rows = self.rotary_dim, qk.shape[0], qk.shape[1]
        part = qk if rd == self.head_dim else qk[..., :rd]
        flipped = part.reshape(n, rows, 2, rd // 2).flip(2).view(n, rows, rd)
        rotated = part * cos + flipped * sin
        if rd == self.head_dim:
            return rotated
        return torch.cat((rotated, qk[..., rd:]), dim=-1)

    def _layer(
        self,
        index: int,
        layer: _Layer,
        x: torch.Tensor,
        pending: torch.Tensor | None,
        step: _Step,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decoder layer over the residual stream ``x`` plus ``pending``, the layer
        before's output (None: none). Returns the new stream and this layer's output, which
        the glue adds in the next norm's call (one C call for add and norm; the same bits
        as adding first); without the glue, ``(x + output, None)``."""
        hd, heads, kvh, n = self.head_dim, self.heads, self.kv_heads, step.slots.n
        lora, rows = step.lora, step.fixed_from
        if pending is not None and self.glue is not None:
            x, h = self.glue.add_rms_norm(x, pending, layer.ln_in, self.eps)
        else:
            h = self._norm(x, layer.ln_in)
        qkv = layer.qkv(h, fixed_from=rows)
        if lora is not None:
            lora.add(index, "qkv", h, qkv)
        qk = qkv[:, : (heads + kvh) * hd].view(n, heads + kvh, hd)
        if layer.q_norm is not None and layer.k_norm is not None:
            qk = torch.cat(
                (
                    self._head_norm(qk[:, :heads], layer.q_norm),
                    self._head_norm(qk[:, heads:], layer.k_norm),
                ),
                dim=1,
            )
        v = qkv[:, (heads + kvh) * hd :].view(n, kvh, hd)
        cos, sin = step.cos[layer.rope], step.sin[layer.rope]
        if self._rope_glue is not None:  # RoPE and the cache write in one C call
            attn = self.attention.rope_layer(
                index,
                qk,
                v,
                (cos, sin, self.rotary_dim),
                step.slots,
                window=layer.window,
                scale=self.scale,
            )
        else:
            qk = self._rope(qk, cos, sin)
            attn = self.attention.layer(
                index,
                (qk[:, :heads], qk[:, heads:], v),
                step.slots,
                window=layer.window,
                scale=self.scale,
            )
        out = layer.o(attn, fixed_from=rows)
        if lora is not None:
            lora.add(index, "o", attn, out)
        if layer.ln_attn_out is not None:
            out = self._norm(out, layer.ln_attn_out)
        if self.glue is not None:
            x, h = self.glue.add_rms_norm(x, out, layer.ln_mlp_in, self.eps)
        else:
            x = x + out
            h = self._norm(x, layer.ln_mlp_in)
        gate_up = layer.gate_up(h, fixed_from=rows)
        if lora is not None:
            lora.add(index, "gate_up", h, gate_up)
        if self.glue is not None and self.act is F.silu:
            inner = self.glue.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            inner = self.act(gate) * up
        out = layer.down(inner, fixed_from=rows)
        if lora is not None:
            lora.add(index, "down", inner, out)
        if layer.ln_mlp_out is not None:
            out = self._norm(out, layer.ln_mlp_out)
        if self.glue is not None:
            return x, out
        return x + out, None


def _caller_order(
    logit_rows: list[int],
    decode_rows: int,
    ordered: list[PrefillChunk],
    prefills: list[PrefillChunk],
) -> list[int]:
    """``logit_rows`` of a step packed with ``ordered`` chunks, rearranged for the
    caller's ``prefills`` order (the same chunks)."""
    if all(a is b for a, b in zip(ordered, prefills, strict=True)):
        return logit_rows
    per_chunk: dict[int, list[int]] = {}
    at = decode_rows
    for chunk in ordered:
        per_chunk[id(chunk)] = logit_rows[at : at + chunk.logit_rows]
        at += chunk.logit_rows
    rows = logit_rows[:decode_rows]
    for chunk in prefills:
        rows += per_chunk[id(chunk)]
    return rows
