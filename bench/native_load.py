"""The C load tools of the fleet drill (``bench/native/``): a stream client and a fake
upstream that cost a few microseconds a chunk, so a 2-vCPU box spends its cores on the
relay it measures rather than on the load (docs/benchmarks/fleet/README.md).

``make bench-native`` builds them into ``.engines/bench-native/`` (``make test`` and
``make bench-fleet`` do it first). ``run_native_level`` runs one level of a comparison
(``bench.compare``) with the client instead of ``bench.loadgen``'s aiohttp loop: a
closed loop of ``concurrency`` keep-alive connections, every request the same body
(the run's first prompt, built as ``bench.client`` builds it), warm-up first.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import orjson

from bench.client import RequestOptions, RequestResult, build_body
from bench.loadgen import LevelRun, LoadSpec
from bench.prompts import Prompt

NATIVE_DIR = Path(__file__).resolve().parents[1] / ".engines" / "bench-native"
CLIENT = NATIVE_DIR / "sse_client"
UPSTREAM = NATIVE_DIR / "sse_upstream"


class NativeToolError(RuntimeError):
    """The client could not be run, or printed what it should not."""


def parse_line(line: str, *, warmup: bool, stream: bool) -> RequestResult:
    """One request as ``sse_client`` prints it (see its header comment)."""
    fields = line.split()
    if len(fields) < 7:
        raise NativeToolError(f"sse_client printed {line!r}")
    index, start, e2e, ttft, status, chunks, tokens = fields[:7]
    times = tuple(float(t) for t in fields[7:])
    if len(times) != int(chunks):
        raise NativeToolError(f"sse_client: {chunks} chunks but {len(times)} times: {line!r}")
    ok = int(status) == 200 and (bool(times) or not stream)
    return RequestResult(
        index=int(index),
        prompt_index=0,
        ok=ok,
        status=int(status),
        start=float(start),
        e2e=float(e2e),
        ttft=None if ttft == "-" else float(ttft),
        chunk_times=times,
        output_tokens=int(tokens) if int(tokens) >= 0 else len(times),
        prompt_tokens=None,
        tokens_from_usage=int(tokens) >= 0,
        error=None if ok else f"status {status}, {chunks} text chunks",
        warmup=warmup,
    )


async def run_client(
    client: Path,
    body: Path,
    *,
    port: int,
    concurrency: int,
    requests: int,
    timeout_s: float,
    host: str = "127.0.0.1",
    path: str = "/v1/chat/completions",
    spread_ms: float = 0.0,
    warmup: bool = False,
    stream: bool = True,
) -> list[RequestResult]:
    """``requests`` requests of ``body`` from ``client`` over ``concurrency`` keep-alive
    connections (their starts spread over ``spread_ms``), each bounded by ``timeout_s``:
    one result per request. Raises ``NativeToolError`` if the client fails, overruns or
    answers for fewer requests."""
    command = [
        str(client),
        *("--host", host, "--port", str(port), "--path", path),
        *("--body-file", str(body), "--concurrency", str(concurrency)),
        *("--requests", str(requests), "--timeout-s", str(timeout_s)),
        *("--spread-ms", str(spread_ms)),
    ]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    # Every connection's requests one after another, each bounded by the timeout.
    budget = timeout_s * (requests // max(concurrency, 1) + 2) + spread_ms / 1000
    try:
        out, err = await asyncio.wait_for(process.communicate(), budget)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise NativeToolError(f"sse_client ran past {budget:g} s") from None
    if process.returncode != 0:
        raise NativeToolError(f"sse_client exited {process.returncode}: {err.decode()[-500:]}")
    lines = out.decode().splitlines()
    if len(lines) != requests:
        raise NativeToolError(f"sse_client answered {len(lines)} of {requests} requests")
    return [parse_line(line, warmup=warmup, stream=stream) for line in lines]


async def _client_run(
    client: Path,
    options: RequestOptions,
    body: Path,
    *,
    concurrency: int,
    requests: int,
    warmup: bool,
) -> list[RequestResult]:
    url = urlsplit(options.url)
    if url.scheme != "http" or url.hostname is None or url.port is None:
        raise NativeToolError(f"sse_client speaks plain http to host:port, not {options.url}")
    return await run_client(
        client,
        body,
        host=url.hostname,
        port=url.port,
        path=url.path,
        concurrency=concurrency,
        requests=requests,
        timeout_s=options.timeout_s,
        warmup=warmup,
        stream=options.stream,
    )


async def run_native_level(
    client: Path,
    options: RequestOptions,
    prompts: Sequence[Prompt],
    load: LoadSpec,
    workdir: Path,
    *,
    on_measured: Callable[[], None] | None = None,
) -> LevelRun:
    """``bench.loadgen.run_level``'s counterpart for a closed-loop level (``concurrency``
    and ``num_requests`` set; ``duration_s`` is not a limit here)."""
    if load.concurrency is None or load.num_requests is None:
        raise NativeToolError("the C client runs closed-loop levels of a set request count")
    if not await asyncio.to_thread(client.exists):
        raise NativeToolError(f"{client} is not built: run `make bench-native`")
    body = workdir / "native-body.json"
    await asyncio.to_thread(body.write_bytes, orjson.dumps(build_body(options, prompts[0])))
    warm: list[RequestResult] = []
    if load.warmup:
        concurrency = min(load.concurrency, load.warmup)
        warm = await _client_run(
            client, options, body, concurrency=concurrency, requests=load.warmup, warmup=True
        )
    if on_measured is not None:
        on_measured()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    measured = await _client_run(
        client,
        options,
        body,
        concurrency=load.concurrency,
        requests=load.num_requests,
        warmup=False,
    )
    wall = time.perf_counter() - began
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    return LevelRun(load=load, results=tuple(warm + measured), wall_s=wall, client_cpu_s=client_cpu)
