"""The gateway's CPU (and instructions) per relayed chunk of a GPU-speed stream.

The fake upstream (``bench.fake_upstream``) streams ``--tokens`` chunks per answer,
``--delay-ms`` apart (20 ms: a GPU-speed decode, so each chunk arrives in a read of its
own), to ``--streams`` concurrent clients through one gateway process: ``llmso serve``
with one ``backend: openai`` model (``--system gateway``), or the raw relay
(``bench.raw_relay``, the server stack and upstream client with nothing between: a
floor). The client is a lean asyncio HTTP/1.1 loop (keep-alive, one connection per
stream, the streams' starts spread over one chunk gap, so their chunks interleave as a
fleet's do) so the 2-vCPU box spends its time on the gateway, not on the load; it checks
one answer's text per level and every answer's end.

Figures per level, from the gateway process only:

- ``cpu_us_per_chunk``: user + system CPU (``/proc/<pid>/stat``, clock ticks) over the
  measured requests, divided by the chunks they relayed (requests x tokens): per-request
  work included, as issue 41 quotes it;
- with ``--callgrind``, the gateway runs under ``valgrind --tool=callgrind``, its
  instrumentation switched on after the warm-up (``callgrind_control``):
  ``instructions_per_chunk`` counts user-space instructions (the kernel's side of a
  syscall is not in it), which repeat run to run whatever the machine's load. Give two
  ``--tokens`` values and the difference between them is the marginal cost of one
  more chunk, per-request work excluded (``marginal``); with ``--span-ms`` both levels
  last as long (one fake per chunk gap), so the gateway's clock-driven work (health
  probes, ticks) is the same in both and cancels.

``--tree A --tree B`` serves the gateway from two checkouts in turn, round by round (an
interleaved A/B; the fakes and the client come from this one). Each tree's servers run
from the tree itself: ``python -m`` imports from the working directory first. Run from a
checkout (docs/benchmarks/overhead/per_chunk.md has the runs)::

    python -m bench.studies.chunk_cost --streams 64,256 --rounds 5 --tree A --tree B
    python -m bench.studies.chunk_cost --callgrind --streams 16 --tokens 16,64 \
        --span-ms 16000 --batches 2 --tree A --tree B
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from bench.client import raw_chat_post
from bench.procstat import group_cpu_split

_MODEL = "fake"
_ROOT = Path(__file__).resolve().parents[2]
_GATEWAY_YAML = """\
server:
  host: 127.0.0.1
  port: {port}
models:
"""
_MODEL_YAML = """\
  - name: {name}
    backend: openai
    base_url: http://127.0.0.1:{fake_port}/v1
    upstream_model: fake
    max_concurrency: 4096
"""
_END = b"\r\n0\r\n\r\n"  # the end of a chunked body


@dataclass(frozen=True, slots=True)
class Level:
    streams: int
    tokens: int
    delay_ms: float

    @property
    def model(self) -> str:
        """The gateway's model in front of the fake with this level's chunk gap."""
        return f"fake-{self.delay_ms:g}"


@dataclass(slots=True)
class Reading:
    """One measured level of one tree in one round."""

    tree: str
    streams: int
    tokens: int
    delay_ms: float
    requests: int
    seconds: float
    cpu_s: float | None = None
    system_s: float | None = None
    instructions: int | None = None
    loadavg: str = ""
    frames: int = 0
    """``data:`` lines the clients received (a content chunk merged with the next one
    by a gateway that fell behind shows as fewer)."""

    @property
    def chunks(self) -> int:
        return self.requests * self.tokens

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        out["chunks"] = self.chunks
        if self.cpu_s is not None:
            out["cpu_us_per_chunk"] = round(self.cpu_s / self.chunks * 1e6, 2)
            out["cpu_us_per_request"] = round(self.cpu_s / self.requests * 1e6, 1)
        if self.system_s is not None:
            out["system_us_per_chunk"] = round(self.system_s / self.chunks * 1e6, 2)
        out["frames_per_request"] = round(self.frames / self.requests, 2)
        if self.instructions is not None:
            out["instructions_per_chunk"] = round(self.instructions / self.chunks)
            out["instructions_per_request"] = round(self.instructions / self.requests)
        return out


@dataclass(slots=True)
class Options:
    system: str
    batches: int
    warmup: int
    callgrind: Path | None
    workdir: Path
    rounds: int
    levels: list[Level] = field(default_factory=list)
    trees: list[Path] = field(default_factory=list)
    fakes: dict[str, int] = field(default_factory=dict)
    """The fake upstreams' ports, by the model served from each."""


