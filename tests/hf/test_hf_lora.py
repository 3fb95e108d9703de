"""LoRA adapters in the hf engine (tiny random-weight models, fp32): each adapter's greedy
text equals PEFT's merged model through transformers' ``generate()``; requests for two
adapters and the bare base share one step and answer as they do alone; what the engine
cannot serve exactly is refused at load, naming the reason.

The adapters are made here with PEFT on the tiny model, with random ``A`` *and* ``B``
(PEFT starts ``B`` at zero, which would make every adapter the base model): the test
first checks that each one's text differs from the base's and from the other's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from backends.base import AdapterSpec, InvalidRequest
from backends.hf.backend import HFBackend
from backends.hf.loading.loader import ModelLoadError
from tests.hf import tiny
from tests.hf.helpers import RecordingObserver, collect, completion, config
from tests.tools.lora_adapters import random_adapter

pytest.importorskip("peft")

PROMPTS = [
    "The capital of France is Paris, and the",
    "def fibonacci(n): return",
    "Once upon a time, in a small village by the sea, there lived an old fisherman. "
    "The quick brown fox",
]
TOKENS = 10
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FUSED = {"phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]}


def make_adapter(
    base: Path, out: Path, targets: list[str], rank: int, seed: int, **extra: Any
) -> Path:
    return random_adapter(
        base, out, targets, rank=rank, seed=seed, scale=0.3, dtype="float32", **extra
    )


def merged_reference(base: Path, adapter: Path, prompt: str) -> str:
    """PEFT's merged model (``merge_and_unload``) through transformers' ``generate()``."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.float32, attn_implementation="eager"
    )
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = merged.generate(ids, max_new_tokens=TOKENS, do_sample=False)
    prompt_text = tok.decode(ids[0], skip_special_tokens=True)
    return str(tok.decode(out[0], skip_special_tokens=True))[len(prompt_text) :]


def adapters_config(folder: Path, adapters: dict[str, Path], **overrides: Any) -> Any:
    entries = [{"name": name, "source": str(path)} for name, path in adapters.items()]
    return config(source=str(folder), max_num_seqs=12, adapters=entries, **overrides)


@pytest.mark.parametrize("family", ["llama", "phi3"])
async def test_each_adapter_equals_peft_merged_and_mixed_steps_equal_alone(
    family: str, tmp_path: Path
) -> None:
    folder = tiny.build(family, tmp_path / family)
    targets = FUSED.get(family, ALL)
    adapters = {
        "wide": make_adapter(folder, tmp_path / "wide", targets, rank=4, seed=1),
        # three ranks (4, 2, 8: the smaller padded into the bank's rank-8 blocks), on all
        # projections, on the first two, on the MLP's last two; one with rsLoRA's scaling
        "narrow": make_adapter(
            folder, tmp_path / "narrow", targets[:2], rank=2, seed=2, use_rslora=True
        ),
        "mlp": make_adapter(folder, tmp_path / "mlp", targets[-2:], rank=8, seed=10),
    }
    expected = {
        name: [merged_reference(folder, path, p) for p in PROMPTS]
        for name, path in adapters.items()
    }
    expected[""] = [tiny.reference(folder, p, TOKENS) for p in PROMPTS]
    # The adapters really change the model, and differently.
    assert len({tuple(texts) for texts in expected.values()}) == 4

    observer = RecordingObserver()
    backend = HFBackend(adapters_config(folder, adapters), observer)
    await backend.start()
    try:
        assert "LoRA adapters: wide, narrow, mlp (rank 8)" in backend.info().extra["runner"]

        async def run(adapter: str, prompt: str) -> str:
            request = replace(completion(prompt, TOKENS), adapter=adapter or None)
            return (await collect(backend.generate(request))).text()

        alone = {name: [await run(name, p) for p in PROMPTS] for name in expected}
        assert alone == expected
        pairs = [(name, p) for name in expected for p in PROMPTS]
        together = await asyncio.gather(*(run(name, p) for name, p in pairs))
        assert dict(zip(pairs, together, strict=True)) == {
            (name, p): expected[name][i] for name in expected for i, p in enumerate(PROMPTS)
        }
        assert max(size for size, _, _ in observer.steps) > len(PROMPTS)  # mixed steps
    finally:
        await backend.stop()


