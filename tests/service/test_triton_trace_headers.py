"""The triton backend sends a request's trace context as gRPC metadata.

A real gRPC server (grpc.aio with tritonclient's own service definition) stands in for
Triton: healthy, one model with the vLLM backend's tensors, and a stream call that
records the metadata it was called with and answers with an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2, service_pb2_grpc

from backends.base import (
    GenerationRequest,
    RequestKind,
    SamplingParams,
    UpstreamBadResponse,
)
from backends.hop_metrics import BackendMetrics
from backends.triton.backend import TritonBackend
from config.schema import TritonModelConfig

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
_INPUTS = (
    ("text_input", "BYTES"),
    ("stream", "BOOL"),
    ("sampling_parameters", "BYTES"),
    ("exclude_input_in_output", "BOOL"),
)


class Recorder(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=True)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name="llm",
            inputs=[tensor(name=n, datatype=d, shape=[1]) for n, d in _INPUTS],
            outputs=[tensor(name="text_output", datatype="BYTES", shape=[-1])],
        )

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        self.metadata.append({m.key: m.value for m in context.invocation_metadata()})
        async for _ in request_iterator:
            yield service_pb2.ModelStreamInferResponse(error_message="recorded")
            return


@pytest.fixture
async def triton() -> AsyncIterator[tuple[Recorder, int]]:
    server = grpc.aio.server()
    recorder = Recorder()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(recorder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield recorder, port
    finally:
        await server.stop(grace=None)


async def test_trace_headers_travel_as_grpc_metadata(triton: tuple[Recorder, int]) -> None:
    recorder, port = triton
    config = TritonModelConfig(
        name="t", backend="triton", url=f"127.0.0.1:{port}", triton_model="llm"
    )
    backend = TritonBackend(config, BackendMetrics(CollectorRegistry()))
    await backend.start()
    request = GenerationRequest(
        request_id="r",
        model="t",
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=2),
        prompt="hi",
        trace_headers=(("traceparent", TRACEPARENT), ("tracestate", "k=v")),
    )
    try:
        with pytest.raises(UpstreamBadResponse, match="recorded"):
            _ = [event async for event in backend.generate(request)]
    finally:
        await backend.stop()
    assert recorder.metadata, "the stream call never arrived"
    assert recorder.metadata[-1]["traceparent"] == TRACEPARENT
    assert recorder.metadata[-1]["tracestate"] == "k=v"
