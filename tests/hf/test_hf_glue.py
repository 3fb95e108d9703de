"""The C glue kernels (``backends/hf/model/glue.py``): ``make install`` built them for
this source, they round as the framework ops they replace, a row gets the same bits alone
and in any batch, and the runner with them decodes what it decodes without them; with
``batch_invariant`` a sequence decodes the same alone and in any batch, mixed lengths
included."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from backends.hf.backend import HFBackend
from backends.hf.loading.loader import ModelLoadError, load
from backends.hf.model import glue
from backends.hf.model.norms import upcast_rms_norm
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.model.slot_attention import PrefillChunk
from tests.hf import tiny
from tests.hf.helpers import collect, completion, config

EPS = 1e-5


@pytest.fixture(scope="module")
def kernels() -> glue.Glue:
    found = glue.load()
    assert not isinstance(found, str), found  # make install / make test build them
    return found


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 units in the last place (same-sign values)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


def test_a_missing_build_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(glue, "library_path", lambda: tmp_path / "libllmso_glue-x.so")
    reason = glue.load.__wrapped__()
    assert isinstance(reason, str) and "make install" in reason


def test_a_build_replaces_the_earlier_builds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stale = tmp_path / "libllmso_glue-0123456789ab.so"
    stale.write_bytes(b"an earlier source's build")
    other = tmp_path / "notes.txt"
    other.write_text("kept")
    monkeypatch.setattr(glue, "library_path", lambda: tmp_path / "libllmso_glue-x.so")
    built = glue.build()
    assert built.exists() and not stale.exists() and other.exists()
    stale.write_bytes(b"left by an older llmso")
    assert glue.build() == built  # built already: only the stale one goes
    assert built.exists() and not stale.exists()


@pytest.mark.parametrize("hidden", [576, 100])  # 100: a tail past the 16-lane blocks
def test_norm_rounds_as_the_fp32_upcast_norm(kernels: glue.Glue, hidden: int) -> None:
    gen = torch.Generator().manual_seed(1)
    wide = (torch.randn(33, hidden + 8, generator=gen) * 4).to(torch.bfloat16)
    x = wide[:, :hidden]  # strided rows, as a slice of a fused projection
    weight = torch.randn(hidden, generator=gen).to(torch.bfloat16)
    got, want = kernels.rms_norm(x, weight, EPS), upcast_rms_norm(x, weight, EPS)
    # Only the order of the fp32 sum of squares differs: at most one bf16 step, rarely.
    assert int(_ulps(got, want).max()) <= 1
    assert float((got != want).float().mean()) <= 0.01
    residual = torch.randn(33, hidden, generator=gen).to(torch.bfloat16)
    total, normed = kernels.add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(total, x + residual)
    assert torch.equal(normed, kernels.rms_norm(x + residual, weight, EPS))


def _attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor, scale: float
) -> torch.Tensor:
    """Row d's attention over keys bounds[d] of slot d, in float64."""
    rows, heads, hd = q.shape
    group = heads // k.shape[1]
    out = torch.empty(rows, heads, hd, dtype=torch.float64)
    for d in range(rows):
        first, last = (int(b) for b in bounds[d])
        keys = k[d, :, first : last + 1].double().repeat_interleave(group, dim=0)
        values = v[d, :, first : last + 1].double().repeat_interleave(group, dim=0)
        scores = torch.einsum("hd,hkd->hk", q[d].double() * scale, keys).softmax(-1)
        out[d] = torch.einsum("hk,hkd->hd", scores, values)
    return out.reshape(rows, heads * hd)