# ---------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(command: list[str], tree: Path, log: Path) -> subprocess.Popen[bytes]:
    """``command`` run from ``tree``: its working directory (``python -m`` puts that
    first on the import path) and ``PYTHONPATH``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            cwd=tree,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


async def _until_up(port: int, path: str, process: subprocess.Popen[bytes], limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
            )
            answer = await reader.read()
            writer.close()
            if answer.startswith(b"HTTP/1.1 200"):
                return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{process.args!r} not up on port {port} after {limit:g}s")


def _system_command(options: Options, port: int) -> tuple[list[str], str]:
    """The gateway's command line and its health path."""
    python = sys.executable
    if options.system == "raw-relay":
        (fake_port,) = options.fakes.values()
        upstream = f"http://127.0.0.1:{fake_port}"
        command = [python, "-m", "bench.raw_relay", "--upstream", upstream, "--port", str(port)]
        return command, "/health"
    config = options.workdir / f"gateway-{port}.yaml"
    models = "".join(
        _MODEL_YAML.format(name=name, fake_port=fake_port)
        for name, fake_port in options.fakes.items()
    )
    config.write_text(_GATEWAY_YAML.format(port=port) + models, encoding="utf-8")
    return [python, "-m", "gateway.cli", "serve", "--config", str(config)], "/health"


class Callgrind:
    """The gateway under callgrind, instrumented only while a level is measured."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def prefix(self) -> list[str]:
        return [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={self.out}/callgrind.out.%p",
        ]

    @staticmethod
    def control(pid: int, *flags: str) -> None:
        subprocess.run(
            ["callgrind_control", *flags, str(pid)], check=True, capture_output=True, timeout=120
        )

    def start(self, pid: int) -> None:
        self.control(pid, "-i", "on")
        self.control(pid, "-z")

    def stop(self, pid: int) -> int:
        """Instructions since ``start`` (the dump's total), instrumentation off again."""
        before = set(self.out.glob(f"callgrind.out.{pid}*"))
        self.control(pid, "-d")
        self.control(pid, "-i", "off")
        dumps = sorted(set(self.out.glob(f"callgrind.out.{pid}*")) - before)
        for line in dumps[-1].read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no totals in {dumps[-1]}")


# ---------------------------------------------------------------------- the client


async def _stream_once(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> bytes:
    writer.write(request)
    parts: list[bytes] = []
    tail = b""
    while True:
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("the gateway closed the connection mid-answer")
        parts.append(data)
        tail = (tail + data)[-16:]
        if tail.endswith(_END):
            return b"".join(parts)


def _frames(answer: bytes) -> int:
    """The ``data:`` lines of a 200 stream ending in ``[DONE]`` (its text is checked
    once per level by ``_check_text``)."""
    if not answer.startswith(b"HTTP/1.1 200") or b"data: [DONE]" not in answer:
        raise RuntimeError(f"not a whole stream: {answer[:300]!r}")
    return answer.count(b"data: ")


def _check_text(answer: bytes, tokens: int) -> None:
    from bench.fake_upstream import WORDS

    expected = "".join(WORDS[t % len(WORDS)] for t in range(tokens))
    text = []
    for line in answer.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:]).get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or "")
    if "".join(text) != expected:
        raise RuntimeError(f"relayed text {''.join(text)!r} is not {expected!r}")


async def _drive(port: int, level: Level, batches: int, *, raw: bool) -> tuple[int, int]:
    """``batches`` answers on each of ``level.streams`` concurrent streams, their starts
    spread evenly over one chunk gap (the streams' chunks interleave, as a fleet's do,
    instead of arriving together): the requests made and the ``data:`` lines received.
    ``raw``: the raw relay, which passes the model name on as it is."""
    request = raw_chat_post(_MODEL if raw else level.model, level.tokens, content="hello")

    async def one_stream(start: float) -> int:
        await asyncio.sleep(start)
        frames = 0
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        try:
            for _ in range(batches):
                frames += _frames(await _stream_once(reader, writer, request))
        finally:
            writer.close()
        return frames

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    _check_text(await _stream_once(reader, writer, request), level.tokens)
    writer.close()
    step = level.delay_ms / 1000 / level.streams
    frames = await asyncio.gather(*(one_stream(i * step) for i in range(level.streams)))
    return level.streams * batches, sum(frames)


# ---------------------------------------------------------------------- levels


async def _measure_tree(options: Options, tree: Path, callgrind: Callgrind | None) -> list[Reading]:
    port = _free_port()
    command, health = _system_command(options, port)
    raw = options.system == "raw-relay"
    if callgrind is not None:
        command = callgrind.prefix() + command
    log = options.workdir / f"gateway-{tree.name}.log"
    process = _start(command, tree, log)
    readings = []
    try:
        await _until_up(port, health, process, 600 if callgrind else 120)
        for level in options.levels:
            await _drive(port, level, options.warmup, raw=raw)
            loadavg = f"{os.getloadavg()[0]:.2f}"
            if callgrind is not None:
                callgrind.start(process.pid)
            cpu_before = group_cpu_split(process.pid)
            began = time.perf_counter()
            requests, frames = await _drive(port, level, options.batches, raw=raw)
            seconds = time.perf_counter() - began
            cpu_after = group_cpu_split(process.pid)
            instructions = callgrind.stop(process.pid) if callgrind is not None else None
            reading = Reading(
                str(tree), level.streams, level.tokens, level.delay_ms, requests, seconds
            )
            if cpu_before is not None and cpu_after is not None:
                reading.system_s = cpu_after[1] - cpu_before[1]
                reading.cpu_s = sum(cpu_after) - sum(cpu_before)
            reading.instructions = instructions
            reading.frames = frames
            reading.loadavg = f"{loadavg}-{os.getloadavg()[0]:.2f}"
            readings.append(reading)
            print(json.dumps(reading.summary()), flush=True)
    finally:
        _stop(process)
    return readings