async def test_adapters_share_no_cached_prefix_with_the_base(tmp_path: Path) -> None:
    """The same prompt under the base and under an adapter: the prefix cache keys each
    by its adapter, so neither reuses the other's keys and values."""
    folder = tiny.build("llama", tmp_path / "llama")
    adapter = make_adapter(folder, tmp_path / "a", ALL, rank=4, seed=3)
    prompt = PROMPTS[2] * 2
    expected = merged_reference(folder, adapter, prompt)
    observer = RecordingObserver()
    backend = HFBackend(adapters_config(folder, {"a": adapter}), observer)
    await backend.start()
    try:
        base = (await collect(backend.generate(completion(prompt, TOKENS)))).text()
        assert base == tiny.reference(folder, prompt, TOKENS)
        request = replace(completion(prompt, TOKENS), adapter="a")
        assert (await collect(backend.generate(request))).text() == expected
        assert observer.prefix[-1][1] == 0  # nothing restored from the base's blocks
        assert (await collect(backend.generate(request))).text() == expected
        assert observer.prefix[-1][1] >= 32  # its own blocks, the second time
    finally:
        await backend.stop()


async def test_adapters_over_quantized_weights(tmp_path: Path) -> None:
    """Over int8 weights the adapter still changes the answer, and a mixed step answers
    as each request alone (no reference: PEFT merges into float weights)."""
    folder = tiny.build("llama", tmp_path / "llama")
    adapter = make_adapter(folder, tmp_path / "a", ALL, rank=4, seed=8)
    backend = HFBackend(adapters_config(folder, {"a": adapter}, quantization="int8"), None)
    await backend.start()
    try:

        async def run(name: str | None, prompt: str) -> str:
            request = replace(completion(prompt, TOKENS), adapter=name)
            return (await collect(backend.generate(request))).text()

        pairs = [(name, p) for name in (None, "a") for p in PROMPTS]
        alone = [await run(name, p) for name, p in pairs]
        assert alone[: len(PROMPTS)] != alone[len(PROMPTS) :]
        assert list(await asyncio.gather(*(run(name, p) for name, p in pairs))) == alone
    finally:
        await backend.stop()


async def test_what_is_not_plain_lora_is_refused_at_load(tmp_path: Path) -> None:
    folder = tiny.build("llama", tmp_path / "llama")
    dora = make_adapter(folder, tmp_path / "dora", ["q_proj"], rank=2, seed=4, use_dora=True)
    backend = HFBackend(adapters_config(folder, {"d": dora}), None)
    with pytest.raises(ModelLoadError, match="DoRA"):
        await backend.start()

    big = make_adapter(folder, tmp_path / "big", ["q_proj"], rank=8, seed=5)
    backend = HFBackend(adapters_config(folder, {"b": big}, max_lora_rank=4), None)
    with pytest.raises(ModelLoadError, match="rank 8, above max_lora_rank"):
        await backend.start()

    head = make_adapter(folder, tmp_path / "head", ["q_proj", "lm_head"], rank=2, seed=6)
    backend = HFBackend(adapters_config(folder, {"h": head}), None)
    with pytest.raises(ModelLoadError, match="lm_head"):
        await backend.start()

    settings = json.loads((big / "adapter_config.json").read_text())
    assert settings["r"] == 8


