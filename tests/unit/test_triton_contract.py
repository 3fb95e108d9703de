"""The Triton tensor contract and the backend's error handling, without a server."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import InferResult, service_pb2

from backends.base import (
    ChatMessage,
    Feature,
    GenerationRequest,
    NotReady,
    Overloaded,
    ReasoningDelta,
    RequestKind,
    SamplingParams,
    TextDelta,
    UpstreamBadResponse,
    UpstreamTimeout,
    UpstreamUnavailable,
    Usage,
)
from backends.hop_metrics import BackendMetrics
from backends.triton import contract
from backends.triton.backend import TritonBackend
from backends.triton.errors import map_rpc_error, map_stream_error, retryable
from config.schema import TritonModelConfig

# What Triton reports for the vLLM backend's auto-completed config (src/model.py).
VLLM_METADATA = {
    "name": "vllm_model",
    "inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": ["1"]},
        {"name": "image", "datatype": "BYTES", "shape": ["-1"]},
        {"name": "stream", "datatype": "BOOL", "shape": ["1"]},
        {"name": "sampling_parameters", "datatype": "BYTES", "shape": ["1"]},
        {"name": "exclude_input_in_output", "datatype": "BOOL", "shape": ["1"]},
        {"name": "return_finish_reason", "datatype": "BOOL", "shape": ["1"]},
        {"name": "return_cumulative_logprob", "datatype": "BOOL", "shape": ["1"]},
        {"name": "return_num_input_tokens", "datatype": "BOOL", "shape": ["1"]},
        {"name": "return_num_output_tokens", "datatype": "BOOL", "shape": ["1"]},
    ],
    "outputs": [
        {"name": "text_output", "datatype": "BYTES", "shape": ["-1"]},
        {"name": "finish_reason", "datatype": "BYTES", "shape": ["-1"]},
        {"name": "cumulative_logprob", "datatype": "FP32", "shape": ["-1"]},
        {"name": "num_input_tokens", "datatype": "UINT32", "shape": ["1"]},
        {"name": "num_output_tokens", "datatype": "UINT32", "shape": ["-1"]},
    ],
}
MINIMAL_METADATA = {
    "inputs": [
        {"name": "text_input", "datatype": "BYTES"},
        {"name": "stream", "datatype": "BOOL"},
        {"name": "sampling_parameters", "datatype": "BYTES"},
    ],
    "outputs": [{"name": "text_output", "datatype": "BYTES"}],
}


def test_vllm_backend_metadata_passes_with_all_extras() -> None:
    found = contract.check_metadata("vllm_model", VLLM_METADATA)
    assert found.flags() == (
        "return_finish_reason",
        "return_num_input_tokens",
        "return_num_output_tokens",
    )
    assert contract.EXCLUDE_INPUT in found.inputs


def test_minimal_metadata_passes_without_extras() -> None:
    found = contract.check_metadata("m", MINIMAL_METADATA)
    assert found.flags() == () and not found.outputs


def test_echo_metadata_is_refused_naming_every_difference() -> None:
    echo = {
        "inputs": [{"name": "PROMPT", "datatype": "BYTES"}],
        "outputs": [{"name": "RESPONSE", "datatype": "BYTES"}],
    }
    with pytest.raises(contract.ContractMismatch) as info:
        contract.check_metadata("echo", echo)
    message = str(info.value)
    for expected in ("'echo'", "text_input", "stream", "sampling_parameters", "text_output"):
        assert expected in message
    assert "PROMPT:BYTES" in message and info.value.status == 502


def test_wrong_dtype_is_refused() -> None:
    bad = json.loads(json.dumps(MINIMAL_METADATA))
    bad["outputs"].append({"name": "num_output_tokens", "datatype": "INT64"})
    with pytest.raises(contract.ContractMismatch, match=r"num_output_tokens.*INT64.*UINT32"):
        contract.check_metadata("m", bad)


def test_sampling_json_uses_vllm_names() -> None:
    sampling = SamplingParams(max_tokens=7, temperature=0.0, top_k=0, seed=3, stop=("\n",))
    assert json.loads(contract.sampling_json(sampling)) == {
        "max_tokens": 7,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "seed": 3,
        "stop": ["\n"],
    }
    assert json.loads(contract.sampling_json(SamplingParams(max_tokens=1, ignore_eos=True)))[
        "ignore_eos"
    ]


def test_build_inputs_only_sends_declared_flags() -> None:
    full = contract.check_metadata("v", VLLM_METADATA)
    names = [t.name() for t in contract.build_inputs("hi", SamplingParams(max_tokens=2), full)]
    assert names == [
        "text_input",
        "stream",
        "sampling_parameters",
        "exclude_input_in_output",
        "return_finish_reason",
        "return_num_input_tokens",
        "return_num_output_tokens",
    ]
    minimal = contract.check_metadata("m", MINIMAL_METADATA)
    names = [t.name() for t in contract.build_inputs("hi", SamplingParams(max_tokens=2), minimal)]
    assert names == ["text_input", "stream", "sampling_parameters"]


def make_result(
    text: str | None,
    *,
    final: bool = False,
    reason: str | None = None,
    out_tokens: int | None = None,
    in_tokens: int | None = None,
) -> InferResult:
    response = service_pb2.ModelInferResponse(model_name="llm")
    tensors: list[tuple[str, str, np.ndarray[Any, Any]]] = []
    if text is not None:
        tensors.append(("text_output", "BYTES", np.array([text.encode()], dtype=np.object_)))
    if reason is not None:
        tensors.append(("finish_reason", "BYTES", np.array([reason.encode()], dtype=np.object_)))
    if out_tokens is not None:
        tensors.append(("num_output_tokens", "UINT32", np.array([out_tokens], dtype=np.uint32)))
    if in_tokens is not None:
        tensors.append(("num_input_tokens", "UINT32", np.array([in_tokens], dtype=np.uint32)))
    for name, dtype, array in tensors:
        response.outputs.add(name=name, datatype=dtype, shape=list(array.shape))
        raw = _serialize_bytes(array) if dtype == "BYTES" else array.tobytes()
        response.raw_output_contents.append(raw)
    response.parameters["triton_final_response"].bool_param = final
    return InferResult(response)


def _serialize_bytes(array: np.ndarray[Any, Any]) -> bytes:
    """Triton's BYTES wire format: each element as a 4-byte little-endian length + data."""
    return b"".join(struct.pack("<I", len(item)) + item for item in array.reshape(-1))


