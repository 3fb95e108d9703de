"""``OpenAIProxyBackend``: serve a model by relaying to an OpenAI-compatible server.

Lifecycle: ``start()`` creates the lean keep-alive pool of the data path
(``backends.openai_proxy.http1``: generation streams) and one aiohttp session for the rest (probes,
scrapes, embeddings; aiohttp measured ~4x cheaper per relayed stream than httpx, the
lean pool cheaper still), probes every
replica once and starts the periodic health and ``/metrics`` scrape tasks; ``stop()``
ends open streams (each raises ``BackendCrashed``), cancels the tasks and closes the
session.

Ownership: every mutable field (session, replicas, open streams, the slot gate and the
prober with theirs) is owned by the event loop that called ``start()``; nothing here is
thread-safe.

Per request (``generate``): refuse at once while every replica is ejected; wait a
bounded time for a ``max_concurrency`` slot, in priority and fair-share order between
client keys (``slots``; else ``Overloaded``); pick a replica
(``replicas``, ``balance``) and send the request streaming with ``include_usage``; on
unavailability (connection errors, 502/503, 429) retry, on another replica when one is
left, with backoff otherwise, only until the first event has been produced, so the
client never sees a retried stream; relay events; finally yield ``Usage`` with the
upstream's counts (or our own count, see ``stream``) and the seconds spent waiting on
the upstream. A stream that breaks after that resumes on another replica where the
model's ``failover`` is ``mid_stream`` (``resume``). Closing the iterator early closes
the connection to the replica serving it, and that engine aborts.

LoRA adapters (``adapters``; ``AdapterHost``): a request for one is sent with the
adapter's name as ``model``, to a replica that serves it; where none does, the adapter
is loaded first on the least-loaded replica (``backends.replicas.adapters``, the vLLM
calls in ``adapters.py``).

Whole answers (embeddings, scores, tokenize): one POST with the same breaker, slots and
retries as a stream's opening (a retry is safe: nothing has reached the client). What
the upstream serves besides generation is the config's declaration (``declared``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any, TypeVar

import aiohttp
import orjson

from backends.base import (
    AdapterSpec,
    BackendCrashed,
    BackendError,
    BackendEvent,
    Feature,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
    ModelNotFound,
    NotReady,
    Started,
    UpstreamTimeout,
    Usage,
)
from backends.embeddings import EmbeddingRequest, EmbeddingResult
from backends.hop_metrics import BackendMetrics
from backends.openai_proxy import rerank, tokenize
from backends.openai_proxy.adapters import UpstreamAdapters
from backends.openai_proxy.embeddings import (
    EMBEDDINGS_PATH,
    embeddings_body,
    outcome_label,
    post_embeddings,
)
from backends.openai_proxy.engines import EngineProfile, profile_for, split_base_url
from backends.openai_proxy.errors import is_retryable
from backends.openai_proxy.http1 import Pool
from backends.openai_proxy.payload import CHAT_PATH, build_body, estimate_prompt_tokens
from backends.openai_proxy.probes import Prober
from backends.openai_proxy.relay import (
    EmptyStream,
    HopMetrics,
    UpstreamStream,
    post_json,
    unhidden_error,
)
from backends.openai_proxy.resume import Resume, Resumer, SeamMismatch
from backends.openai_proxy.scored import scored_body, scored_events
from backends.openai_proxy.slots import SlotGate
from backends.openai_proxy.stream import ChunkTranslator
from backends.reasoning import ReasoningFormat, reasoning_format
from backends.replicas.adapters import Adapters
from backends.replicas.attempts import GiveUp, first_success
from backends.replicas.replica import Replica
from backends.replicas.replica_set import ReplicaSet
from backends.scoring import ScoreRequest, ScoreResult
from backends.tokenizing import DetokenizeRequest, TokenizeRequest, TokenizeResult
from config.schema import OpenAIModelConfig

T = TypeVar("T")


class OpenAIProxyBackend:
    """One configured model served by an upstream engine server. See the module doc."""

    def __init__(self, config: OpenAIModelConfig, metrics: BackendMetrics) -> None:
        self._config = config
        self._profile = profile_for(
            config.engine, config.health_path, send_priority=config.send_priority
        )
        labels = (config.name, "openai")
        self._hop = HopMetrics(
            latency=metrics.upstream_latency.labels(*labels),
            ttft=metrics.upstream_ttft.labels(*labels),
            requests=metrics.upstream_requests,
            labels=labels,
        )
        self._up_gauge = metrics.upstream_up.labels(*labels)
        self._added: dict[str, str | None] = {}  # adapters added at run time, by name
        ops = UpstreamAdapters(
            lambda: self._session,
            list_seconds=2 * config.connect_timeout,
            load_seconds=config.first_token_timeout,
        )
        self._adapters = Adapters(config.name, ops, self._catalog(), config.load_adapters)
        self._replicas = ReplicaSet(
            config, _endpoints(config), metrics.replicas, adapters=self._adapters
        )
        self._resumer = Resumer(config, self._profile, metrics.replicas)
        self._reasoning: ReasoningFormat | None = (
            reasoning_format(config.reasoning_parser) if config.reasoning_parser else None
        )
        self._slots = SlotGate(config)
        self._session: aiohttp.ClientSession | None = None
        self._pool: Pool | None = None  # the data path's connections; set with _session
        self._streams: set[UpstreamStream] = set()
        self._stopping = False
        self._prober = Prober(config, self._profile)
        self._features = declared(config, self._profile)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        config = self._config
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        key = config.api_key or (os.environ.get(config.api_key_env) if config.api_key_env else None)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        # sock_read bounds the wait for the first token and every later gap between bytes;
        # total bounds the whole request. The semaphore, not the pool, limits concurrency.
        timeout = aiohttp.ClientTimeout(
            total=config.total_timeout,
            sock_connect=config.connect_timeout,
            sock_read=config.first_token_timeout,
        )
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=timeout,
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
            json_serialize=lambda value: orjson.dumps(value).decode(),
        )
        self._pool = Pool(
            headers=headers,
            connect_timeout=config.connect_timeout,
            read_timeout=config.first_token_timeout,
            total_timeout=config.total_timeout,
        )
        self._prober.session = self._session
        await self._resumer.load()
        await self._replicas.probe_all(self._prober.probe)
        self._set_up()
        self._replicas.start(self._prober.probe, self._session, self._set_up)

    async def stop(self) -> None:
        self._stopping = True
        await self._replicas.stop()
        for stream in list(self._streams):
            stream.close()
        session, self._session = self._session, None
        self._prober.session = None
        if session is not None:
            await session.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        self._up_gauge.set(0)

    async def ready(self) -> bool:
        return self._session is not None and not self._stopping and self._replicas.up

    def info(self) -> ModelInfo:
        return ModelInfo(
            max_context=self._config.max_context or self._prober.context,
            owned_by=self._config.engine,
            features=self._features,
            extra={
                "backend": "openai",
                "engine": self._config.engine,
                "upstream_model": self._upstream_model,
                "upstream_up": "1" if self._replicas.up else "0",
                "replicas": str(len(self._replicas.replicas)),
            },
        )

    @property
    def _upstream_model(self) -> str:
        """The model id sent upstream: configured, or learnt by the first probe."""
        return self._prober.model

    def _model_for(self, request: GenerationRequest) -> str:
        """The ``model`` sent upstream for ``request``: its adapter's name (an engine
        serves each adapter as a model of its own), else the base model's id."""
        return request.adapter or self._upstream_model

    def _check_adapter(self, request: GenerationRequest) -> None:
        if request.adapter is not None and not self._adapters.known(request.adapter):
            raise InvalidRequest(
                f"model {self._config.name!r} has no adapter {request.adapter!r}",
                param="model",
            )

    async def _adapter_ready(self, replica: Replica, request: GenerationRequest) -> None:
        if request.adapter is not None:
            await self._adapters.ready(replica, request.adapter)

    def reconfigure(self, config: OpenAIModelConfig) -> None:
        """Hot reload of the replica list, balance fields and adapters; adapters added at
        run time stay (a configured one of the same name wins)."""
        self._config = config
        self._replicas.update(config, _endpoints(config))
        self._adapters.update(self._catalog(), config.load_adapters)

    def _catalog(self) -> dict[str, str | None]:
        """Every adapter served: name -> the path the upstream loads it from."""
        configured = {adapter.name: adapter.source for adapter in self._config.adapters}
        return {**self._added, **configured}

    async def add_adapter(self, adapter: AdapterSpec) -> None:
        """Serve ``adapter`` from now on; it is loaded on first use where no replica
        lists it (the path is the upstream's, so it cannot be checked here)."""
        self._added[adapter.name] = adapter.source
        self._adapters.add(adapter.name, adapter.source)

    async def remove_adapter(self, name: str) -> None:
        """Stop serving ``name`` and unload it from the replicas that list it (vLLM's
        unload drops the name; requests already running keep their adapter). Raises
        ``ModelNotFound`` for a name not served."""
        if not self._adapters.known(name):
            raise ModelNotFound(
                f"model {self._config.name!r} has no adapter {name!r}", param="model"
            )
        self._added.pop(name, None)
        self._adapters.forget(name)
        await self._adapters.unload(name, self._replicas.replicas)

    def replica_status(self) -> list[dict[str, object]]:
        return self._replicas.snapshot()

    # ------------------------------------------------------------------ data path

    def _admit(self) -> aiohttp.ClientSession:
        """The session for one more request; refused while stopped or the breaker is open."""
        session = self._session
        if session is None or self._stopping:
            raise NotReady(f"model {self._config.name!r} is not started")
        now = time.monotonic()
        if not self._replicas.candidates((), now):
            raise self._replicas.unavailable(now)
        return session

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        queued_at = time.time()
        self._check_adapter(request)
        session = self._admit()
        await self._slots.take(request.priority, request.tenant)
        try:
            if self._stopping:  # stopped while this request waited for a slot
                raise BackendCrashed("backend stopped")
            path, body = build_body(
                request,
                self._model_for(request),
                self._profile,
                default_max_tokens=self._config.default_max_tokens,
            )
            if request.prompt_logprobs is not None:
                async for event in self._scored(session, path, body, request, queued_at):
                    yield event
                return
            stream, replica, started_at, first = await self._open(session, path, body, request)
            resume = self._resumer.track(request)
            self._streams.add(stream)
            try:
                yield Started(queued_at=queued_at, started_at=started_at)
                events = first
                while True:
                    if resume is not None:
                        resume.record(events)
                    for event in events:
                        yield event
                    if stream.ended:
                        break
                    try:
                        events = await self._next(stream, replica)
                        if resume is not None:
                            events = resume.replay(events)
                    except BackendError as error:
                        if resume is None:
                            raise
                        resumed = await self._resume(session, request, resume, error, replica)
                        if resumed is None:  # nothing left to ask for
                            for event in resume.closing():
                                yield event
                            break
                        self._streams.discard(stream)
                        stream.close()
                        replica.release()
                        resume.waited += stream.waited
                        stream, replica, events = resumed
                        self._streams.add(stream)
                yield self._usage(stream, request, resume)
            finally:
                self._streams.discard(stream)
                stream.close()
                replica.release()
        finally:
            self._slots.free()

    async def _scored(
        self,
        session: aiohttp.ClientSession,
        path: str,
        body: bytes,
        request: GenerationRequest,
        queued_at: float,
    ) -> AsyncIterator[BackendEvent]:
        """A scored prompt: one whole answer (``scored.py``), retried like a stream's
        opening (nothing has reached the client before the answer is whole)."""
        data = scored_body(orjson.loads(body), request)

        async def attempt(replica: Replica) -> Any:
            await self._adapter_ready(replica, request)
            try:
                return await post_json(session, split_base_url(replica.url)[1] + path, data)
            except BackendError as error:
                self._hop.count(outcome_label(error))
                raise

        started_at = time.time()
        payload, replica, _ = await self._walk(request, attempt)
        replica.release()
        self._hop.count("200")
        waited = time.time() - started_at
        self._hop.latency.observe(waited)
        events, (prompt, completion) = scored_events(payload, request)
        yield Started(queued_at=queued_at, started_at=started_at)
        for event in events:
            yield event
        yield Usage(prompt, completion, upstream_seconds=waited)

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        """Relay to the upstream's /v1/embeddings: same breaker, slots and retries as
        generation (a retry is safe: nothing has reached the client)."""
        queued_at = time.time()
        session = self._admit()
        body = embeddings_body(request, self._upstream_model)
        try:
            async with asyncio.timeout(request.timeout):
                await self._slots.take()
                try:
                    started_at = time.time()
                    vectors, tokens = await self._post_embeddings(session, body, request.size)
                finally:
                    self._slots.free()
        except TimeoutError:
            raise UpstreamTimeout(f"upstream embeddings took over {request.timeout:g}s") from None
        waited = time.time() - started_at
        self._hop.latency.observe(waited)
        if tokens is None:  # an upstream without usage: count ~4 characters a token
            tokens = sum((len(t) + 3) // 4 for t in request.texts) or sum(
                len(ids) for ids in request.token_ids
            )
        return EmbeddingResult(vectors, tokens, queued_at, started_at, upstream_seconds=waited)

    async def score(self, request: ScoreRequest) -> ScoreResult:
        """Relay to the upstream's /rerank or /score (``rerank.py``)."""
        queued_at = time.time()
        path, body = rerank.score_body(request, self._upstream_model)
        answer, started_at, waited = await self._whole(path, body, request.timeout, path)
        scores, tokens = rerank.parse_scores(answer, path, len(request.text_2))
        if tokens is None:  # an upstream without usage: count ~4 characters a token
            tokens = sum((len(t) + 3) // 4 for t in request.text_1 + request.text_2)
        return ScoreResult(scores, tokens, queued_at, started_at, upstream_seconds=waited)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        body = tokenize.tokenize_body(request, self._upstream_model)
        path = tokenize.TOKENIZE_PATH
        answer, _, _ = await self._whole(path, body, self._config.first_token_timeout, path)
        return tokenize.parse_tokenize(answer, self.info().max_context)

    async def detokenize(self, request: DetokenizeRequest) -> str:
        body = tokenize.detokenize_body(request, self._upstream_model)
        path = tokenize.DETOKENIZE_PATH
        answer, _, _ = await self._whole(path, body, self._config.first_token_timeout, path)
        return tokenize.parse_detokenize(answer)

    async def _whole(
        self, path: str, body: bytes, limit_s: float, what: str
    ) -> tuple[Any, float, float]:
        """POST ``body`` to ``path`` under a replica's server root for one whole JSON
        answer, within ``limit_s`` seconds, slot and retries included: ``(answer,
        time.time() when sent, seconds spent on the upstream)``."""
        session = self._admit()

        async def attempt(replica: Replica) -> Any:
            try:
                return await post_json(session, split_base_url(replica.url)[0] + path, body)
            except BackendError as error:
                self._hop.count(outcome_label(error))
                raise

        try:
            async with asyncio.timeout(limit_s):
                await self._slots.take()
                try:
                    started_at = time.time()
                    answer, replica, _ = await self._walk(None, attempt)
                finally:
                    self._slots.free()
        except TimeoutError:
            raise UpstreamTimeout(f"upstream {what} took over {limit_s:g}s") from None
        replica.release()
        self._hop.count("200")
        waited = time.time() - started_at
        self._hop.latency.observe(waited)
        return answer, started_at, waited

    async def _post_embeddings(
        self, session: aiohttp.ClientSession, body: bytes, expected: int
    ) -> tuple[tuple[tuple[float, ...], ...], int | None]:
        """POST to a replica, retrying on another one (then after a backoff) while the
        error is retryable, the same walk as generation (``first_success``)."""

        async def attempt(replica: Replica) -> tuple[tuple[tuple[float, ...], ...], int | None]:
            _, api = split_base_url(replica.url)
            try:
                return await post_embeddings(session, api + EMBEDDINGS_PATH, body, expected)
            except BackendError as error:
                self._hop.count(outcome_label(error))
                raise

        answer, replica, _ = await self._walk(None, attempt)
        replica.release()
        self._hop.count("200")
        return answer

    async def _open(
        self,
        session: aiohttp.ClientSession,
        path: str,
        body: bytes,
        request: GenerationRequest,
        *,
        exclude: Collection[str] = (),
        retries: int | None = None,
    ) -> tuple[UpstreamStream, Replica, float, list[BackendEvent]]:
        """Send with retries until a replica produced its first events (``_walk``)."""
        chat = path == CHAT_PATH
        trace_headers = dict(request.trace_headers) or None
        failed_waits: list[float] = []

        async def attempt(replica: Replica) -> tuple[UpstreamStream, float, list[BackendEvent]]:
            await self._adapter_ready(replica, request)
            url = split_base_url(replica.url)[1] + path
            started_at = time.time()
            translator = self._translator(request, chat=chat)
            stream = UpstreamStream(url, translator, self._hop)
            try:
                await stream.open(self._data_pool(), body, trace_headers)
                return stream, started_at, await stream.first_events()
            except EmptyStream as empty:
                stream.close()
                if self._profile.hides_stream_errors:
                    raise GiveUp(await unhidden_error(session, url, body, empty)) from None
                failed_waits.append(stream.waited)
                raise empty.cause or empty from None
            except BackendError:
                stream.close()
                failed_waits.append(stream.waited)
                raise
            except BaseException:
                stream.close()
                raise

        (stream, started_at, first), replica, slept = await self._walk(
            request, attempt, exclude, retries
        )
        stream.waited += slept + sum(failed_waits)
        return stream, replica, started_at, first

    def _translator(self, request: GenerationRequest, *, chat: bool) -> ChunkTranslator:
        """The stream's translator, splitting the thought here where the model names a
        parser (the upstream's own reasoning fields win: ``stream``)."""
        fmt = self._reasoning
        if fmt is None:
            return ChunkTranslator(chat=chat, n=request.sampling.n)
        in_thought = fmt.starts_in_thought(None, request.reasoning.thinking)
        return ChunkTranslator(
            chat=chat, n=request.sampling.n, reasoning=fmt, in_thought=in_thought
        )

    async def _walk(
        self,
        request: GenerationRequest | None,
        attempt: Callable[[Replica], Awaitable[T]],
        exclude: Collection[str] = (),
        retries: int | None = None,
    ) -> tuple[T, Replica, float]:
        if retries is None:
            retries = 0 if self._resumer.mode == "off" else self._config.retries
        return await first_success(
            self._replicas,
            request,
            attempt,
            retries=retries,
            retryable=is_retryable,
            stopping=lambda: self._stopping,
            exclude=exclude,
        )

    async def _resume(
        self,
        session: aiohttp.ClientSession,
        request: GenerationRequest,
        resume: Resume,
        error: BackendError,
        broken: Replica,
    ) -> tuple[UpstreamStream, Replica, list[BackendEvent]] | None:
        """The stream continuing ``request`` after its stream on ``broken`` failed with
        ``error`` (``resume``), opened on another replica first; None when the answer
        needs nothing more. Raises ``error`` when it may not resume, or the walk's error
        when no replica continued it."""
        if resume.complete(request):
            return None
        resumer = self._resumer
        resumer.check(resume, error)
        # A continuation that disagreed at the seam came from a healthy replica.
        exclude = () if isinstance(error, SeamMismatch) else (broken.url,)
        while True:
            path, body = await resumer.continuation(request, resume, self._model_for(request))
            retries = resumer.retries_left(resume)
            resume.points.append(resume.tokens)
            try:
                stream, replica, _, first = await self._open(
                    session, path, body, request, exclude=exclude, retries=retries
                )
            except BackendError:
                resumer.count("failed")
                raise
            try:
                first = resume.replay(first)
            except SeamMismatch:
                # Once: the next continuation carries the whole text, withholding none.
                resumer.mismatched(request)
                stream.close()
                replica.release()
                continue
            resumer.resumed(request, resume, broken, replica, error)
            return stream, replica, first

    def _data_pool(self) -> Pool:
        pool = self._pool
        if pool is None:  # stopped while this request was being sent
            raise BackendCrashed("backend stopped")
        return pool

    async def _next(self, stream: UpstreamStream, replica: Replica) -> list[BackendEvent]:
        try:
            return await stream.next_events()
        except BackendError as error:
            replica.account(error, time.monotonic())
            if self._stopping:
                raise BackendCrashed("backend stopped") from error
            raise

    def _usage(
        self, stream: UpstreamStream, request: GenerationRequest, resume: Resume | None
    ) -> Usage:
        translator = stream.translator
        if resume is not None and resume.resumes:
            usage = resume.usage(translator, request, resume.waited + stream.waited)
            self._resumer.charge(usage)
            return usage
        if translator.usage is not None:
            prompt, completion = translator.usage
        else:
            prompt, completion = estimate_prompt_tokens(request), translator.counted_tokens
        return Usage(
            prompt,
            completion,
            upstream_seconds=stream.waited,
            reasoning_tokens=min(translator.reasoning_tokens, completion),
            cached_tokens=min(translator.reported_cached, prompt),
        )

    # ------------------------------------------------------------------ health

    def _set_up(self) -> None:
        self._up_gauge.set(1 if self._replicas.up else 0)


POOLING_TAGS = frozenset({"embed", "score", "rerank"})
"""Capabilities that mark the upstream as a pooling model: it does not generate."""


def declared(config: OpenAIModelConfig, profile: EngineProfile) -> frozenset[Feature]:
    """What the relay serves for ``config``: its ``capabilities`` say what the upstream
    is. ``embed``: /v1/embeddings; ``score`` or ``rerank``: /v1/score and /v1/rerank
    (vLLM's /score and /rerank); any of those: a pooling model, so no generation;
    else the engine's generation features, with token-id prompts and ``suffix``
    forwarded for the upstream to accept or refuse. ``tokenize`` declares vLLM's
    /tokenize and /detokenize, which an ``engine: vllm`` upstream always serves."""
    tags = set(config.capabilities)
    features: set[Feature] = set()
    if not tags & POOLING_TAGS:
        features |= profile.features | {Feature.PROMPT_TOKEN_IDS, Feature.SUFFIX}
    if "embed" in tags:
        features.add(Feature.EMBEDDINGS)
    if tags & {"score", "rerank"}:
        features.add(Feature.SCORE)
    if "tokenize" in tags or profile.kind == "vllm":
        features.add(Feature.TOKENIZE)
    return frozenset(features)


def _endpoints(config: OpenAIModelConfig) -> list[tuple[str, str | None]]:
    """Each replica's URL and metrics page (the server root's ``/metrics`` by default)."""
    return [
        (e.url, e.metrics_url or split_base_url(e.url)[0] + "/metrics") for e in config.endpoints
    ]
