"""Attention over the slot KV cache for one packed step: the piece both runners share.

A step packs the decode tokens of the running sequences (rows ``0..D-1``, the sequence
in cache slot ``i`` on row ``i``) and any number of prefill chunks. ``pack`` builds, once
per step, what every layer needs: where the new keys land, the decode rows' additive
biases and each chunk's mask (one per attention window in use: Mistral, Qwen2 and
Gemma 2/3 window some or all layers; a key ``k`` is seen from ``q`` when
``q - window < k <= q``, transformers' sliding-window rule). ``layer`` stores a layer's
new keys and values and runs one batched kernel over the decode rows (grouped-query
heads folded into the matmul, no key repetition) and one SDPA call per prefill chunk.
Which decode kernel runs is timed per machine at construction (``decode_attention.py``,
and the C glue's per-row kernel where the glue runs), unless batch invariance is asked
for: then the glue's kernel alone, whose bits for a row do not depend on the other rows
or on how far their spans reach.

Owner: the engine thread (through its runner). Not thread-safe.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backends.hf.model.decode_attention import (
    Attend,
    compiled_reduce,
    decode_matmul,
    decode_sdpa,
    prefill_softcapped,
)
from backends.hf.model.glue import Glue
from backends.hf.model.kv_cache import SlotKVCache
from backends.hf.model.step_threads import StepThreads, as_step

# Decode steps reading at least this many cached positions (rows x span) use the kernel
# timed on a large shape: the compiled one pays ~0.1 ms of guards per call, which only a
# large, memory-bound attention repays.
LONG_DECODE_KEYS = 4096


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """``tokens`` of the sequence in ``slot`` at positions ``start..start+len-1``.
    ``want_logits``: its last token's logits (the prompt ends here); ``score``: every
    token's logits (a prompt whose log-probabilities were asked)."""

    slot: int
    tokens: tuple[int, ...]
    start: int
    want_logits: bool
    score: bool = False
    adapter: int = -1
    """The LoRA adapter slot its tokens run with (``LoraBank``); -1: the base model."""
    fixed: bool = False
    """Its rows take the projections' fixed-size calls (``DecoderRunner.fixed_prefill``:
    the same for every chunk of a prompt); False: each rounds as a row alone."""

    @property
    def logit_rows(self) -> int:
        """How many logit rows the step returns for this chunk."""
        if self.score:
            return len(self.tokens)
        return 1 if self.want_logits else 0


@dataclass(frozen=True, slots=True)
class SlotStep:
    """One step's attention plan, shared by every layer (decode biases and prefill
    masks keyed by attention window)."""

    n: int
    num_decode: int
    span_len: int
    attend: str
    write_idx: torch.Tensor
    bias: dict[int | None, torch.Tensor]
    spans: list[tuple[int, int, PrefillChunk]]
    masks: list[dict[int | None, torch.Tensor | None]]


@dataclass(frozen=True, slots=True)
class Packed:
    """A step's packed tokens: ids, positions and slots per row, and the rows whose
    logits the caller wants (every decode row, then per chunk its ``logit_rows`` last
    rows: a finishing chunk's last, or all of a scoring chunk's)."""

    ids: torch.Tensor
    positions: torch.Tensor
    logit_rows: list[int]
    step: SlotStep


