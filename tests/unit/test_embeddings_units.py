"""Pure pieces of the embedding path: pooling config and arithmetic, the packaged-zip
source, and parsing an upstream's embeddings answer."""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.base import InvalidRequest, Overloaded, UpstreamBadResponse, UpstreamTimeout
from backends.embeddings import EmbeddingRequest
from backends.hf.embedding.pooling import (
    PoolingConfigError,
    PoolingSpec,
    finish_vectors,
    pool,
    read_pooling_spec,
)
from backends.hf.loading.model_source import ModelSourceError, unpack_zip
from backends.openai_proxy.embeddings import parse_embeddings


def st_folder(tmp_path: Path, pooling: dict[str, object], normalize: bool = True) -> Path:
    modules = [
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    return tmp_path


def test_pooling_spec_from_sentence_transformers_files(tmp_path: Path) -> None:
    spec = read_pooling_spec(st_folder(tmp_path, {"pooling_mode_cls_token": True}, False))
    assert spec == PoolingSpec(mode="cls", normalize=False, max_seq_length=128)
    named = tmp_path / "named"
    named.mkdir()
    assert read_pooling_spec(st_folder(named, {"pooling_mode": "lasttoken"})).mode == "lasttoken"
    bare = tmp_path / "bare"
    bare.mkdir()
    assert read_pooling_spec(bare) == PoolingSpec(mode="mean", normalize=True)
    two = tmp_path / "two"
    two.mkdir()
    both = {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}
    with pytest.raises(PoolingConfigError):
        read_pooling_spec(st_folder(two, both))


def test_pool_modes_ignore_padding() -> None:
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 6.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0]]
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 4.0]]
    assert pool(hidden, mask, "max").tolist() == [[3.0, 6.0]]
    assert pool(hidden, mask, "lasttoken").tolist() == [[3.0, 6.0]]
    assert torch.allclose(pool(hidden, mask, "mean_sqrt_len"), torch.tensor([[4.0, 8.0]]) / 2**0.5)


def test_dimensions_cut_then_renormalise() -> None:
    vectors = torch.tensor([[3.0, 4.0, 12.0]])
    cut = finish_vectors(vectors, normalize=True, dimensions=2)
    assert torch.allclose(cut, torch.tensor([[0.6, 0.8]]))
    assert finish_vectors(vectors, normalize=False, dimensions=2).tolist() == [[3.0, 4.0]]


def test_unpack_zip_once_and_refuse_escapes(tmp_path: Path) -> None:
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("config.json", "{}")
        bundle.writestr("1_Pooling/config.json", "{}")
    cache = tmp_path / "cache"
    first = unpack_zip(archive, "pkg", cache)
    assert (first / "1_Pooling" / "config.json").is_file()
    (first / "marker").write_text("kept")
    assert unpack_zip(archive, "pkg", cache) == first and (first / "marker").is_file()
    hostile = tmp_path / "hostile.zip"
    with zipfile.ZipFile(hostile, "w") as bundle:
        bundle.writestr("config.json", "{}")
        bundle.writestr("../outside.txt", "x")
    with pytest.raises(ModelSourceError, match="escapes"):
        unpack_zip(hostile, "bad", cache)
    assert not (cache / "outside.txt").exists() and not (tmp_path / "outside.txt").exists()


def test_parse_upstream_embeddings() -> None:
    payload = {
        "data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": [1.0]}],
        "usage": {"prompt_tokens": 7},
    }
    assert parse_embeddings(payload, 2) == (((1.0,), (2.0,)), 7)
    assert parse_embeddings({"data": payload["data"]}, 2)[1] is None
    with pytest.raises(UpstreamBadResponse):
        parse_embeddings(payload, 3)
    with pytest.raises(UpstreamBadResponse):
        parse_embeddings({"data": [{"embedding": "abc"}]}, 1)


def idle_backend(max_queue: int) -> tuple[Any, Any]:
    """An hf embedding backend around an engine whose thread has not started."""
    from backends.hf.embedding.backend import HFEmbeddingBackend, PoolingEngine, _Loaded
    from config.schema import HFModelConfig

    loaded = _Loaded(
        model=None,
        tokenizer=None,
        spec=PoolingSpec(mode="mean", normalize=True),
        device="cpu",
        dtype=torch.float32,
        width=4,
        max_length=8,
        vocab_size=10,
        memory_bytes=0,
    )
    backend = HFEmbeddingBackend(
        HFModelConfig(name="e", backend="hf", task="embed", source="x", max_queue=max_queue)
    )
    engine = PoolingEngine(loaded, max_batch=2, max_queue=max_queue, threads=1)
    backend._loaded, backend._engine = loaded, engine
    return backend, engine


async def test_full_inbox_is_429_and_timeout_cancels_the_job() -> None:
    backend, engine = idle_backend(max_queue=1)
    request = EmbeddingRequest(request_id="r", model="e", texts=("a",), timeout=0.05)
    with pytest.raises(UpstreamTimeout):
        await backend.embed(request)  # nobody serves the inbox
    job = engine.inbox.get_nowait()
    assert job.future.cancelled()
    engine.inbox.put_nowait(job)
    with pytest.raises(Overloaded):
        await backend.embed(request)
    for bad, param in ((replace(request, dimensions=5), "dimensions"),
                       (replace(request, texts=(), token_ids=((10,),)), "input")):  # fmt: skip
        with pytest.raises(InvalidRequest) as caught:
            await backend.embed(bad)
        assert caught.value.param == param


def test_engine_skips_cancelled_jobs() -> None:
    _, engine = idle_backend(max_queue=4)
    from backends.hf.embedding.backend import _Job

    job = _Job(queued_at=0.0, texts=("a",), token_ids=(), dimensions=None)
    job.future.cancel()
    engine.inbox.put_nowait(job)
    engine.start()
    engine.request_stop()
    engine.thread.join(10)
    # Computing it would have failed (there is no model) and set an exception instead.
    assert not engine.thread.is_alive() and job.future.cancelled()
