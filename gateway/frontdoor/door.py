"""The front door: what every generation route passes through, in one place.

``FrontDoor.serve`` wraps a generation route's handler: it creates the request's
``RequestRecord`` (so a request refused at the door is still counted and logged, model
``unrouted``), checks ``Host``, method, ``Content-Type`` and the client key, bounds the
time the body may take, and at the end settles the request's token reservation and
counts it per key. A handler calls ``admit(scope, request)`` once it has parsed the
body: that checks the key's model allow-list and takes the request's share of its
limits, all or nothing. ``Pass`` (one per request, in the scope under ``PASS``) carries
the outcome, and adds OpenAI's ``x-ratelimit-*`` headers (and CORS ones) to whatever
response the handler sends.

``FrontDoor`` is owned by the app; ``reconfigure`` swaps in a new key ring on reload.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry

from backends.base import ApiError, GenerationRequest
from config.schema import AppConfig
from gateway.errors import MethodNotAllowed, error_body
from gateway.frontdoor.errors import QuotaExceeded, RateLimited
from gateway.frontdoor.guarded import GuardedStore, open_store
from gateway.frontdoor.keys import (
    ANONYMOUS,
    OPEN_DOOR,
    UNAUTHENTICATED,
    Client,
    KeyRing,
    NamedAdapter,
    allowed_candidates,
    not_found,
)
from gateway.frontdoor.limits import Ask, Settlement, Verdict, Window
from gateway.frontdoor.metrics import KeyMetrics
from gateway.frontdoor.web import BodyDeadline, WebGuard, request_id
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.record import FinishSink, RequestRecord
from gateway.registry import ModelRegistry

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

PASS = "llmso.pass"
_JSON = (b"content-type", b"application/json")
_REFUSALS = {
    "rpm": "Rate limit reached for requests per minute",
    "tpm": "Rate limit reached for tokens per minute",
    "parallel": "Too many requests in flight for this key",
}


class FrontDoor:
    def __init__(
        self,
        config: AppConfig,
        registry: ModelRegistry,
        metrics: GatewayMetrics,
        prometheus: CollectorRegistry,
        *,
        bind_host: str | None,
    ) -> None:
        self.web = WebGuard(config.server, bind_host)
        self.keys = KeyRing(config.auth)
        self.key_metrics = KeyMetrics(prometheus)
        self.store = GuardedStore(open_store(config.limits), config.limits, self.key_metrics)
        self.unset_max_tokens = config.limits.unset_max_tokens
        self.registry = registry
        self._metrics = metrics
        # Handed every record the door finishes (the console's stats window); the app
        # appends to it once, at build time.
        self.finish_sinks: list[FinishSink] = []

    def reconfigure(self, config: AppConfig) -> None:
        """Apply a reloaded config's keys (the store and ``server:`` need a restart)."""
        self.keys = KeyRing(config.auth)
        log.info("client keys reloaded: %d key(s)", len(self.keys.names))

    async def close(self) -> None:
        await self.store.close()

    def _model_filter(self, client: Client) -> Callable[[str], bool] | None:
        """``RequestRecord.may_use`` for ``client``: the routers of every route skip the
        models it returns False for (``keys.allowed_candidates``). Reads the registry's
        config at call time, so it follows reloads."""
        if client.models is None:
            return None
        registry = self.registry

        def may_use(name: str) -> bool:
            for model in registry.config.models:
                if model.name == name:
                    return client.may_use(model)
                for adapter in getattr(model, "adapters", ()):
                    if adapter.name == name:
                        own = NamedAdapter(adapter.name, adapter.aliases)
                        return client.may_use_adapter(model, own)
            return False

        return may_use

    def client_named(self, name: str) -> Client | None:
        """The client key configured under ``name`` now (a batch runs as the key that
        created it); ``None`` if it was removed since."""
        if not self.keys.required:
            return OPEN_DOOR if name == ANONYMOUS else None
        return next((c for c in self.keys.clients() if c.name == name), None)

    def open_pass(self, client: Client, record: RequestRecord) -> Pass:
        """A pass for work that did not come in over HTTP (a batch line): admitted,
        limited, settled, counted and logged like a request of ``client``."""
        record.track(self._metrics, self.finish_sinks)
        record.key = client.name
        record.may_use = self._model_filter(client)
        door = Pass(self, record, None, _discard)
        door.client = client
        return door

    async def serve_other(self, scope: Scope, receive: Receive, send: Send, app: Handler) -> None:
        """Every other HTTP route: the Host check and CORS, nothing counted."""
        origin = self.web.allowed_origin(scope)
        try:
            self.web.check_host(scope)
        except ApiError as exc:
            cors = self.web.cors_headers(origin) if origin is not None else []
            await _send_error(send, exc, b"", cors, scope["path"])
            return
        if origin is not None and self.web.is_preflight(scope):
            await _send_empty(send, 204, self.web.preflight_headers(origin))
            return
        if origin is not None:
            send = _adding(send, self.web.cors_headers(origin))
        await app(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send, handler: Handler) -> None:
        """A generation route: see the module docstring."""
        origin = self.web.allowed_origin(scope)
        if origin is not None and self.web.is_preflight(scope):
            # A browser's CORS check, not a request: answered, not counted.
            await _send_empty(send, 204, self.web.preflight_headers(origin))
            return
        record = RequestRecord(
            request_id=request_id(scope), requested_model="", endpoint=scope["path"]
        )
        record.track(self._metrics, self.finish_sinks)
        door = Pass(self, record, origin, send)
        scope[PASS] = door
        try:
            self.web.check_host(scope)
            if scope["method"] != "POST":
                raise MethodNotAllowed(f"method {scope['method']} not allowed on {scope['path']}")
            self.web.check_json(scope)
            door.client = self.keys.identify(scope)
            record.key = door.client.name
            record.may_use = self._model_filter(door.client)
            await handler(scope, BodyDeadline(receive, self.web.body_timeout), door.send)
        except ApiError as exc:
            record.fail("client_error" if exc.status < 500 else "server_error", exc.error_type)
            if not door.started:  # else the handler has answered (and said so in-band)
                extra = [(b"allow", b"POST")] if isinstance(exc, MethodNotAllowed) else []
                await _send_error(door.send, exc, record.request_id.encode(), extra, scope["path"])
        finally:
            try:
                await door.finish()
            finally:
                # The pass holds the server's ``send`` (its request cycle), which holds
                # the scope: out of the scope, the request's objects go when it does, not
                # at the collector's next run (a cycle of ~17 objects per request, before).
                del scope[PASS]