def test_parse_result_reads_text_counts_and_final_mark() -> None:
    chunk = contract.parse_result(
        make_result("é!", final=True, reason="length", out_tokens=2, in_tokens=9)
    )
    assert chunk == contract.Chunk("é!", True, "length", 9, 2)
    assert contract.parse_result(make_result("a")) == contract.Chunk("a", False)


def test_finish_reason_prefers_the_model_then_counts() -> None:
    assert contract.finish_reason("length", 1, 10) == "length"
    assert contract.finish_reason("stop", 10, 10) == "stop"
    assert contract.finish_reason(None, 10, 10) == "length"
    assert contract.finish_reason("abort", 3, 10) == "stop"


def test_stream_errors_map_to_typed_errors() -> None:
    assert isinstance(
        map_stream_error("Request for unknown model: 'x' is not found", "x"), NotReady
    )
    assert isinstance(map_stream_error("llm queue is full", "llm"), Overloaded)
    assert isinstance(map_stream_error("UNAVAILABLE: shutting down", "llm"), UpstreamUnavailable)
    assert isinstance(map_stream_error("llm: boom", "llm"), UpstreamBadResponse)


def test_a_request_grpc_could_not_send_may_go_to_another_replica() -> None:
    """A server killed under an open connection: gRPC Python reports the failed send as
    INTERNAL "Internal error from Core" (seen in tests/e2e/test_triton_replicas.py's kill
    drill); that is an unreachable replica (retryable), while any other INTERNAL stays a
    bad response."""

    def rpc_error(code: grpc.StatusCode, details: str, debug: str) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, debug)

    unsent = rpc_error(
        grpc.StatusCode.INTERNAL,
        "Internal error from Core",
        'Failed "execute_batch": (<grpc._cython.cygrpc.SendMessageOperation object>,)',
    )
    assert retryable(map_rpc_error(unsent, "h:1"))
    other = rpc_error(grpc.StatusCode.INTERNAL, "model crashed", "")
    assert not retryable(map_rpc_error(other, "h:1"))
    assert retryable(map_rpc_error(rpc_error(grpc.StatusCode.UNAVAILABLE, "gone", ""), "h:1"))


