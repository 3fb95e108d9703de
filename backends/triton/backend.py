"""TritonBackend: one model served by a Triton Inference Server, over gRPC streaming.

The model lives in Triton (its own process, possibly its own machine); the gateway keeps
only a gRPC channel and a tokenizer for chat templates and token counts. Every request is
one decoupled ``ModelStreamInfer`` call in the vLLM-backend tensor contract
(``contract.py``), so text arrives as Triton produces it.

Ownership: the event loop owns everything here. ``start`` creates the channel (one per
backend, closed in ``stop``), loads the tokenizer in a thread and checks the model's
metadata against the contract; ``generate`` streams, yielding ``Started`` only once Triton
answered (its refusals come before it); closing its iterator early cancels the gRPC call,
and Triton cancels the request (the model stops decoding); ``stop`` ends open streams with
``BackendCrashed``.

Errors: server unreachable -> UpstreamUnavailable (503); model not loaded or not ready
-> NotReady (503 + retry_after); no first token within ``first_token_timeout`` or no end
within ``total_timeout`` -> UpstreamTimeout (504); tensors not in the contract ->
ContractMismatch (502, at start); anything else Triton reports -> UpstreamBadResponse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import aio as triton_aio
from tritonclient.utils import InferenceServerException

from backends.base import (
    TEXT_GENERATION,
    BackendCrashed,
    BackendError,
    BackendEvent,
    Feature,
    Finished,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
    NotReady,
    Overloaded,
    Started,
    UpstreamBadResponse,
    UpstreamTimeout,
    UpstreamUnavailable,
    Usage,
)
from backends.hop_metrics import BackendMetrics
from backends.tool_markup import (
    ToolCallParser,
    closing_events,
    content_events,
    structured_outputs,
    tools_active,
)
from backends.triton import contract
from backends.triton.prompt import Prompter
from config.schema import TritonModelConfig

log = logging.getLogger(__name__)

BACKEND = "triton"
RETRY_AFTER = 2.0
_MAX_MESSAGE = 2**31 - 1  # Triton's own limit (INT32_MAX), as tritonclient sets it
# Triton's words for a model that is not (yet) there; they arrive as stream errors.
_NOT_READY_HINTS = ("unknown model", "not ready", "no available version", "is not found")


class TritonBackend:
    """Backend protocol over ``tritonclient.grpc.aio``. See the module docstring."""

    def __init__(self, config: TritonModelConfig, metrics: BackendMetrics) -> None:
        self._config = config
        self._url = config.endpoints[0].url
        self._prompter = Prompter(config.tokenizer)
        self._client: Any = None
        self._contract: contract.ModelContract | None = None
        self._streams: set[Any] = set()
        self._stopped = False
        labels = (config.name, BACKEND)
        self._requests = metrics.upstream_requests
        self._latency = metrics.upstream_latency.labels(*labels)
        self._ttft = metrics.upstream_ttft.labels(*labels)
        self._up = metrics.upstream_up.labels(*labels)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._stopped = False
        await asyncio.to_thread(self._prompter.load)
        self._client = triton_aio.InferenceServerClient(
            self._url, channel_args=_channel_args(self._config)
        )
        try:
            await self._check_contract()
        except BaseException:
            await self._close_client()
            raise
        self._up.set(1)

    async def stop(self) -> None:
        self._stopped = True
        for call in list(self._streams):
            call.cancel()
        await self._close_client()
        self._up.set(0)

    async def ready(self) -> bool:
        if self._client is None or self._stopped:
            return False
        try:
            await self._require_ready()
        except BackendError:
            self._up.set(0)
            return False
        self._up.set(1)
        return True

    def info(self) -> ModelInfo:
        # Constraints travel as vLLM's structured_outputs (Triton's vLLM backend and the
        # CPU demo model in deploy/triton both honour them); tool calls as Hermes markup.
        return ModelInfo(
            features=TEXT_GENERATION | {Feature.TOOLS, Feature.JSON_OBJECT, Feature.JSON_SCHEMA},
            max_context=self._config.max_context,
            memory_bytes=self._config.memory_bytes,
            owned_by="triton",
            extra={"url": self._url, "triton_model": self._config.triton_model},
        )

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    # ------------------------------------------------------------------ health + contract

    async def _require_ready(self) -> None:
        """Raise UpstreamUnavailable / NotReady unless server and model are ready."""
        timeout = self._config.connect_timeout
        name, version = self._config.triton_model, self._config.model_version
        try:
            live = await self._client.is_server_live(client_timeout=timeout)
            if not live:
                raise UpstreamUnavailable(f"Triton at {self._url} is not live")
            model_ready = await self._client.is_model_ready(name, version, client_timeout=timeout)
        except InferenceServerException as exc:
            raise _map_client_error(exc, self._url) from exc
        if not model_ready:
            raise NotReady(f"Triton model {name!r} is not ready", retry_after=RETRY_AFTER)

    async def _check_contract(self) -> contract.ModelContract:
        await self._require_ready()
        name = self._config.triton_model
        try:
            metadata = await self._client.get_model_metadata(
                name,
                self._config.model_version,
                as_json=True,
                client_timeout=self._config.connect_timeout,
            )
        except InferenceServerException as exc:
            raise _map_client_error(exc, self._url) from exc
        self._contract = contract.check_metadata(name, metadata)
        return self._contract

    # ------------------------------------------------------------------ generation

    def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        return self._generate(request)

    async def _admit(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        """The rendered prompt and the ``stream_infer`` payload, or the refusal."""
        if self._stopped:
            raise BackendCrashed("the Triton backend is stopped")
        if self._client is None:
            raise NotReady(f"the Triton backend for {self._config.name!r} is not started")
        _refuse_unsupported(request)
        text = await asyncio.to_thread(self._prompter.render, request)
        model_contract = self._contract or await self._check_contract()
        return text, {
            "model_name": self._config.triton_model,
            "model_version": self._config.model_version,
            "inputs": contract.build_inputs(
                text, request.sampling, model_contract, structured_outputs(request)
            ),
            "request_id": request.request_id,
        }

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        text, payload = await self._admit(request)
        sent_wall = time.time()
        sent = time.monotonic()
        call = self._client.stream_infer(
            _one(payload),
            stream_timeout=self._config.total_timeout,
            headers=dict(request.trace_headers) or None,  # gRPC metadata: trace context
        )
        self._streams.add(call)
        status = "error"
        pieces: list[str] = []
        parser = ToolCallParser(0) if tools_active(request) else None
        reported_out = 0
        last = contract.Chunk(text="", final=False)
        answered = False
        try:
            async with contextlib.aclosing(self._chunks(call, sent)) as chunks:
                async for chunk in chunks:
                    if not answered:
                        # Started only once Triton answered: a refusal (queue full, model
                        # gone) is its first answer, so it is raised before Started and
                        # the service can still answer its HTTP status or fall back.
                        answered = True
                        yield Started(request.arrival_time or sent_wall, sent_wall)
                    last = chunk
                    reported_out += chunk.num_output_tokens or 0
                    if chunk.text:
                        pieces.append(chunk.text)
                        tokens = chunk.num_output_tokens or 1
                        for event in content_events(parser, chunk.text, tokens):
                            yield event
            if self._stopped and not last.final:  # stop() cancelled the call under us
                raise BackendCrashed("the Triton backend was stopped")
            status = "ok"
        except (asyncio.CancelledError, GeneratorExit):
            status = "cancelled"
            raise
        except BackendError as exc:
            status = _status_of(exc)
            if isinstance(exc, NotReady):
                self._contract = None  # the server may come back with another model
            if self._stopped and not isinstance(exc, BackendCrashed):
                raise BackendCrashed("the Triton backend was stopped") from exc
            raise
        finally:
            call.cancel()  # no-op when the stream already ended
            self._streams.discard(call)
            upstream_seconds = time.monotonic() - sent
            self._latency.observe(upstream_seconds)
            self._requests.labels(self._config.name, BACKEND, status).inc()

        completion = "".join(pieces)
        prompt_tokens, completion_tokens = await self._usage(text, completion, last, reported_out)
        reason = contract.finish_reason(
            last.finish_reason, completion_tokens, request.sampling.max_tokens
        )
        tail, reason = closing_events(parser, reason)
        for event in tail:
            yield event
        yield Finished(0, reason)
        yield Usage(prompt_tokens, completion_tokens, upstream_seconds=upstream_seconds)

    async def _chunks(self, call: Any, sent: float) -> AsyncGenerator[contract.Chunk, None]:
        """Decoded responses until Triton's final one (or the stream ends), with the
        first-token and total deadlines applied and gRPC failures mapped."""
        cfg = self._config
        deadline = sent + cfg.total_timeout
        first = True
        iterator = call.__aiter__()
        while True:
            remaining = deadline - time.monotonic()
            wait = min(cfg.first_token_timeout, remaining) if first else remaining
            try:
                result, error = await asyncio.wait_for(anext(iterator), timeout=max(wait, 0.0))
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._stopped and task is not None and not task.cancelling():
                    # stop() cancelled the call, not our caller: the stream ends crashed
                    raise BackendCrashed("the Triton backend was stopped") from None
                raise
            except TimeoutError as exc:
                what = "first token" if first else "end of stream"
                raise UpstreamTimeout(
                    f"Triton model {cfg.triton_model!r}: no {what} within {wait:.1f}s"
                ) from exc
            except grpc.aio.AioRpcError as exc:
                raise _map_rpc_error(exc, self._url) from exc
            if error is not None:
                raise _map_stream_error(str(error), cfg.triton_model)
            chunk = contract.parse_result(result)
            if first:
                self._ttft.observe(time.monotonic() - sent)
                first = False
            yield chunk
            if chunk.final:
                return

    async def _usage(
        self, prompt: str, completion: str, last: contract.Chunk, reported_out: int
    ) -> tuple[int, int]:
        """Counts the model reported, else the tokenizer's (0 when there is neither)."""
        prompt_tokens = last.num_input_tokens
        if prompt_tokens is None:
            prompt_tokens = await asyncio.to_thread(self._prompter.count, prompt, prompt=True)
        completion_tokens: int | None = reported_out
        has_reported = self._contract is not None and (
            contract.NUM_OUTPUT_TOKENS in self._contract.outputs
        )
        if not has_reported:
            completion_tokens = await asyncio.to_thread(
                self._prompter.count, completion, prompt=False
            )
        return prompt_tokens or 0, completion_tokens or 0