class Pass:
    """One request's way through the door. Owned by the task serving the request."""

    def __init__(
        self, door: FrontDoor, record: RequestRecord, origin: bytes | None, send: Send
    ) -> None:
        self._door = door
        self.record = record
        self._send = send
        self.origin = origin
        self.client: Client | None = None
        self.verdict: Verdict | None = None
        self.started = False
        self._ask: Ask | None = None
        self._prompt_estimate = 0

    async def admit(self, request: GenerationRequest) -> GenerationRequest:
        client = self.client
        if client is None:
            return request
        if self.record.may_use is not None:  # refuse early, before taking any allowance
            self._check_model(request.model, self.record.may_use)
        if request.priority != client.priority:
            request = replace(request, priority=client.priority)
        if not client.limited:
            return request
        self._prompt_estimate = estimate_prompt_tokens(request)
        sampling = request.sampling
        completion = sampling.max_tokens
        if completion is None:
            completion = self._door.unset_max_tokens
        cost = self._prompt_estimate + completion * sampling.n
        ask = Ask(client.name, client.limits, cost, f"{request.request_id}-{secrets.token_hex(4)}")
        verdict = await self._door.store.admit(ask)
        self.verdict = verdict
        if not verdict.allowed:
            raise _refusal(verdict, cost)
        if verdict.reason is None:
            self._ask = ask
        return request

    def _check_model(self, requested: str, may_use: Callable[[str], bool]) -> None:
        try:
            decision = self._door.registry.route(requested)
        except ApiError:
            raise not_found(requested) from None
        allowed_candidates(requested, decision.key_checks, may_use)

    async def send(self, message: Message) -> None:
        if self.started:  # the per-frame path of a stream: nothing to add
            await self._send(message)
            return
        if message["type"] == "http.response.start":
            self.started = True
            headers = list(message.get("headers", ()))
            headers.extend(await self._headers(message["status"]))
            message = {**message, "headers": headers}
        await self._send(message)

    async def _headers(self, status: int) -> list[tuple[bytes, bytes]]:
        extra: list[tuple[bytes, bytes]] = []
        if self.origin is not None:
            extra.extend(self._door.web.cors_headers(self.origin))
        if status == 408:
            extra.append((b"connection", b"close"))
        client = self.client
        if client is not None and self.verdict is None and client.limited:
            self.verdict = await self._door.store.peek(client.name, client.limits)
        if self.verdict is not None:
            extra.extend(rate_limit_headers(self.verdict))
        return extra

    async def finish(self) -> None:
        record = self.record
        usage_known = record.input_tokens > 0
        prompt = record.input_tokens if usage_known else 0
        completion = record.output_tokens if usage_known else record.streamed_tokens
        ask = self._ask
        if ask is not None:
            spent = prompt + completion if usage_known else self._prompt_estimate + completion
            day = self.verdict.day if self.verdict is not None else ""
            settlement = Settlement(ask.key, ask.limits, ask.lease, day, spent - ask.cost)
            await self._door.store.settle(settlement)
        record.finish()
        name = self.client.name if self.client is not None else UNAUTHENTICATED
        self._door.key_metrics.observe(name, record.status, prompt, completion)