# ---------------------------------------------------------------- backend with a fake client


class FakeCall:
    """Stands in for tritonclient's stream iterator: yields prepared (result, error)."""

    def __init__(self, items: list[InferResult], delay: float = 0.0) -> None:
        self._items = list(items)
        self._delay = delay
        self.cancelled = False

    def __aiter__(self) -> FakeCall:
        return self

    async def __anext__(self) -> tuple[InferResult, None]:
        await asyncio.sleep(self._delay)
        if not self._items:
            raise StopAsyncIteration
        return self._items.pop(0), None

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeClient:
    def __init__(self, call: FakeCall) -> None:
        self.call = call
        self.sent: list[dict[str, Any]] = []

    def stream_infer(self, inputs_iterator: AsyncIterator[dict[str, Any]], **_: Any) -> FakeCall:
        return self.call

    async def close(self) -> None:
        return None


def fake_backend(call: FakeCall, **config: Any) -> tuple[TritonBackend, CollectorRegistry]:
    registry = CollectorRegistry()
    cfg = TritonModelConfig(
        name="t", backend="triton", url="127.0.0.1:1", triton_model="llm", **config
    )
    backend = TritonBackend(cfg, BackendMetrics(registry))
    server = backend._servers["127.0.0.1:1"]
    server.client = FakeClient(call)
    server.contract = contract.check_metadata("llm", VLLM_METADATA)
    return backend, registry


def completion(max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        model="t",
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=max_tokens),
        prompt="hi",
    )


async def test_generate_uses_model_counts_and_reason() -> None:
    call = FakeCall(
        [
            make_result("Hel", out_tokens=1),
            make_result("lo", out_tokens=1),
            make_result("", final=True, reason="stop", out_tokens=1, in_tokens=5),
        ]
    )
    backend, registry = fake_backend(call)
    events = [e async for e in backend.generate(completion(10))]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hel", "lo"]
    usage = events[-1]
    assert isinstance(usage, Usage)
    assert (usage.prompt_tokens, usage.completion_tokens) == (5, 3)
    assert call.cancelled  # the call is always closed
    labels = {"model": "t", "backend": "triton", "status": "ok"}
    assert registry.get_sample_value("llmso_upstream_requests_total", labels) == 1


async def test_no_first_token_in_time_is_a_timeout() -> None:
    backend, registry = fake_backend(
        FakeCall([make_result("late")], delay=5.0), first_token_timeout=0.2
    )
    with pytest.raises(UpstreamTimeout, match="first token"):
        _ = [e async for e in backend.generate(completion(4))]
    labels = {"model": "t", "backend": "triton", "status": "timeout"}
    assert registry.get_sample_value("llmso_upstream_requests_total", labels) == 1


async def test_closing_the_stream_cancels_the_call() -> None:
    call = FakeCall([make_result("a", out_tokens=1)] * 5)
    backend, registry = fake_backend(call)
    stream = backend.generate(completion(10))
    async for event in stream:
        if isinstance(event, TextDelta):
            break
    await stream.aclose()  # type: ignore[attr-defined]
    assert call.cancelled
    labels = {"model": "t", "backend": "triton", "status": "cancelled"}
    assert registry.get_sample_value("llmso_upstream_requests_total", labels) == 1