@pytest.mark.parametrize(("heads", "kv_heads", "hd"), [(9, 3, 64), (14, 2, 64), (8, 8, 128)])
def test_decode_attention_is_the_attention_and_ignores_the_batch(
    kernels: glue.Glue, heads: int, kv_heads: int, hd: int
) -> None:
    """Spans of every length around the 16-key blocks, windows that start past 0, and a
    batch big enough to split over threads: each row as computed alone, bit for bit, and
    within bf16 rounding of float64 attention (the scalar loops too)."""
    gen = torch.Generator().manual_seed(3)
    spans = [(0, 0), (0, 14), (3, 18), (0, 16), (40, 600), (0, 899), (5, 71)]
    rows = len(spans)
    shape = (rows + 1, kv_heads, 960, hd)  # a spare slot, as the cache has
    k = torch.randn(shape, generator=gen).to(torch.bfloat16)
    v = torch.randn(shape, generator=gen).to(torch.bfloat16)
    q = torch.randn(rows, heads, hd, generator=gen).to(torch.bfloat16)
    bounds = torch.tensor(spans, dtype=torch.long)
    scale = hd**-0.5
    together = kernels.decode_attention(q, k, v, bounds, scale)
    want = _attention_reference(q, k, v, bounds, scale)
    assert float((together.double() - want).abs().max()) < 2e-2
    portable = kernels.decode_attention(q, k, v, bounds, scale, portable=True)
    assert float((portable.double() - want).abs().max()) < 2e-2
    for d in range(rows):
        alone = kernels.decode_attention(q[d : d + 1], k[d:], v[d:], bounds[d : d + 1], scale)
        assert torch.equal(alone, together[d : d + 1]), d


