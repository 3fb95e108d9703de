"""bench.random_weights: a config + tokenizer folder becomes a model folder with seeded
random weights, marked as such."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from bench.gpu_suite import gpu_models_suite
from bench.random_weights import MARKER, build, random_weights_note
from tests.hf import tiny


def _weights(folder: Path) -> dict[str, object]:
    return dict(load_file(str(folder / "model.safetensors")))


def test_random_weights_are_seeded_marked_and_never_the_source_weights(tmp_path: Path) -> None:
    source = tiny.build("llama", tmp_path / "trained", seed=7)
    first = build(source, tmp_path / "a", seed=0, dtype="float32")
    second = build(source, tmp_path / "b", seed=0, dtype="float32")
    other = build(source, tmp_path / "c", seed=1, dtype="float32")
    a, b, c, src = _weights(first), _weights(second), _weights(other), _weights(source)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert a[name].equal(b[name])  # type: ignore[attr-defined]
    assert not a[name].equal(c[name])  # type: ignore[attr-defined]
    assert not a[name].equal(src[name])  # type: ignore[attr-defined]
    assert (first / MARKER).is_file() and (first / "tokenizer.json").is_file()
    assert not (first / "tokenizer.json").is_symlink()
    note = random_weights_note(str(first))
    assert note is not None and "RANDOM (seed 0, float32)" in note and "trained" in note
    assert random_weights_note(str(source)) is None


def test_a_built_folder_is_reused_and_a_new_seed_rebuilds_it(tmp_path: Path) -> None:
    source = tiny.build("llama", tmp_path / "trained")
    out = build(source, tmp_path / "out", seed=0, dtype="float32")
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert build(source, out, seed=0, dtype="float32") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    build(source, out, seed=3, dtype="float32")
    assert '"seed": 3' in (out / MARKER).read_text()


def test_the_gpu_suite_notes_say_the_weights_are_random(tmp_path: Path) -> None:
    source = tiny.build("llama", tmp_path / "trained")
    folder = build(source, tmp_path / "random", seed=0, dtype="float32")
    spec = gpu_models_suite(tmp_path, str(folder), include_vllm=False)
    assert any(note.startswith("weights: RANDOM (seed 0, float32)") for note in spec.notes)
    assert "(random weights)" in spec.title