async def test_an_adapter_is_a_model_of_its_own_through_the_api(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the gateway: ``/v1/models`` lists the adapter with its ``parent``, a
    request naming it (or its alias) is answered by the base model with the adapter and
    shows the adapter's name (the request log says which), the base still answers as
    itself, and a key's allow-list may name the adapter alone."""
    import httpx

    from config.schema import AppConfig
    from gateway.app import build_app

    folder = tiny.build("llama", tmp_path / "llama")
    adapter = make_adapter(folder, tmp_path / "a", ALL, rank=4, seed=7)
    prompt = PROMPTS[0]
    model = {
        "name": "tiny", "backend": "hf", "source": str(folder), "dtype": "float32",
        "device": "cpu", "threads": 1,
        "adapters": [{"name": "tiny-poet", "source": str(adapter), "aliases": ["poet"]}],
    }  # fmt: skip
    # One key may use only the adapter; another the base model, which grants its adapters.
    auth = {
        "required": True,
        "keys": [
            {"name": "poets", "key": "sk-poets-0123456789", "models": ["tiny-poet"]},
            {"name": "team", "key": "sk-team-0123456789", "models": ["tiny"]},
        ],
    }
    config = AppConfig.model_validate({"models": [model], "auth": auth})
    app = build_app(config, admin_key="adm-0123456789")
    lifespan = app.lifespan()
    await lifespan.__aenter__()
    try:
        await app.state.registry.start()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://t",
            headers={"authorization": "Bearer sk-team-0123456789"},
        ) as http:
            poets = {"authorization": "Bearer sk-poets-0123456789"}
            listed = (await http.get("/v1/models", headers=poets)).json()["data"]
            assert [c["id"] for c in listed] == ["tiny-poet"]
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 2}
            refused = await http.post("/v1/completions", json=body, headers=poets)
            assert refused.status_code == 404
            body["model"] = "poet"
            assert (await http.post("/v1/completions", json=body, headers=poets)).status_code == 200
            admin = {"authorization": "Bearer adm-0123456789"}
            (status,) = (await http.get("/admin/models", headers=admin)).json()["models"]
            assert status["adapters"] == [{"name": "tiny-poet", "aliases": ["poet"]}]
            cards = (await http.get("/v1/models")).json()["data"]
            assert [(c["id"], c.get("parent")) for c in cards] == [
                ("tiny", None),
                ("tiny-poet", "tiny"),
            ]
            assert (await http.get("/v1/models/poet")).json()["id"] == "tiny-poet"

            async def complete(name: str) -> dict[str, Any]:
                body = {"model": name, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0}
                reply = await http.post("/v1/completions", json=body)
                assert reply.status_code == 200, reply.text
                return dict(reply.json())

            for name in ("tiny-poet", "poet"):
                with caplog.at_level(logging.INFO, logger="llmso.requests"):
                    answer = await complete(name)
                finished = [
                    json.loads(r.getMessage())
                    for r in caplog.records
                    if "request_finished" in r.getMessage()
                ]
                assert (finished[-1]["model"], finished[-1]["adapter"]) == ("tiny", "tiny-poet")
                assert answer["model"] == "tiny-poet"
                assert answer["choices"][0]["text"] == merged_reference(folder, adapter, prompt)
            base = await complete("tiny")
            assert base["model"] == "tiny"
            assert base["choices"][0]["text"] == tiny.reference(folder, prompt, TOKENS)
    finally:
        await lifespan.__aexit__(None, None, None)


async def test_adapters_under_process_isolation(tmp_path: Path) -> None:
    """``isolation: process``: the request's adapter crosses to the worker, which
    answers as PEFT's merged model, and the base as itself."""
    from prometheus_client import CollectorRegistry

    from backends.hop_metrics import BackendMetrics
    from backends.process.backend import ProcessBackend
    from tests.tools.servers import WORKER_ENV

    folder = tiny.build("llama", tmp_path / "llama")
    adapter = make_adapter(folder, tmp_path / "a", ALL, rank=4, seed=9)
    prompt = PROMPTS[1]
    settings = adapters_config(folder, {"a": adapter}, isolation="process", load_timeout=300)
    backend = ProcessBackend(settings, BackendMetrics(CollectorRegistry()), env=WORKER_ENV)
    await backend.start()
    try:
        request = replace(completion(prompt, TOKENS), adapter="a")
        assert (await collect(backend.generate(request))).text() == merged_reference(
            folder, adapter, prompt
        )
        base = (await collect(backend.generate(completion(prompt, TOKENS)))).text()
        assert base == tiny.reference(folder, prompt, TOKENS)
        # Registered at run time, in the worker.
        other = make_adapter(folder, tmp_path / "b", ALL, rank=2, seed=19)
        await backend.add_adapter(AdapterSpec("b", str(other)))
        request = replace(completion(prompt, TOKENS), adapter="b")
        assert (await collect(backend.generate(request))).text() == merged_reference(
            folder, other, prompt
        )
        with pytest.raises(InvalidRequest):
            await backend.add_adapter(AdapterSpec("c", str(tmp_path)))
    finally:
        await backend.stop()


async def test_more_adapters_than_slots_load_on_demand_and_evict_the_least_recent(
    tmp_path: Path,
) -> None:
    """Three adapters, two slots: a request for one that is not resident loads it in
    place of the least recently used, every answer stays the merged model's, and a load
    that finds both slots serving running requests is refused (429), not queued."""
    from backends.base import Overloaded

    folder = tiny.build("llama", tmp_path / "llama")
    adapters = {
        name: make_adapter(folder, tmp_path / name, ALL, rank=rank, seed=seed)
        for name, rank, seed in (("a", 4, 21), ("b", 2, 22), ("c", 8, 23))
    }
    prompt = PROMPTS[0]
    expected = {name: merged_reference(folder, path, prompt) for name, path in adapters.items()}
    assert len(set(expected.values())) == 3
    backend = HFBackend(adapters_config(folder, adapters, max_loras=2))
    await backend.start()
    pool = backend._parts.adapters if backend._parts is not None else None
    assert pool is not None
    try:
        assert pool.resident() == ("a", "b")

        async def run(adapter: str, tokens: int = TOKENS) -> str:
            request = replace(completion(prompt, tokens), adapter=adapter)
            return (await collect(backend.generate(request))).text()

        for name in ("c", "a", "b", "c", "c", "a"):
            assert await run(name) == expected[name]
        # c evicted a (least recent), a evicted b, b evicted c, c evicted a, a evicted b
        assert (pool.loads, pool.evictions) == (5, 5)
        assert pool.resident() == ("c", "a")

        # Two streams hold both slots: the third adapter cannot load now.
        streams = [
            backend.generate(replace(completion(prompt, 400), adapter=name)) for name in "ca"
        ]
        for stream in streams:
            await anext(stream)
        with pytest.raises(Overloaded, match="max_loras"):
            await run("b")
        for stream in streams:
            await stream.aclose()  # type: ignore[attr-defined]
        assert await run("b") == expected["b"]
    finally:
        await backend.stop()


