"""The fleet drill's C load tools (``bench/native/``, ``bench.native_load``): the fake
upstream writes ``bench.fake_upstream``'s stream byte for byte, the client reads what
the suites' client reads, and it waits out a ``Retry-After`` as the SDKs do."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.client import RequestResult
from bench.native_load import CLIENT, UPSTREAM, NativeToolError, parse_line, run_client
from tests.tools.engines import start_fake_upstream
from tests.tools.servers import (
    RunningServer,
    engine_required,
    free_port,
    start_process,
    stop_process,
)

pytestmark = [pytest.mark.e2e]

CHUNKS = 12
BODY = (
    b'{"model":"fake","messages":[{"role":"user","content":"hello"}],"stream":true,'
    b'"stream_options":{"include_usage":true},"max_tokens":64}'
)


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    for tool in (CLIENT, UPSTREAM):
        reason = engine_required("bench-native", tool)
        if reason is not None:
            pytest.skip(reason)


@pytest.fixture
def native_upstream() -> Iterator[RunningServer]:
    port = free_port()
    argv = [str(UPSTREAM), "--port", str(port), "--chunks", str(CHUNKS), "--model", "fake"]
    server = start_process(argv, port=port, health_path="/health", timeout=10)
    try:
        yield server
    finally:
        stop_process(server)


def _events(url: str, body: bytes) -> list[bytes]:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 200
    return [line for line in response.content.split(b"\n\n") if line]


def _without_prompt_count(event: bytes) -> bytes:
    """The usage chunk's prompt_tokens (and so total_tokens) differ: words counted
    against the body's bytes / 4."""
    return re.sub(rb'"(prompt|total)_tokens":\d+', rb'"\1_tokens":N', event)


def test_the_native_upstream_streams_the_python_fakes_bytes(
    native_upstream: RunningServer,
) -> None:
    with start_fake_upstream("--chunks", str(CHUNKS), "--model", "fake") as python_fake:
        expected = _events(python_fake.url, BODY)
    got = _events(native_upstream.url, BODY)
    assert len(got) == CHUNKS + 3  # role, the words, usage, [DONE]
    assert [_without_prompt_count(e) for e in got] == [_without_prompt_count(e) for e in expected]
    shorter = _events(native_upstream.url, BODY.replace(b'"max_tokens":64', b'"max_tokens":3'))
    assert b'"finish_reason":"length"' in shorter[3] and len(shorter) == 6


def _client(port: int, body: Path, *, concurrency: int, requests: int) -> list[RequestResult]:
    """The client's results as the drill reads them (``run_client``: its exit status and
    one line per request checked)."""
    return asyncio.run(_run(port, body, concurrency=concurrency, requests=requests))


async def _run(port: int, body: Path, *, concurrency: int, requests: int) -> list[RequestResult]:
    return await run_client(
        CLIENT, body, port=port, concurrency=concurrency, requests=requests, timeout_s=60
    )


def test_the_native_client_counts_every_text_chunk(
    native_upstream: RunningServer, tmp_path: Path
) -> None:
    body = tmp_path / "body.json"
    body.write_bytes(BODY)
    results = _client(native_upstream.port, body, concurrency=3, requests=7)
    assert sorted(r.index for r in results) == list(range(7))
    for result in results:
        assert result.ok and result.status == 200
        assert len(result.chunk_times) == CHUNKS and result.output_tokens == CHUNKS
        assert result.tokens_from_usage
        assert result.ttft == result.chunk_times[0] <= result.e2e


async def _shedding_server(port: int, starts: list[float]) -> asyncio.Server:
    """Answers its first request 503 with ``Retry-After: 1``, then 200 with one event."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client is done
                writer.close()
                return
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            starts.append(asyncio.get_running_loop().time())
            if len(starts) == 1:
                body = b'{"error":{"message":"full"}}'
                writer.write(
                    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
            else:
                event = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(event), event)
                )
            await writer.drain()

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def test_the_native_client_waits_out_retry_after(tmp_path: Path) -> None:
    body = tmp_path / "body.json"
    body.write_bytes(BODY)
    port = free_port()
    starts: list[float] = []
    server = await _shedding_server(port, starts)
    try:
        first, second = await _run(port, body, concurrency=1, requests=2)
    finally:
        server.close()
    assert (first.status, first.ok) == (503, False)
    assert (second.status, second.ok) == (200, True)
    assert second.start - first.start >= 1.0
    assert starts[1] - starts[0] >= 1.0


def test_a_line_that_does_not_add_up_is_refused() -> None:
    assert parse_line("0 0.1 1.2 - 503 0 -1", warmup=True, stream=True).ok is False
    with pytest.raises(NativeToolError):
        parse_line("0 0.1 1.2 0.02 200 2 2 0.02", warmup=False, stream=True)
    with pytest.raises(NativeToolError):
        parse_line("garbage", warmup=False, stream=True)