def _rotate_half(x: torch.Tensor) -> torch.Tensor:  # transformers' formula
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@pytest.mark.parametrize(("rotary", "rows"), [(32, 9), (16, 9), (32, 150)])
def test_rope_store_is_bitwise_transformers_formula_and_index_copy(
    kernels: glue.Glue, rotary: int, rows: int
) -> None:
    """16 of 32: Phi-3's partial rotary; 150 rows: split over the threads."""
    heads, kv_heads, head_dim, positions = 6, 2, 32, 200
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, generator=gen).to(torch.bfloat16)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(rows, heads + kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].view(rows, kv_heads, head_dim)  # strided rows
    angles = torch.rand(rows, 1, rotary // 2, generator=gen) * 50
    cos = torch.cat((angles.cos(), angles.cos()), -1).to(torch.bfloat16)
    sin = torch.cat((angles.sin(), angles.sin()), -1).to(torch.bfloat16)
    half = rotary // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    part = qk[..., :rotary]
    want = torch.cat((part * cos + _rotate_half(part) * sin, qk[..., rotary:]), dim=-1)
    # the cache as SlotKVCache lays it out, rows written at shuffled (slot, position)s
    slots = torch.randperm(rows, generator=gen)
    at = torch.randint(0, positions, (rows,), generator=gen)
    base = (slots[:, None] * kv_heads + torch.arange(kv_heads)[None, :]) * positions
    write_rows = (base + at[:, None]).reshape(-1)
    k_cache = torch.full((rows, kv_heads, positions, head_dim), 7.0, dtype=torch.bfloat16)
    v_cache = torch.full_like(k_cache, 7.0)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k.view(-1, head_dim).index_copy_(0, write_rows, want[:, heads:].reshape(-1, head_dim))
    want_v.view(-1, head_dim).index_copy_(0, write_rows, v.reshape(-1, head_dim))
    q = kernels.rope_store(qk, v, (cos, signed, rotary), (k_cache, v_cache), write_rows)
    assert torch.equal(q, want[:, :heads])
    assert torch.equal(k_cache, want_k)
    assert torch.equal(v_cache, want_v)


def test_silu_mul_rounds_as_the_framework_ops(kernels: glue.Glue) -> None:
    gen = torch.Generator().manual_seed(4)
    gate_up = (torch.randn(64, 2 * 1536, generator=gen) * 4).to(torch.bfloat16)
    gate_up[0, :6] = torch.tensor([0.0, -0.0, 30.0, -30.0, 95.0, -95.0])  # SiLU's tails
    gate, up = gate_up.chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    got = kernels.silu_mul(gate_up)
    # Only the exponential is the kernel's own (a polynomial to ~1 fp32 ulp).
    assert int(_ulps(got, want).max()) <= 1
    assert float((got != want).float().mean()) <= 0.001


@pytest.mark.parametrize("rows", [37, 150])  # 150 x 576: the rows split over threads
def test_a_row_gets_the_same_bits_alone_and_in_a_batch(kernels: glue.Glue, rows: int) -> None:
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(rows, 576, generator=gen) * 3).to(torch.bfloat16)
    r = torch.randn(rows, 576, generator=gen).to(torch.bfloat16)
    w = torch.randn(576, generator=gen).to(torch.bfloat16)
    together = kernels.add_rms_norm(x, r, w, EPS)
    normed = kernels.rms_norm(x, w, EPS)
    gate_up = torch.cat((x, r), dim=-1)
    silu_together = kernels.silu_mul(gate_up)
    for row in (0, 17, rows // 2 + 1, rows - 1):
        alone = kernels.add_rms_norm(x[row : row + 1], r[row : row + 1], w, EPS)
        assert torch.equal(alone[0], together[0][row : row + 1])
        assert torch.equal(alone[1], together[1][row : row + 1])
        assert torch.equal(kernels.rms_norm(x[row : row + 1], w, EPS), normed[row : row + 1])
        silu_alone = kernels.silu_mul(gate_up[row : row + 1])
        assert torch.equal(silu_alone, silu_together[row : row + 1])


def _decode(
    runner: DecoderRunner, prompts: list[list[int]], steps: int, forced: list[list[int]] | None
) -> tuple[list[list[int]], torch.Tensor]:
    """Prefill every prompt in one step, then decode them all together: greedily, or
    feeding ``forced``'s tokens. Returns the tokens and every step's logits."""
    chunks = [
        PrefillChunk(slot=i, tokens=tuple(p), start=0, want_logits=True)
        for i, p in enumerate(prompts)
    ]
    logits = [runner.forward([], [], chunks)]
    out: list[list[int]] = [[] for _ in prompts]
    for step in range(steps + 1):
        picked = logits[-1].argmax(-1).tolist()
        for i, seq in enumerate(out):
            seq.append(forced[i][step] if forced else picked[i])
        if step == steps:
            break
        positions = [len(p) + len(seq) - 1 for p, seq in zip(prompts, out, strict=True)]
        logits.append(runner.forward([seq[-1] for seq in out], positions, []))
    return out, torch.stack(logits)


def test_smollm2_with_the_glue_batches_exactly_and_stays_within_tolerance(
    kernels: glue.Glue,
) -> None:
    torch.set_num_threads(1)
    loaded = load(config(dtype="bfloat16"))
    # One length: bf16 decode attention over spans of other lengths rounds otherwise
    # with or without the glue (docs/hf.md promises batched == alone in fp32).
    prompts = [list(range(300, 340)), list(range(500, 540)), list(range(900, 940))]
    with torch.inference_mode():
        fused = DecoderRunner(loaded.model, max_slots=4, max_context=256, glue=kernels)
        assert fused.glue is not None and "C glue" in fused.path
        assert fused.act is F.silu  # transformers' SiLU module: the glue's SiLU * up
        together, logits = _decode(fused, prompts, 12, None)
        alone = [_decode(fused, [p], 12, None)[0][0] for p in prompts]
        assert alone == together  # batch invariance
        plain = DecoderRunner(loaded.model, max_slots=4, max_context=256)
        _, reference = _decode(plain, prompts, 12, together)
    # The norm's fp32 sum order and SiLU's exponential are the differences: the
    # compiled-attention bounds.
    diff = (logits - reference).abs()
    assert float(diff.max()) < 2.0 and float(diff.mean()) < 0.25
    picked = logits.argmax(-1, keepdim=True)
    gap = reference.max(-1, keepdim=True).values - reference.gather(-1, picked)
    assert float(gap.max()) < 1.0  # where the two pick differently, it is a near tie


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma"])
def test_tiny_families_in_bf16_with_the_glue(
    kernels: glue.Glue, family: str, tmp_path: Path
) -> None:
    folder = tiny.build(family, tmp_path / family)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    prompts = [list(range(3, 30)), list(range(40, 51))]
    with torch.inference_mode():
        fused = DecoderRunner(model, max_slots=3, max_context=128, glue=kernels)
        plain = DecoderRunner(model, max_slots=3, max_context=128)
        # Gemma's offset norm rounds otherwise: that family keeps the framework ops.
        assert (fused.glue is None) == (family == "gemma")
        chunks = [PrefillChunk(slot=0, tokens=tuple(prompts[0]), start=0, want_logits=True)]
        prefilled = fused.forward([], [], chunks), plain.forward([], [], chunks)
        assert float((prefilled[0] - prefilled[1]).abs().max()) < 0.05
        if family == "gemma":  # only RoPE with the cache write in C: the same bits
            assert torch.equal(*prefilled)
        tokens, logits = _decode(fused, prompts, 8, None)
        _, reference = _decode(plain, prompts, 8, tokens)
        assert float((logits - reference).abs().max()) < 0.5


def test_batch_invariant_runner_gives_each_row_its_bits_alone(kernels: glue.Glue) -> None:
    """Mixed lengths, so the batch's decode spans reach past each short row's keys: with
    ``batch_invariant`` every logit equals the row's alone (without it, they need not)."""
    torch.set_num_threads(2)
    loaded = load(config(dtype="bfloat16"))
    prompts = [list(range(300, 340)), list(range(500, 517)), list(range(900, 960)), [7, 8, 9]]
    with torch.inference_mode():
        runner = DecoderRunner(
            loaded.model, max_slots=5, max_context=256, glue=kernels, batch_invariant=True
        )
        assert runner.attention.decode_impl == "invariant"
        together, logits = _decode(runner, prompts, 16, None)
        for row, prompt in enumerate(prompts):
            alone, alone_logits = _decode(runner, [prompt], 16, None)
            assert alone[0] == together[row]
            assert torch.equal(alone_logits[:, 0], logits[:, row])


def test_batch_invariant_decode_attention_honours_windows(kernels: glue.Glue) -> None:
    """A Mistral whose window is shorter than the prompt: the invariant kernel computes
    what the framework kernels compute (within bf16 attention tolerance)."""
    folder = tiny.build("mistral", Path(tempfile.mkdtemp()) / "mistral")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    prompts = [list(range(3, 3 + 3 * tiny.WINDOW)), list(range(40, 51))]
    with torch.inference_mode():
        invariant = DecoderRunner(
            model, max_slots=3, max_context=256, glue=kernels, batch_invariant=True
        )
        plain = DecoderRunner(model, max_slots=3, max_context=256, glue=kernels)
        tokens, logits = _decode(invariant, prompts, 8, None)
        _, reference = _decode(plain, prompts, 8, tokens)
    assert float((logits - reference).abs().max()) < 0.5


async def test_batch_invariant_engine_answers_alone_as_in_a_batch() -> None:
    prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village by the sea, there lived an old fisherman who",
        "1, 2, 3,",
        "Water boils at one hundred degrees Celsius, and ice melts at",
        "Hi",
    ]
    backend = HFBackend(
        config(dtype="bfloat16", batch_invariant=True, prefix_caching=False, threads=2)
    )
    await backend.start()
    try:

        async def run(prompt: str) -> str:
            return (await collect(backend.generate(completion(prompt, 24)))).text()

        alone = [await run(p) for p in prompts]
        together = await asyncio.gather(*(run(p) for p in prompts))
    finally:
        await backend.stop()
    assert together == alone


async def test_batch_invariant_without_the_glue_is_refused() -> None:
    backend = HFBackend(config(dtype="bfloat16", batch_invariant=True, glue_kernels=False))
    with pytest.raises(ModelLoadError, match="glue_kernels"):
        await backend.start()
