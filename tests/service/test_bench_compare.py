"""The comparison driver end to end with subprocess fakes: start, alternate, record, stop."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import yaml

from bench.cli import main

_REF = (
    "import json, sys\n"
    "n, out = int(sys.argv[1]), sys.argv[2]\n"
    "s = [dict(index=i, prompt_index=i, ok=True, status=200, start=i * 0.1, e2e=0.1,\n"
    "          ttft=0.02, chunk_times=[0.02, 0.04, 0.06, 0.08], output_tokens=4,\n"
    "          prompt_tokens=5, tokens_from_usage=True) for i in range(n)]\n"
    "json.dump(dict(samples=s, wall_s=n * 0.1, cpu_s=0.05), open(out, 'w'))\n"
)


def _fake(tag: str) -> list[str]:
    return [
        sys.executable, "-m", "bench.fake_upstream", "--port", "{port}", "--model", "fake",
        "--chunks", "100000", "--delay-ms", "1", "--ttft-ms", "1", "--tag", tag,
    ]  # fmt: skip


def _running_with(tag: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_compare_alternates_systems_and_cleans_up(tmp_path: Path) -> None:
    tag = f"bench-test-{uuid.uuid4().hex}"
    spec = {
        "title": "fake compare",
        "model": "fake",
        "max_tokens": 4,
        "concurrency": [1, 2],
        "streams": [True, False],
        "min_requests": 3,
        "requests_per_concurrency": 1,
        "warmup": 1,
        "timeout_s": 20,
        "baseline": "direct",
        "slo_ttft_ms": 10000,
        "services": [
            {"name": "up", "command": _fake(tag), "health_url": "http://127.0.0.1:{port}/v1/models"}
        ],
        "systems": [
            {"label": "direct", "base_url": "http://127.0.0.1:{port_up}/v1", "cpu_of": "up"},
            {"label": "started", "command": _fake(tag), "base_url": "http://127.0.0.1:{port}/v1"},
            {
                "label": "ref",
                "kind": "reference",
                "command": [sys.executable, "-c", _REF, "{num_requests}", "{out}"],
            },
        ],
    }
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    code = main(
        ["compare", "--spec", str(spec_path), "--out", str(out), "--workdir", str(tmp_path / "w")]
    )
    assert code == 0
    assert _running_with(tag) == []  # service and system stopped, process groups gone
    doc = json.loads((out / "results.json").read_text())
    order = [(r["system"], r["load"], r["stream"]) for r in doc["runs"]]
    assert order == [
        ("direct", "c=1", True), ("started", "c=1", True), ("ref", "c=1", True),
        ("direct", "c=1", False), ("started", "c=1", False),
        # the order rotates by one system per level; the reference runs at c=1 only
        ("started", "c=2", True), ("direct", "c=2", True),
        ("started", "c=2", False), ("direct", "c=2", False),
    ]  # fmt: skip
    for run in doc["runs"]:
        s = run["summary"]
        assert s["errors"] == 0 and s["ok"] == 3
        assert s["output_tokens"] == 12 and s["goodput_fraction"] == 1.0
        if run["system"] in ("started", "direct"):  # its own group; the service's (cpu_of)
            assert run["server_cpu_ms_per_request"] is not None
        if run["system"] == "ref":
            assert abs(s["output_tokens_per_s"] - 40.0) < 1e-6
            assert abs(run["server_cpu_ms_per_request"] - 50 / 3) < 1e-6
            assert s["itl_ms"]["count"] == 9
    assert doc["meta"]["failed"] == {}
    assert set(doc["meta"]["startup_s"]) == {"direct", "started", "ref"}
    md = (out / "results.md").read_text()
    assert "## Overhead against `direct`" in md and "| started | c=2 | no |" in md
    assert (out / "results.png").stat().st_size > 10_000


def test_rounds_interleave_and_pool(tmp_path: Path) -> None:
    """Two rounds: each system measured twice, its record pools both rounds' requests and
    keeps both rounds' CPU, the median first."""
    tag = f"bench-test-{uuid.uuid4().hex}"
    spec = {
        "model": "fake",
        "max_tokens": 4,
        "concurrency": [1],
        "min_requests": 3,
        "warmup": 1,
        "rounds": 2,
        "timeout_s": 20,
        "systems": [
            {"label": "a", "command": _fake(tag), "base_url": "http://127.0.0.1:{port}/v1"},
            {"label": "b", "command": _fake(tag), "base_url": "http://127.0.0.1:{port}/v1"},
        ],
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp_path / "out"
    assert main(["compare", "--spec", str(spec_path), "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert [run["system"] for run in doc["runs"]] == ["a", "b"]
    for run in doc["runs"]:
        assert run["summary"]["ok"] == 6 and run["summary"]["output_tokens"] == 24
        assert len([s for s in run["samples"] if s["warmup"]]) == 2  # one per round
        rounds = run["server_cpu_rounds"]
        assert len(rounds) == 2
        assert run["server_cpu_ms_per_request"] == sum(rounds) / 2  # the median of two
    assert _running_with(tag) == []


def test_a_system_that_cannot_start_is_reported(tmp_path: Path) -> None:
    spec = {
        "model": "fake",
        "max_tokens": 2,
        "concurrency": [1],
        "min_requests": 1,
        "warmup": 0,
        "systems": [
            {
                "label": "dies",
                "command": [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"],
                "base_url": "http://127.0.0.1:{port}/v1",
            }
        ],
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    code = main(["compare", "--spec", str(spec_path), "--out", str(tmp_path / "out")])
    assert code == 1
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert "exited with 3" in doc["meta"]["failed"]["dies"]
    assert "bad flag" in doc["meta"]["failed"]["dies"]
    assert doc["runs"] == []