async def run(options: Options) -> list[Reading]:
    """Every level of every tree, the trees in turn in each round, over one fake
    upstream per chunk gap."""
    chunks = max(level.tokens for level in options.levels)
    fakes: list[subprocess.Popen[bytes]] = []
    callgrind = Callgrind(options.workdir) if options.callgrind is not None else None
    readings: list[Reading] = []
    try:
        for delay in sorted({level.delay_ms for level in options.levels}):
            port = _free_port()
            command = [sys.executable, "-m", "bench.fake_upstream", "--port", str(port)]
            command += ["--chunks", str(chunks), "--delay-ms", str(delay), "--model", _MODEL]
            fakes.append(_start(command, _ROOT, options.workdir / f"fake-{delay:g}.log"))
            await _until_up(port, "/health", fakes[-1], 60)
            options.fakes[Level(0, 0, delay).model] = port
        for _ in range(options.rounds):
            for tree in options.trees:
                readings += await _measure_tree(options, tree, callgrind)
    finally:
        for fake in fakes:
            _stop(fake)
    return readings


def marginal(readings: list[Reading]) -> list[dict[str, object]]:
    """Per tree and stream count with two token counts: the cost of one more chunk
    (``(per request at many - per request at few) / (many - few)``)."""
    out = []
    keys = sorted({(r.tree, r.streams) for r in readings})
    for tree, streams in keys:
        group = sorted(
            (r for r in readings if (r.tree, r.streams) == (tree, streams)), key=lambda r: r.tokens
        )
        low, high = group[0], group[-1]
        if low.tokens == high.tokens:
            continue
        entry: dict[str, object] = {"tree": tree, "streams": streams}
        span = high.tokens - low.tokens
        if low.instructions is not None and high.instructions is not None:
            per_low = low.instructions / low.requests
            per_high = high.instructions / high.requests
            entry["instructions_per_chunk"] = round((per_high - per_low) / span)
            entry["instructions_per_request_fixed"] = round(
                per_low - low.tokens * (per_high - per_low) / span
            )
        if low.cpu_s is not None and high.cpu_s is not None:
            per_low = low.cpu_s / low.requests
            per_high = high.cpu_s / high.requests
            entry["cpu_us_per_chunk"] = round((per_high - per_low) / span * 1e6, 2)
        out.append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="64,256", help="Concurrent streams, comma-separated.")
    parser.add_argument("--tokens", default="64", help="Chunks per answer, comma-separated.")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="Between two chunks.")
    parser.add_argument(
        "--span-ms",
        type=float,
        help="Instead of --delay-ms: every answer lasts this long, its chunks spread over "
        "it (so levels of several --tokens take the same time, and what the gateway does "
        "on a clock, probes and ticks, cancels out of the marginal cost).",
    )
    parser.add_argument("--batches", type=int, default=3, help="Measured answers per stream.")
    parser.add_argument("--warmup", type=int, default=1, help="Answers per stream before.")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--system", choices=("gateway", "raw-relay"), default="gateway")
    parser.add_argument("--tree", action="append", type=Path, help="Serve from this checkout.")
    parser.add_argument("--callgrind", action="store_true", help="Count instructions.")
    parser.add_argument("--json", type=Path, help="Write every reading here.")
    parser.add_argument(
        "--workdir", type=Path, help="Keep configs, logs and callgrind dumps here (else a temp)."
    )
    args = parser.parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.callgrind and shutil.which("callgrind_control") is None:
        parser.error("--callgrind needs valgrind on PATH")
    if args.span_ms is not None and args.system == "raw-relay" and len(tokens) > 1:
        parser.error("the raw relay has one upstream: one --tokens with --span-ms")

    def delay(count: int) -> float:
        return float(args.delay_ms if args.span_ms is None else args.span_ms / count)

    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        workdir.mkdir(parents=True, exist_ok=True)
        options = Options(
            system=args.system,
            batches=args.batches,
            warmup=args.warmup,
            callgrind=workdir if args.callgrind else None,
            workdir=workdir,
            rounds=args.rounds,
            levels=[Level(s, t, delay(t)) for s in streams for t in tokens],
            trees=[tree.resolve() for tree in args.tree or [_ROOT]],
        )
        readings = asyncio.run(run(options))
    result = {"readings": [r.summary() for r in readings], "marginal": marginal(readings)}
    print(json.dumps(result["marginal"], indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
