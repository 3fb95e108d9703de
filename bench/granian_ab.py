"""A/B: gateway CPU per streamed request under ``llmso serve`` (uvicorn) and granian.

Starts ``bench.fake_upstream --chunks 16`` once, then per round and server: a gateway on
it (``llmso serve``, or granian serving ``bench.granian_probe:app``), one request checked
against the upstream's own answer, a warm-up, then per concurrency level ``--n`` streamed
requests by ``python -m bench run`` with the CPU of the gateway's whole process group
(granian runs a worker process) read from ``/proc`` around them. Servers alternate within
each round (A/B/A/B). Measure on an otherwise idle machine::

    python -m bench.granian_ab --granian-path DIR --rounds 3 --n 3000 --c 1,16 \\
        --servers uvicorn,granian-st [--out DIR]

Servers: ``uvicorn`` and ``granian-<mode>[-rust][-rloop|-asyncio][-rb<N>]``, e.g.
``granian-st-rust-rb1``: runtime mode st/mt, the rust task implementation, the event loop
(default uvloop), the runtime's I/O blocking threads (default granian's).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.granian_probe import granian_args
from bench.procstat import group_context_switches, group_cpu_split
from bench.systems import free_port


@dataclass(frozen=True)
class GroupCpu:
    """User and system seconds (reaped children included) and context switches of a
    process group."""

    user: float
    system: float
    switches: int


def group_cpu(pgid: int) -> GroupCpu:
    user, system = group_cpu_split(pgid) or (0.0, 0.0)
    return GroupCpu(user, system, group_context_switches(pgid))


def _wait(url: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                r.read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"not up: {url}")


def _stream_text(base: str) -> tuple[str, str | None]:
    """One streamed chat completion: the concatenated content and the finish reason."""
    body = json.dumps(
        {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", body, {"content-type": "application/json"}
    )
    text, finish, done = [], None, False
    with urllib.request.urlopen(request, timeout=10) as r:
        for raw in r:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                for choice in json.loads(line[6:]).get("choices", ()):
                    text.append(choice.get("delta", {}).get("content") or "")
                    finish = choice.get("finish_reason") or finish
    if not done:
        raise SystemExit(f"{base}: stream ended without [DONE]")
    return "".join(text), finish


def _server_argv(name: str, python: str, port: int, config: Path) -> list[str]:
    if name == "uvicorn":
        return [python, "-m", "gateway.cli", "serve", "--config", str(config)]
    parts = name.split("-")
    if parts[0] != "granian" or len(parts) < 2 or parts[1] not in ("st", "mt"):
        raise SystemExit(f"unknown server {name!r}")
    options = parts[2:]
    args = granian_args(
        port,
        runtime_mode=parts[1],
        task_impl="rust" if "rust" in options else "asyncio",
        loop=next((p for p in options if p in ("asyncio", "rloop")), "uvloop"),
        runtime_blocking_threads=next((int(p[2:]) for p in options if p.startswith("rb")), None),
    )
    return [python, "-m", "granian", *args]


def _config(work: Path, port: int, upstream: int) -> Path:
    path = work / "gw.yaml"
    path.write_text(
        f"server:\n  host: 127.0.0.1\n  port: {port}\nmodels:\n  - name: fake\n"
        f"    backend: openai\n    base_url: http://127.0.0.1:{upstream}/v1\n"
        "    upstream_model: fake\n    max_concurrency: 1024\n"
    )
    return path


def _bench(env: dict[str, str], port: int, *, c: int, n: int, out: Path) -> Any:
    """``python -m bench run`` at concurrency ``c``: its results' summary."""
    subprocess.run(
        [
            *(sys.executable, "-m", "bench", "run", "--base-url", f"http://127.0.0.1:{port}/v1"),
            *("--model", "fake", "--concurrency", str(c), "--num-requests", str(n)),
            *("--max-tokens", "16", "--warmup", "0", "--stream", "--out", str(out)),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    return json.loads((out / "results.json").read_text())["runs"][0]["summary"]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _round(
    args: argparse.Namespace, env: dict[str, str], upstream: subprocess.Popen[bytes], r: int
) -> list[dict[str, Any]]:
    rows = []
    expected = _stream_text(f"http://127.0.0.1:{args.upstream_port}")
    for name in args.servers.split(","):
        port = free_port()
        work = Path(tempfile.mkdtemp(prefix="granian-ab-"))
        config = _config(work, port, args.upstream_port)
        server_env = dict(env, LLMSO_CONFIG=str(config), PYTHONPATH=args.pythonpath)
        with (work / "server.log").open("wb") as log:
            server = subprocess.Popen(
                _server_argv(name, sys.executable, port, config),
                env=server_env,
                stdout=log,
                stderr=log,
                start_new_session=True,  # its own process group: granian's worker included
            )
        try:
            _wait(f"http://127.0.0.1:{port}/ready")
            got = _stream_text(f"http://127.0.0.1:{port}")
            if got != expected:
                raise SystemExit(f"{name}: answered {got!r}, upstream {expected!r}")
            for c in args.c:
                _bench(env, port, c=c, n=args.warmup, out=work / f"warm{c}")
                g0, u0 = group_cpu(server.pid), group_cpu(upstream.pid)
                summary = _bench(env, port, c=c, n=args.n, out=work / f"c{c}")
                g1, u1 = group_cpu(server.pid), group_cpu(upstream.pid)
                n = summary["requests"]
                row = {
                    "round": r,
                    "server": name,
                    "c": c,
                    "ms_per_req": (g1.user + g1.system - g0.user - g0.system) * 1000 / n,
                    "user_ms": (g1.user - g0.user) * 1000 / n,
                    "sys_ms": (g1.system - g0.system) * 1000 / n,
                    "switches_per_req": (g1.switches - g0.switches) / n,
                    "upstream_ms": (u1.user + u1.system - u0.user - u0.system) * 1000 / n,
                    "ttft_p50_ms": summary["ttft_ms"]["p50"],
                    "ok": summary["ok"],
                    "n": n,
                    "tokens_per_req": summary["output_tokens"] / n,
                }
                rows.append(row)
                print(
                    f"round {r} c={c:<2} {name:<16} {row['ms_per_req']:.3f} ms/req "
                    f"(user {row['user_ms']:.3f} sys {row['sys_ms']:.3f}) "
                    f"ctx {row['switches_per_req']:.2f} upstream {row['upstream_ms']:.3f} "
                    f"ttft p50 {row['ttft_p50_ms']:.2f} ms ok {row['ok']}/{n} "
                    f"tok/req {row['tokens_per_req']:.1f}",
                    flush=True,
                )
        finally:
            _stop(server)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--granian-path", required=True, help="Folder granian is installed in.")
    parser.add_argument("--servers", default="uvicorn,granian-st")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--c", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    parser.add_argument("--out", type=Path, default=None, help="Write rows.json here.")
    args = parser.parse_args(argv)
    root = str(Path(__file__).resolve().parent.parent)
    args.pythonpath = f"{root}{os.pathsep}{args.granian_path}"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=root)
    args.upstream_port = free_port()
    upstream = subprocess.Popen(
        [
            *(sys.executable, "-m", "bench.fake_upstream", "--port", str(args.upstream_port)),
            *("--chunks", "16", "--model", "fake"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    rows: list[dict[str, Any]] = []
    try:
        _wait(f"http://127.0.0.1:{args.upstream_port}/v1/models")
        for r in range(args.rounds):
            rows.extend(_round(args, env, upstream, r))
    finally:
        _stop(upstream)
    for name in args.servers.split(","):
        for c in args.c:
            values = [row["ms_per_req"] for row in rows if row["server"] == name and row["c"] == c]
            mean = sum(values) / len(values)
            print(f"c={c:<2} {name:<16} mean {mean:.3f} ms/req {[round(v, 3) for v in values]}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
