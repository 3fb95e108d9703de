"""A 4xx leaves a kept-alive connection usable, on the server `llmso serve` runs.

lm-evaluation-harness (aiohttp, keep-alive) twice got ``Can not write request body`` on
a reused connection after a run of 400s: a server that closes a connection after an
error, or answers before reading a body and then drops the rest, breaks such clients.
Each case below sends its bad request, then a good one, on the same socket.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest

from bench.fake_upstream import FakeOptions
from tests.service.edge_server import gateway_on_edge
from tests.tools.servers import gateway

GOOD = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
NO_ARGUMENTS = {
    "model": "m",
    "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "w"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ],
}


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    body: bytes,
    *,
    path: str = "/v1/chat/completions",
    content_type: str = "application/json",
) -> tuple[int, dict[str, str], bytes]:
    head = (
        f"POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + body)
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 10)
    assert status_line, "the server closed the connection"
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        payload = await reader.readexactly(int(headers["content-length"]))
    else:  # chunked
        payload = b""
        while size := int((await reader.readline()).strip(), 16):
            payload += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
    return int(status_line.split()[1]), headers, payload


BAD_REQUESTS = [
    pytest.param(orjson.dumps(NO_ARGUMENTS), {}, 400, id="tool-call-without-arguments"),
    pytest.param(orjson.dumps({**GOOD, "model": "nope"}), {}, 404, id="unknown-model"),
    pytest.param(b'{"model": "m", "messages": [', {}, 400, id="broken-json"),
    pytest.param(orjson.dumps({**GOOD, "n": 0}), {}, 400, id="invalid-field"),
    pytest.param(b"hello", {"content_type": "text/plain"}, 415, id="wrong-content-type"),
    pytest.param(
        orjson.dumps({"model": "m", "prompt": "x", "echo": True, "logprobs": 1, "max_tokens": 0}),
        {"path": "/v1/completions"},
        400,
        id="completions-4xx",
    ),
]


@pytest.mark.parametrize(("body", "options", "status"), BAD_REQUESTS)
async def test_a_4xx_leaves_the_connection_usable(
    body: bytes, options: dict[str, str], status: int
) -> None:
    async with gateway_on_edge(FakeOptions(chunks=2)) as (port, _fake, _app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(3):
                got, headers, payload = await _exchange(reader, writer, body, **options)
                assert got == status, payload
                assert headers.get("connection", "").lower() != "close"
                assert "error" in orjson.loads(payload)
                got, _, payload = await _exchange(reader, writer, orjson.dumps(GOOD))
                assert got == 200, payload
        finally:
            writer.close()


async def test_a_tool_call_without_arguments_is_refused_at_once() -> None:
    async with gateway_on_edge(FakeOptions(chunks=2)) as (port, _fake, _app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            began = time.perf_counter()
            status, _, payload = await _exchange(reader, writer, orjson.dumps(NO_ARGUMENTS))
            elapsed = time.perf_counter() - began
        finally:
            writer.close()
    error = orjson.loads(payload)["error"]
    assert status == 400 and elapsed < 1.0
    assert error["param"] == "messages[1].tool_calls[0].function.arguments"
    assert error["code"] == "missing_required_parameter"


async def test_aiohttp_keep_alive_survives_a_run_of_400s() -> None:
    """The harness's own pattern: one pooled connection, many refused requests."""
    async with gateway_on_edge(FakeOptions(chunks=2)) as (port, _fake, _app):
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            for round_ in range(40):
                body = NO_ARGUMENTS if round_ % 4 else GOOD
                async with session.post(url, json=body) as reply:
                    assert reply.status == (400 if round_ % 4 else 200)
                    await reply.read()


@pytest.mark.slow
def test_llmso_serve_keeps_an_idle_connection_longer_than_client_pools() -> None:
    """uvicorn's own default (5 s) is shorter than aiohttp's pool keeps a connection
    (15 s): a request sent on a pooled connection as the server closes it fails."""
    import socket

    config = {"models": [{"name": "m", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}]}
    with gateway(config) as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        request = b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
        for _ in range(2):
            sock.sendall(request)
            reply = sock.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
            time.sleep(6.5)  # past uvicorn's default idle timeout