def door_record(scope: Scope) -> RequestRecord | None:
    """The record the front door opened for this request (``None`` outside the door)."""
    door: Pass | None = scope.get(PASS)
    return None if door is None else door.record


async def admit(scope: Scope, request: GenerationRequest) -> GenerationRequest:
    """The admission a generation handler calls once it has parsed its request."""
    door: Pass | None = scope.get(PASS)
    return request if door is None else await door.admit(request)


def estimate_prompt_tokens(request: GenerationRequest) -> int:
    """An upper-ish estimate without a tokenizer (about 4 bytes per token, plus framing);
    the settlement replaces it with the backend's real count."""
    size = len(request.prompt.encode()) + sum(
        len(message.content.encode()) + 8 for message in request.messages
    )
    return math.ceil(size / 4) + 1 + len(request.prompt_token_ids)


def rate_limit_headers(verdict: Verdict) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = []
    for kind, window in (("requests", verdict.requests), ("tokens", verdict.tokens)):
        if window is not None:
            headers.extend(_window_headers(kind, window))
    return headers


def _window_headers(kind: str, window: Window) -> list[tuple[bytes, bytes]]:
    return [
        (f"x-ratelimit-limit-{kind}".encode(), str(window.limit).encode()),
        (f"x-ratelimit-remaining-{kind}".encode(), str(window.remaining).encode()),
        (f"x-ratelimit-reset-{kind}".encode(), openai_duration(window.reset).encode()),
    ]


def openai_duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1.0:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60.0)
    if minutes:
        return f"{int(minutes)}m{round(rest)}s"
    return f"{round(rest, 3):g}s"


def _refusal(verdict: Verdict, cost: int) -> ApiError:
    reason = verdict.reason or ""
    if reason == "budget":
        return QuotaExceeded(
            "You exceeded your daily token budget; it resets at 00:00 UTC.",
            retry_after=verdict.retry_after,
        )
    if reason == "too_large":
        limit = verdict.tokens.limit if verdict.tokens else 0
        return RateLimited(
            f"Request too large: it reserves {cost} tokens (prompt + max_tokens), "
            f"the limit is {limit} tokens per minute; lower max_tokens.",
            retry_after=60.0,
            kind="tokens",
        )
    kind = "tokens" if reason == "tpm" else "requests"
    return RateLimited(
        f"{_REFUSALS.get(reason, 'Rate limit reached')}; retry after "
        f"{max(1, math.ceil(verdict.retry_after))}s.",
        retry_after=verdict.retry_after,
        kind=kind,
    )


def _adding(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return wrapped


async def _discard(message: Message) -> None:
    """The ``send`` of a pass whose answer goes nowhere over HTTP."""


async def _send_empty(send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _send_error(
    send: Send,
    exc: ApiError,
    request_id: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
    path: str = "",
) -> None:
    body, named = error_body(exc, path)
    headers = [_JSON, *(extra or [])]
    if request_id:
        headers.append((b"x-request-id", request_id))
    headers.extend((name.lower().encode(), value.encode()) for name, value in named.items())
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
