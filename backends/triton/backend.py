"""TritonBackend: one model served by one or more Triton Inference Servers, over gRPC.

The model lives in Triton (its own process, possibly its own machine); the gateway keeps
one gRPC channel per replica (``servers.TritonServer``) and a tokenizer for chat
templates and token counts. Every request is one decoupled ``ModelStreamInfer`` call in
the vLLM-backend tensor contract (``contract.py``), so text arrives as Triton produces it.

Replicas (``replicas:``, or the single ``url``) share the machinery of
``backends.replicas``: a balance policy picks one per attempt (least_loaded reads each
server's ``nv_inference_pending_request_count`` for the served model, and TensorRT-LLM's
request metrics when present); a refusal before the first token (server gone, model not
ready, queue full) is retried on another replica, so the client never sees it while one
works; consecutive failures eject a replica; probes re-admit it.

Ownership: the event loop owns everything here. ``start`` opens the channels, loads the
tokenizer in a thread and checks the model's metadata against the contract on every
server that answers; ``generate`` streams, yielding ``Started`` only once a replica
answered (refusals come before it); closing its iterator early cancels the gRPC call on
the replica that has it, and Triton cancels the request (the model stops decoding);
``stop`` ends open streams with ``BackendCrashed``.

Reasoning: where the model names a ``reasoning_parser``, the gateway splits the thought
off the text Triton streams (``backends.reasoning``; the parser starts as the rendered
prompt says) before tool calls are read from the answer; the thought's tokens are counted
with the tokenizer (else one per chunk that carried thought). The thinking switch and
the effort are honoured where the chat template reads them (the gateway renders it); a
budget is not.

Errors: server unreachable -> UpstreamUnavailable (503); model not loaded or not ready
-> NotReady (503 + retry_after); no first token within ``first_token_timeout`` or no end
within ``total_timeout`` -> UpstreamTimeout (504); tensors not in the contract ->
ContractMismatch (502, at start); anything else Triton reports -> UpstreamBadResponse.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp

from backends.base import (
    TEXT_GENERATION,
    BackendCrashed,
    BackendError,
    BackendEvent,
    ContextLengthExceeded,
    Feature,
    Finished,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
    NotReady,
    RequestKind,
    SamplingParams,
    Started,
    Usage,
    effective_max_tokens,
)
from backends.errors import ContractMismatch
from backends.hop_metrics import BackendMetrics
from backends.prompter import Prompter
from backends.reasoning import (
    ReasoningFormat,
    ReasoningParser,
    reads_effort,
    reasoning_format,
    template_switch,
)
from backends.replicas.attempts import first_success
from backends.replicas.replica import Replica
from backends.replicas.replica_set import ReplicaSet, cancel
from backends.tool_markup.answer import ChoiceText
from backends.tool_markup.constraints import structured_outputs
from backends.tool_markup.markup import tools_active
from backends.tool_markup.parser import ToolCallParser
from backends.triton import contract
from backends.triton.errors import (
    retryable,
    status_of,
)
from backends.triton.servers import TritonServer, endpoints
from backends.triton.streaming import read_chunks
from config.schema import TritonModelConfig

BACKEND = "triton"


class _Open:
    """A stream that produced its first answer on one replica."""

    def __init__(self, server: TritonServer, call: Any, chunks: Any, first: Any, sent: float):
        self.server = server
        self.call = call
        self.chunks: AsyncGenerator[contract.Chunk, None] = chunks
        self.first: contract.Chunk | None = first
        self.sent = sent


class TritonBackend:
    """Backend protocol over ``tritonclient.grpc.aio``. See the module docstring."""

    def __init__(self, config: TritonModelConfig, metrics: BackendMetrics) -> None:
        self._config = config
        self._prompter = Prompter(config.tokenizer, config.chat_template)
        self._servers = {url: TritonServer(url, config) for url, _ in endpoints(config)}
        self._replicas = ReplicaSet(
            config, endpoints(config), metrics.replicas, scrape_model=config.triton_model
        )
        self._http: aiohttp.ClientSession | None = None
        self._streams: set[Any] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._stopped = False
        labels = (config.name, BACKEND)
        self._requests = metrics.upstream_requests
        self._latency = metrics.upstream_latency.labels(*labels)
        self._ttft = metrics.upstream_ttft.labels(*labels)
        self._up = metrics.upstream_up.labels(*labels)
        name = config.reasoning_parser
        self._reasoning: ReasoningFormat | None = reasoning_format(name) if name else None
        self._reasoning_features: frozenset[Feature] = frozenset()  # set by start()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._stopped = False
        await asyncio.to_thread(self._prompter.load)
        self._reasoning_features = self._reasoning_declared()
        for server in self._servers.values():
            server.open()
        try:
            await self._check_contracts()
        except BaseException:
            await self._close_all()
            raise
        self._http = aiohttp.ClientSession()
        self._replicas.start(self._probe, self._http, self._set_up)

    async def stop(self) -> None:
        self._stopped = True
        await self._replicas.stop()
        for call in list(self._streams):
            call.cancel()
        for task in list(self._closing):
            await cancel(task)
        await self._close_all()
        self._up.set(0)

    async def ready(self) -> bool:
        if self._stopped or not self._started():
            return False
        return await self._replicas.probe_all(self._probe)

    def info(self) -> ModelInfo:
        # Constraints travel as vLLM's structured_outputs (Triton's vLLM backend and the
        # CPU demo model in deploy/triton both honour them); tool calls as Hermes markup.
        urls = list(self._servers)
        structured = {Feature.TOOLS, Feature.JSON_OBJECT, Feature.JSON_SCHEMA}
        return ModelInfo(
            features=TEXT_GENERATION | structured | self._reasoning_features,
            max_context=self._config.max_context,
            memory_bytes=self._config.memory_bytes,
            owned_by="triton",
            extra={
                "url": urls[0] if urls else "",
                "triton_model": self._config.triton_model,
                "replicas": str(len(urls)),
            },
        )

    def _reasoning_declared(self) -> frozenset[Feature]:
        """What the thought can be asked: a switch or an effort the template reads."""
        if self._reasoning is None:
            return frozenset()
        template = self._prompter.template
        features = {Feature.REASONING}
        if template_switch(template) is not None:
            features.add(Feature.THINKING_SWITCH)
        if reads_effort(template):
            features.add(Feature.REASONING_EFFORT)
        return frozenset(features)

    def reconfigure(self, config: TritonModelConfig) -> None:
        """Hot reload of the replica list or balance fields only: new servers get a
        channel (probed at once), removed ones drain and then close theirs."""
        self._config = config
        listed = endpoints(config)
        for url, _ in listed:
            if url not in self._servers:
                self._servers[url] = server = TritonServer(url, config)
                if self._http is not None:
                    server.open()
        for replica in self._replicas.update(config, listed):
            server = self._servers.pop(replica.url)
            task = asyncio.create_task(self._close_after_drain(replica, server))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def replica_status(self) -> list[dict[str, object]]:
        return self._replicas.snapshot()

    async def _close_after_drain(self, replica: Replica, server: TritonServer) -> None:
        await replica.drained()
        await server.close()

    async def _close_all(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()
        for server in self._servers.values():
            await server.close()

    # ------------------------------------------------------------------ health + contract

    async def _probe(self, replica: Replica) -> bool:
        server = self._servers.get(replica.url)
        return server is not None and await server.probe()

    def _set_up(self) -> None:
        self._up.set(1 if self._replicas.up else 0)

    async def _check_contracts(self) -> None:
        """Probe every server and check the contract on each that answers; a mismatch
        anywhere is a configuration error. Fails when no server answers at all."""
        errors: list[BaseException] = []

        async def one(replica: Replica) -> bool:
            server = self._servers[replica.url]
            try:
                await server.check_contract()
            except ContractMismatch:
                raise
            except BackendError as exc:
                errors.append(exc)
                return False
            return True

        if not await self._replicas.probe_all(one):
            raise errors[0] if errors else NotReady(f"no Triton server for {self._config.name!r}")
        self._set_up()

    # ------------------------------------------------------------------ generation

    def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        return self._generate(request)

    async def _admit(self, request: GenerationRequest) -> tuple[str, SamplingParams]:
        """The rendered prompt and the sampling with its effective ``max_tokens``
        (``backends.base.effective_max_tokens``), or the refusal."""
        if self._stopped:
            raise BackendCrashed("the Triton backend is stopped")
        if not self._started():
            raise NotReady(f"the Triton backend for {self._config.name!r} is not started")
        _refuse_unsupported(request)
        text = await asyncio.to_thread(self._prompter.render, request)
        sampling = request.sampling
        room = None
        context = self._config.max_context
        if sampling.max_tokens is None and context is not None:
            # The room left after the prompt, where the tokenizer can count it.
            prompt = await asyncio.to_thread(self._prompter.count, text, prompt=True)
            if prompt is not None:
                if prompt >= context:
                    raise ContextLengthExceeded(
                        f"This model's maximum context length is {context} tokens; the "
                        f"prompt has {prompt} tokens.",
                        param="messages" if request.kind is RequestKind.CHAT else "prompt",
                    )
                room = context - prompt
        limit = effective_max_tokens(sampling.max_tokens, self._config.default_max_tokens, room)
        return text, replace(sampling, max_tokens=limit)

    async def _open(
        self, request: GenerationRequest, text: str, sampling: SamplingParams, replica: Replica
    ) -> _Open:
        """One attempt on one replica: send, and wait for Triton's first answer."""
        server = self._servers.get(replica.url)
        if server is None or server.client is None:
            raise NotReady(f"the Triton backend for {self._config.name!r} is not started")
        model_contract = server.contract or await server.check_contract()
        payload = {
            "model_name": self._config.triton_model,
            "model_version": self._config.model_version,
            "inputs": contract.build_inputs(
                text, sampling, model_contract, structured_outputs(request)
            ),
            "request_id": request.request_id,
        }
        sent = time.monotonic()
        call = server.client.stream_infer(
            _one(payload),
            stream_timeout=self._config.total_timeout,
            headers=dict(request.trace_headers) or None,  # gRPC metadata: trace context
        )
        self._streams.add(call)
        chunks = read_chunks(
            call, sent, server.url, cfg=self._config, ttft=self._ttft, stopped=self._stopped_now
        )
        try:
            first = await anext(chunks, None)
        except BaseException as exc:
            await chunks.aclose()
            call.cancel()
            self._streams.discard(call)
            self._count(exc)
            if isinstance(exc, NotReady):
                server.contract = None  # the server may come back with another model
            raise
        return _Open(server, call, chunks, first, sent)

    async def _open_any(
        self, request: GenerationRequest, text: str, sampling: SamplingParams
    ) -> tuple[_Open, Replica]:
        """Open on a replica, retrying refusals elsewhere before the first token."""

        async def attempt(replica: Replica) -> _Open:
            return await self._open(request, text, sampling, replica)

        opened, replica, _ = await first_success(
            self._replicas,
            request,
            attempt,
            retries=self._config.retries,
            retryable=retryable,
            stopping=lambda: self._stopped,
        )
        return opened, replica

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        text, sampling = await self._admit(request)
        sent_wall = time.time()
        opened, replica = await self._open_any(request, text, sampling)
        call, sent = opened.call, opened.sent
        status = "error"
        pieces: list[str] = []
        choice = ChoiceText(0, self._thinking(request, text), self._tools(request))
        reported_out = 0
        last = contract.Chunk(text="", final=False)
        try:
            # Started only once Triton answered: a refusal (queue full, model gone) is its
            # first answer, so it was raised before Started (and retried elsewhere).
            yield Started(request.arrival_time or sent_wall, sent_wall)
            async with contextlib.aclosing(opened.chunks) as chunks:
                chunk = opened.first
                while chunk is not None:
                    last = chunk
                    reported_out += chunk.num_output_tokens or 0
                    if chunk.text:
                        pieces.append(chunk.text)
                        tokens = chunk.num_output_tokens or 1
                        for event in choice.feed(chunk.text, tokens):
                            yield event
                    chunk = await anext(chunks, None)
            if self._stopped and not last.final:  # stop() cancelled the call under us
                raise BackendCrashed("the Triton backend was stopped")
            status = "ok"
        except (asyncio.CancelledError, GeneratorExit):
            status = "cancelled"
            raise
        except BackendError as exc:
            status = status_of(exc)
            raise self._failed(exc, replica, opened.server) from exc
        finally:
            call.cancel()  # no-op when the stream already ended
            self._streams.discard(call)
            replica.release()
            upstream_seconds = time.monotonic() - sent
            self._latency.observe(upstream_seconds)
            self._requests.labels(self._config.name, BACKEND, status).inc()

        completion = "".join(pieces)
        model_contract = opened.server.contract
        prompt_tokens, completion_tokens = await self._usage(
            text, completion, last, reported_out, model_contract
        )
        reason = contract.finish_reason(last.finish_reason, completion_tokens, sampling.max_tokens)
        tail, reason = choice.finish(reason)
        for event in tail:
            yield event
        yield Finished(0, reason)
        reasoning_tokens = await self._reasoning_tokens(choice)
        yield Usage(
            prompt_tokens,
            completion_tokens,
            upstream_seconds=upstream_seconds,
            reasoning_tokens=min(reasoning_tokens, completion_tokens),
        )

    def _thinking(self, request: GenerationRequest, prompt: str) -> ReasoningParser | None:
        """The choice's reasoning parser, starting where the rendered prompt leaves it
        (chat only: a completion's text is never split)."""
        fmt = self._reasoning
        if fmt is None or request.kind is not RequestKind.CHAT:
            return None
        return fmt.parser(in_thought=fmt.starts_in_thought(prompt, request.reasoning.thinking))

    @staticmethod
    def _tools(request: GenerationRequest) -> ToolCallParser | None:
        return ToolCallParser(0) if tools_active(request) else None

    async def _reasoning_tokens(self, choice: ChoiceText) -> int:
        """The thought's tokens, by the tokenizer where there is one."""
        thought = choice.thought
        if not thought:
            return 0
        counted = await asyncio.to_thread(self._prompter.count, thought, prompt=False)
        return choice.thought_pieces if counted is None else counted

    def _failed(self, error: BackendError, replica: Replica, server: TritonServer) -> BackendError:
        """Account a mid-stream failure to its replica; the error to raise."""
        replica.account(error, time.monotonic())
        if isinstance(error, NotReady):
            server.contract = None  # the server may come back with another model
        if self._stopped and not isinstance(error, BackendCrashed):
            return BackendCrashed("the Triton backend was stopped")
        return error

    def _started(self) -> bool:
        return any(server.client is not None for server in self._servers.values())

    def _stopped_now(self) -> bool:
        return self._stopped

    def _count(self, error: BaseException) -> None:
        """One failed attempt in ``llmso_upstream_requests_total``."""
        if isinstance(error, asyncio.CancelledError | GeneratorExit):
            status = "cancelled"
        else:
            status = status_of(error) if isinstance(error, BackendError) else "error"
        self._requests.labels(self._config.name, BACKEND, status).inc()

    async def _usage(
        self,
        prompt: str,
        completion: str,
        last: contract.Chunk,
        reported_out: int,
        model_contract: contract.ModelContract | None,
    ) -> tuple[int, int]:
        """Counts the model reported, else the tokenizer's (0 when there is neither)."""
        prompt_tokens = last.num_input_tokens
        if prompt_tokens is None:
            prompt_tokens = await asyncio.to_thread(self._prompter.count, prompt, prompt=True)
        completion_tokens: int | None = reported_out
        has_reported = model_contract is not None and (
            contract.NUM_OUTPUT_TOKENS in model_contract.outputs
        )
        if not has_reported:
            completion_tokens = await asyncio.to_thread(
                self._prompter.count, completion, prompt=False
            )
        return prompt_tokens or 0, completion_tokens or 0


async def _one(payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The request side of the stream: one request, then half-close."""
    yield payload


def _refuse_unsupported(request: GenerationRequest) -> None:
    if request.sampling.n != 1:
        raise InvalidRequest("the triton backend returns one choice (n=1)", param="n")
    if request.sampling.logprobs is not None:
        raise InvalidRequest("the triton backend does not return logprobs", param="logprobs")