def test_sampling_json_sends_no_limit_it_was_not_given() -> None:
    params = json.loads(contract.sampling_json(SamplingParams(temperature=0.0)))
    assert "max_tokens" not in params  # the model's own default, never a sentinel
    assert contract.finish_reason(None, 10_000, None) == "stop"


def unlimited() -> GenerationRequest:
    return replace(completion(1), sampling=SamplingParams())


async def sent_max_tokens(
    monkeypatch: pytest.MonkeyPatch, request: GenerationRequest, **config: Any
) -> object:
    """The ``max_tokens`` the backend put in ``sampling_parameters`` ("unset" if none)."""
    sent: list[dict[str, Any]] = []
    real = contract.sampling_json

    def recording(sampling: SamplingParams, structured: Any = None) -> str:
        text = real(sampling, structured)
        sent.append(json.loads(text))
        return text

    monkeypatch.setattr(contract, "sampling_json", recording)
    call = FakeCall([make_result("a", out_tokens=1), make_result("", final=True, out_tokens=1)])
    backend, _ = fake_backend(call, **config)
    events = [e async for e in backend.generate(request)]
    assert isinstance(events[-1], Usage)
    return sent[0].get("max_tokens", "unset")


async def test_an_unset_max_tokens_is_never_forwarded_raw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Triton path takes the one effective limit: the client's, else the model's
    default_max_tokens, else none (no 1 << 20 sentinel reaches the model)."""
    assert await sent_max_tokens(monkeypatch, unlimited()) == "unset"
    assert await sent_max_tokens(monkeypatch, unlimited(), default_max_tokens=5) == 5
    assert await sent_max_tokens(monkeypatch, completion(3), default_max_tokens=5) == 3


def chat(max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        model="t",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=max_tokens),
        messages=(ChatMessage("user", "hi"),),
    )


async def test_a_thought_is_split_off_the_text_with_the_configured_parser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rendered prompt opened ``<think>`` (a DeepSeek-R1 template): what comes before
    ``</think>`` is thought, wherever the chunks cut the marker; with no tokenizer, each
    chunk that carried thought counts as a token."""
    pieces = ["Let me", " think</th", "ink>\n", "Paris"]
    items = [make_result(piece, out_tokens=1) for piece in pieces]
    call = FakeCall([*items, make_result("", final=True, reason="stop", in_tokens=5)])
    backend, _ = fake_backend(call, reasoning_parser="deepseek_r1")
    monkeypatch.setattr(backend._prompter, "render", lambda request: "user: hi\n<think>\n")
    assert Feature.REASONING in backend._reasoning_declared()
    events = [e async for e in backend.generate(chat(10))]
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert (thought, answer) == ("Let me think", "\nParis")
    usage = events[-1]
    assert isinstance(usage, Usage) and usage.reasoning_tokens == 2
    assert usage.completion_tokens == 4


async def test_a_completion_is_never_split() -> None:
    call = FakeCall([make_result("a</think>b", out_tokens=1), make_result("", final=True)])
    backend, _ = fake_backend(call, reasoning_parser="deepseek_r1")
    events = [e async for e in backend.generate(completion(10))]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["a</think>b"]
    assert not any(isinstance(e, ReasoningDelta) for e in events)


def test_reasoning_features_follow_the_template(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, _ = fake_backend(FakeCall([]), reasoning_parser="qwen3")
    template = "{% if enable_thinking %}x{% endif %}{{ reasoning_effort }}"
    monkeypatch.setattr(type(backend._prompter), "template", property(lambda self: template))
    declared = backend._reasoning_declared()
    assert {Feature.REASONING, Feature.THINKING_SWITCH, Feature.REASONING_EFFORT} <= declared
    assert Feature.THINKING_BUDGET not in declared
    plain, _ = fake_backend(FakeCall([]))
    assert plain._reasoning_declared() == frozenset()