async def test_adapters_registered_at_run_time_through_the_admin_api(tmp_path: Path) -> None:
    """A model with ``enable_lora`` and no adapters: ``POST /admin/models/{base}/adapters``
    registers one (listed with its parent, answering as PEFT's merged model), a broken
    folder or a taken name is a 400 naming the field, ``DELETE`` unregisters it (its name
    is then unknown), and vLLM's ``/v1/load_lora_adapter`` / ``unload`` shapes do the same
    behind the admin key."""
    import httpx

    from config.schema import AppConfig
    from gateway.app import build_app

    folder = tiny.build("llama", tmp_path / "llama")
    adapter = make_adapter(folder, tmp_path / "a", ALL, rank=4, seed=31)
    prompt = PROMPTS[1]
    model = {
        "name": "tiny", "backend": "hf", "source": str(folder), "dtype": "float32",
        "device": "cpu", "threads": 1, "enable_lora": True, "max_lora_rank": 8,
    }  # fmt: skip
    app = build_app(AppConfig.model_validate({"models": [model]}), admin_key="adm-0123456789")
    lifespan = app.lifespan()
    await lifespan.__aenter__()
    try:
        await app.state.registry.start()
        admin = {"authorization": "Bearer adm-0123456789"}
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=admin
        ) as http:

            async def complete(name: str) -> httpx.Response:
                body = {"model": name, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0}
                return await http.post("/v1/completions", json=body)

            register = {"name": "tiny-a", "source": str(adapter), "aliases": ["a"]}
            wrong = {"authorization": "Bearer not-the-admin-key"}
            refused = await http.post("/admin/models/tiny/adapters", json=register, headers=wrong)
            assert refused.status_code == 401
            added = await http.post("/admin/models/tiny/adapters", json=register)
            assert added.status_code == 200, added.text
            assert added.json()["adapters"] == [{"name": "tiny-a", "aliases": ["a"]}]
            cards = (await http.get("/v1/models")).json()["data"]
            assert [(c["id"], c.get("parent")) for c in cards] == [
                ("tiny", None),
                ("tiny-a", "tiny"),
            ]
            answer = await complete("a")
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == "tiny-a"
            assert answer.json()["choices"][0]["text"] == merged_reference(folder, adapter, prompt)
            metrics = (await http.get("/metrics")).text
            assert 'llmso_adapter_requests_total{adapter="tiny-a",model="tiny",status="ok"}' in (
                metrics
            )

            for body, param in (
                ({"name": "tiny-b", "source": str(tmp_path)}, "source"),  # not a PEFT folder
                ({"name": "tiny", "source": str(adapter)}, "name"),  # the base's own name
                ({"name": "x", "source": str(adapter), "rank": 2}, "rank"),  # unknown field
            ):
                bad = await http.post("/admin/models/tiny/adapters", json=body)
                assert bad.status_code == 400, bad.text
                assert bad.json()["error"]["param"] == param

            assert (await http.delete("/admin/models/tiny/adapters/tiny-a")).status_code == 200
            assert (await complete("tiny-a")).status_code == 404
            gone = await http.delete("/admin/models/tiny/adapters/tiny-a")
            assert gone.status_code == 404

            load = {"lora_name": "tiny-v", "lora_path": str(adapter)}
            loaded = await http.post("/v1/load_lora_adapter", json=load)
            assert loaded.status_code == 200, loaded.text
            assert (await complete("tiny-v")).json()["choices"][0]["text"] == (
                answer.json()["choices"][0]["text"]
            )
            unload = await http.post("/v1/unload_lora_adapter", json={"lora_name": "tiny-v"})
            assert unload.status_code == 200, unload.text
            assert (await complete("tiny-v")).status_code == 404
            base = await complete("tiny")
            assert base.json()["choices"][0]["text"] == tiny.reference(folder, prompt, TOKENS)
    finally:
        await lifespan.__aexit__(None, None, None)