class SlotAttention:
    """See the module docstring. ``softcap`` (Gemma 2): scores become
    ``cap * tanh(score / cap)``; only the matmul kernels apply it."""

    def __init__(
        self,
        *,
        layers: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        windows: set[int | None],
        max_slots: int,
        max_context: int,
        dtype: torch.dtype,
        device: torch.device,
        softcap: float | None = None,
        compile_attention: bool = False,
        step_threads: StepThreads | None = None,
        glue: Glue | None = None,
        invariant: bool = False,
    ) -> None:
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.softcap = softcap
        self.upcast = dtype != torch.float32
        self.windows = sorted(windows, key=lambda w: -1 if w is None else w)
        self.scale = head_dim**-0.5  # only for timing the kernels at load
        self._kernels: dict[str, Attend] = {"sdpa": decode_sdpa, "matmul": decode_matmul}
        # The glue's kernel (bf16 on CPU) reads the whole cache in place: no views per call.
        self._glue = glue
        if softcap is not None:
            self._kernels = {"matmul": functools.partial(decode_matmul, softcap=softcap)}
        elif invariant:
            # Batch invariance asked for: the one kernel whose row bits ignore the batch.
            if glue is None:
                raise ValueError("batch invariance needs the C glue's decode attention")
            self._kernels = {"invariant": glue.decode_attention}
        else:
            if glue is not None:
                # One row over a chat's keys: 6.7 us here against SDPA's 25 (AMX Xeon,
                # 160 keys, SmolLM2's heads); the timing below decides per machine.
                self._kernels["invariant"] = glue.decode_attention
            if compile_attention and self.upcast and device.type == "cpu":
                self._kernels["compiled"] = compiled_reduce()
        self.decode_timings: dict[str, dict[str, float]] = {}  # shape -> kernel -> seconds
        self.step_threads = step_threads  # None: the caller's thread count for every step
        self.decode_impl, self.decode_impl_long = self._pick_decode_attention()
        self.cache = SlotKVCache(
            layers=layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            max_slots=max_slots,
            max_capacity=max_context,
            dtype=dtype,
            device=device,
        )

    def pack(
        self, decode_tokens: list[int], decode_positions: list[int], prefills: list[PrefillChunk]
    ) -> Packed:
        """The step's tokens packed (decode rows first) and its attention plan; grows the
        cache to fit."""
        dev = self.device
        num_decode = len(decode_tokens)
        tokens = list(decode_tokens)
        positions = list(decode_positions)
        slots = list(range(num_decode))
        logit_rows = list(range(num_decode))
        spans: list[tuple[int, int, PrefillChunk]] = []
        for chunk in prefills:
            begin = len(tokens)
            tokens.extend(chunk.tokens)
            positions.extend(range(chunk.start, chunk.start + len(chunk.tokens)))
            slots.extend([chunk.slot] * len(chunk.tokens))
            spans.append((begin, len(tokens), chunk))
            logit_rows.extend(range(len(tokens) - chunk.logit_rows, len(tokens)))
        self.cache.ensure(max(slots) + 1, max(positions) + 1)
        pos_t = torch.tensor(positions, dtype=torch.long, device=dev)
        slot_t = torch.tensor(slots, dtype=torch.long, device=dev)
        bias: dict[int | None, torch.Tensor] = {}
        span_len = 0
        attend = self.decode_impl
        if num_decode:
            span_len = max(decode_positions) + 1
            if num_decode * span_len >= LONG_DECODE_KEYS:
                attend = self.decode_impl_long
            bias = {
                w: self._decode_bias(pos_t[:num_decode], span_len, attend, w) for w in self.windows
            }
        step = SlotStep(
            n=len(tokens),
            num_decode=num_decode,
            span_len=span_len,
            attend=attend,
            write_idx=self.cache.write_index(slot_t, pos_t),
            bias=bias,
            spans=spans,
            masks=[
                {w: self._prefill_mask(chunk, w) for w in self.windows} for _, _, chunk in spans
            ],
        )
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)
        return Packed(ids=ids, positions=pos_t, logit_rows=logit_rows, step=step)

    def layer(
        self,
        index: int,
        qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        step: SlotStep,
        *,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """Store layer ``index``'s new keys and values, then attend: ``q [n, heads, hd]``,
        ``k``/``v [n, kv_heads, hd]``; returns ``[n, heads*hd]``."""
        q, k, v = qkv
        hd, rows = self.head_dim, step.n * self.kv_heads
        self.cache.k[index].view(-1, hd).index_copy_(0, step.write_idx, k.reshape(rows, hd))
        self.cache.v[index].view(-1, hd).index_copy_(0, step.write_idx, v.reshape(rows, hd))
        return self.attend(index, q, step, window=window, scale=scale)

    def rope_layer(
        self,
        index: int,
        qk: torch.Tensor,
        v: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor, int],
        step: SlotStep,
        *,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """``layer`` for un-rotated ``qk`` (``[n, heads + kv_heads, hd]``) with the C glue:
        RoPE (``(cos, sin_signed, rotary)`` rows per token) and the cache write in one
        call, the same bits as rotating first and calling ``layer``."""
        if self._glue is None:
            raise ValueError("rope_layer needs the C glue")
        cache = (self.cache.k[index], self.cache.v[index])
        q = self._glue.rope_store(qk, v, rope, cache, step.write_idx)
        return self.attend(index, q, step, window=window, scale=scale)

    def attend(
        self, index: int, q: torch.Tensor, step: SlotStep, *, window: int | None, scale: float
    ) -> torch.Tensor:
        """Layer ``index``'s attention of the step's queries (``[n, heads, hd]``) over the
        cache, where this step's keys already are; ``[n, heads*hd]``. One call per layer:
        the cache views are taken once (this runs 30 times a step on the hot path)."""
        k_cache = self.cache.k[index]
        v_cache = self.cache.v[index]
        if step.num_decode:
            d, span = step.num_decode, step.span_len
            if step.attend == "invariant" and self._glue is not None:
                # the whole cache: the kernel reads each row's bounded keys in place
                decoded = self._glue.decode_attention(
                    q[:d], k_cache, v_cache, step.bias[window], scale
                )
            else:
                # q contiguous (a small copy; one row stays a strided view): the layouts
                # the compiled kernel is warmed for
                decoded = self._kernels[step.attend](
                    q[:d].contiguous(),
                    k_cache[:d, :, :span],
                    v_cache[:d, :, :span],
                    step.bias[window],
                    scale,
                )
            if not step.spans:
                return decoded
            parts = [decoded]
        else:
            parts = []
        for (begin, end, chunk), masks in zip(step.spans, step.masks, strict=True):
            parts.append(
                self._prefill(
                    q[begin:end], k_cache, v_cache, chunk, mask=masks[window], scale=scale
                )
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _prefill(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        chunk: PrefillChunk,
        *,
        mask: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        """One chunk's queries over its slot's keys up to the chunk's end."""
        t = q.shape[0]
        length = chunk.start + t
        qp = q.transpose(0, 1)[None]
        kp = k_cache[chunk.slot : chunk.slot + 1, :, :length]
        vp = v_cache[chunk.slot : chunk.slot + 1, :, :length]
        if self.softcap is not None:
            out = prefill_softcapped(qp, kp, vp, mask=mask, scale=scale, softcap=self.softcap)
        else:
            out = F.scaled_dot_product_attention(
                qp, kp, vp, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
            )
        return out[0].transpose(0, 1).reshape(t, self.heads * self.head_dim)

    def _decode_bias(
        self, positions: torch.Tensor, span_len: int, impl: str, window: int | None = None
    ) -> torch.Tensor:
        """Additive mask, 0 up to each row's own position (and, with a ``window``, only
        over its last ``window`` positions): ``[D, 1, 1, span]`` in the model dtype for
        SDPA, or fp32 ``[D*kv_heads, 1, span]`` for the matmul/compiled paths."""
        if impl == "invariant":  # [D, 2]: each row's first and last key
            first = torch.zeros_like(positions) if window is None else positions - window + 1
            return torch.stack((first.clamp(min=0), positions), dim=1)
        keys = torch.arange(span_len, device=self.device)
        allowed = keys[None, :] <= positions[:, None]
        if window is not None:
            allowed &= keys[None, :] > positions[:, None] - window
        sdpa = impl == "sdpa"
        dtype = self.dtype if sdpa else torch.float32
        bias = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
        bias.masked_fill_(~allowed, float("-inf"))
        rows = positions.shape[0]
        if sdpa:
            return bias[:, None, None, :]
        expanded = bias[:, None, None, :].expand(rows, self.kv_heads, 1, span_len)
        return expanded.reshape(rows * self.kv_heads, 1, span_len)

    def _prefill_mask(self, chunk: PrefillChunk, window: int | None) -> torch.Tensor | None:
        t = len(chunk.tokens)
        if chunk.start == 0 and (window is None or window >= t):
            return None  # plain causal
        q_pos = torch.arange(chunk.start, chunk.start + t, device=self.device)
        k_pos = torch.arange(chunk.start + t, device=self.device)
        allowed = k_pos[None, :] <= q_pos[:, None]
        if window is not None:
            allowed &= k_pos[None, :] > q_pos[:, None] - window
        return allowed

    def _pick_decode_attention(self) -> tuple[str, str]:
        """The kernels for short and for long (``LONG_DECODE_KEYS``) decode steps.

        fp32: the matmuls (bit-stable across batch sizes). Half precision on CUDA: SDPA.
        Half precision on CPU: whichever is faster here, timed on synthetic batches at
        load. SDPA's CPU kernel measured ~1.6x faster than the matmuls on an AMX Xeon but
        ~6x slower on an AMD EPYC (its bf16 GEMMs take MKL's generic paths there), where
        upcasting to fp32 matmuls wins; all compute the same attention in fp32. With
        ``compile_attention`` the compiled kernel competes too (compiled here, at load)."""
        if len(self._kernels) == 1:  # soft-capped attention: only the matmuls apply it
            only = next(iter(self._kernels))
            return only, only
        if not self.upcast:
            return "matmul", "matmul"
        if self.device.type != "cpu":
            return "sdpa", "sdpa"
        gen = torch.Generator(device=self.device).manual_seed(0)  # leave the global RNG be
        compiled = "compiled" in self._kernels
        if compiled:  # on the engine's own thread count, which long steps run on
            self._warm_compiled(*self._probe(8, 256, gen))
        with as_step(self.step_threads, 8):  # short steps of <= 8 rows may run on 1 thread
            if compiled and self.step_threads is not None:  # the kernel bakes the count
                self._warm_compiled(*self._probe(8, 256, gen))
            short = self._fastest(*self._probe(8, 256, gen))
        return short, self._fastest(*self._probe(16, 512, gen))

    def _probe(
        self, rows: int, span: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """A query and K/V caches of twice ``span`` positions, strided like a step's: the
        query a view of the fused q/k projection, K/V views of a larger cache."""
        shape = (rows, self.kv_heads, 2 * span, self.head_dim)
        k = torch.randn(shape, generator=gen, device=self.device).to(self.dtype)
        v = torch.randn(shape, generator=gen, device=self.device).to(self.dtype)
        q_shape = (rows, self.heads + self.kv_heads, self.head_dim)
        q = torch.randn(q_shape, generator=gen, device=self.device).to(self.dtype)
        return q[:, : self.heads], k, v, span

    def _fastest(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span: int) -> str:
        positions = torch.full((q.shape[0],), span - 1, device=self.device)
        biases = {impl: self._decode_bias(positions, span, impl) for impl in self._kernels}
        timings: dict[str, list[float]] = {impl: [] for impl in self._kernels}
        q = q.contiguous()
        for rep in range(8):  # interleaved, so drift of a shared machine hits all alike
            for impl, attend in self._kernels.items():
                began = time.perf_counter()
                for _ in range(3):
                    attend(q, k[:, :, :span], v[:, :, :span], biases[impl], self.scale)
                if rep:  # the first round warms each kernel's allocations
                    timings[impl].append(time.perf_counter() - began)
        # the fastest run of each: interference on a shared machine only ever adds time
        best = {impl: min(runs) for impl, runs in timings.items()}
        self.decode_timings[f"{q.shape[0]}x{span}"] = best
        return min(best, key=best.__getitem__)

    def _warm_compiled(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span: int) -> None:
        """Compile for every guard a step can hit (one row is specialised; a span equal to
        the capacity is a contiguous view), so no step recompiles on the engine thread."""
        rows = q.shape[0]
        for d, length in ((1, span), (rows, span), (rows, k.shape[2]), (1, 2)):
            positions = torch.full((d,), length - 1, device=self.device)
            bias = self._decode_bias(positions, length, "compiled")
            kd, vd = k[:d, :, :length], v[:d, :, :length]
            self._kernels["compiled"](q[:d].contiguous(), kd, vd, bias, self.scale)