def _channel_args(config: TritonModelConfig) -> list[tuple[str, int]]:
    """tritonclient's defaults plus a short reconnect backoff: gRPC's default grows to
    two minutes while the server is down, and a restarted Triton would stay unused
    that long. Keepalive pings stay off, as in tritonclient (Triton rejects eager ones)."""
    backoff_ms = int(min(config.connect_timeout, 2.0) * 1000)
    return [
        ("grpc.max_send_message_length", _MAX_MESSAGE),
        ("grpc.max_receive_message_length", _MAX_MESSAGE),
        ("grpc.initial_reconnect_backoff_ms", min(250, backoff_ms)),
        ("grpc.min_reconnect_backoff_ms", min(250, backoff_ms)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
    ]


async def _one(payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The request side of the stream: one request, then half-close."""
    yield payload


def _status_of(error: BackendError) -> str:
    """The ``status`` label of ``llmso_upstream_requests_total`` for a failed request."""
    if isinstance(error, UpstreamTimeout):
        return "timeout"
    if isinstance(error, NotReady):
        return "unavailable"
    return "error"


def _map_rpc_error(exc: grpc.aio.AioRpcError, url: str) -> BackendError:
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return UpstreamUnavailable(
            f"Triton at {url} is unavailable: {exc.details()}", retry_after=RETRY_AFTER
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return UpstreamTimeout(f"Triton at {url}: deadline exceeded")
    if code == grpc.StatusCode.CANCELLED:
        return UpstreamUnavailable(f"Triton at {url} cancelled the stream", retry_after=RETRY_AFTER)
    return UpstreamBadResponse(f"Triton at {url}: {code.name}: {exc.details()}")


def _map_client_error(exc: InferenceServerException, url: str) -> BackendError:
    status = str(exc.status() or "")
    message = exc.message() or str(exc)
    if "UNAVAILABLE" in status:
        return UpstreamUnavailable(f"Triton at {url} is unavailable: {message}")
    if "DEADLINE_EXCEEDED" in status:
        return UpstreamTimeout(f"Triton at {url}: no answer in time")
    if "NOT_FOUND" in status or any(h in message.lower() for h in _NOT_READY_HINTS):
        return NotReady(f"Triton at {url}: {message}", retry_after=RETRY_AFTER)
    return UpstreamBadResponse(f"Triton at {url}: {message}")


def _map_stream_error(message: str, model: str) -> BackendError:
    lowered = message.lower()
    if any(hint in lowered for hint in _NOT_READY_HINTS):
        return NotReady(f"Triton model {model!r} is not ready: {message}", retry_after=RETRY_AFTER)
    if "queue is full" in lowered:
        return Overloaded(f"Triton model {model!r} is busy: {message}", retry_after=RETRY_AFTER)
    if "unavailable" in lowered:
        return UpstreamUnavailable(f"Triton model {model!r}: {message}", retry_after=RETRY_AFTER)
    return UpstreamBadResponse(f"Triton model {model!r} failed: {message}")


def _refuse_unsupported(request: GenerationRequest) -> None:
    if request.sampling.n != 1:
        raise InvalidRequest("the triton backend returns one choice (n=1)", param="n")
    if request.sampling.logprobs is not None:
        raise InvalidRequest("the triton backend does not return logprobs", param="logprobs")
