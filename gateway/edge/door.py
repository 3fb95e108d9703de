"""The front door: what every HTTP request passes through, in one place.

``FrontDoor.serve`` wraps a generation route's handler: it opens the request's
admission ``Ticket`` (``gateway.access.admission``) with its ``RequestRecord``, so a
request refused at the door is still counted and logged (model ``unrouted``), checks
``Host``, method, ``Content-Type`` and the client key, bounds the time the body may take,
and at the end finishes the ticket (settlement, per-key counts). A handler calls
``admit(scope, request)`` once it has parsed the body: the ticket's admission (the key's
model allow-list, its share of the limits). ``Pass`` (one per request, in the scope
under ``PASS``) carries the ticket, and adds OpenAI's ``x-ratelimit-*`` headers (and
CORS ones) to whatever response the handler sends, and ``x-llmso-cost`` (USD) to a whole
answer a model gave. ``serve_other`` is every other route:
the ``Host`` check and CORS, nothing counted.

Saturation sheds: past ``server.max_in_flight`` requests on these routes in this
process, or (a share of them growing with the lag) while its event loop runs later than
``server.shed_loop_lag_ms`` (``gateway.observe.loop_lag``: the core is past what it can
relay), a new one is answered at once with 503 and ``Retry-After`` in its route's
envelope (``GatewaySaturated``),
before its body is read or anything is counted but ``llmso_shed_requests_total``, so the
streams already admitted keep their pace.

``FrontDoor`` is owned by the app; its policy (keys, limits) is the app's ``Admission``,
which follows config reloads, and its one mutable field, ``inflight``, is written on the
event loop only.
"""

from __future__ import annotations

import random

from backends.base import ApiError, GenerationRequest
from config.schema import ServerConfig
from gateway.access.admission import Admission, Ticket
from gateway.access.keys import Client
from gateway.access.limits import Verdict, Window, openai_duration
from gateway.edge.asgi_types import ASGIApp, Message, Receive, Scope, Send
from gateway.edge.web import BodyDeadline, WebGuard, presented_key, request_id
from gateway.errors import GatewaySaturated, MethodNotAllowed, error_body
from gateway.observe.cost import usd_text
from gateway.observe.loop_lag import LoopLag
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.record import RequestRecord

PASS = "llmso.pass"
COST_HEADER = b"x-llmso-cost"
_JSON = (b"content-type", b"application/json")


class FrontDoor:
    def __init__(
        self,
        server: ServerConfig,
        admission: Admission,
        *,
        bind_host: str | None,
        metrics: GatewayMetrics | None = None,
        worker: int | None = None,
        lag: LoopLag | None = None,
    ) -> None:
        self.web = WebGuard(server, bind_host)
        self.admission = admission
        self.max_in_flight = server.max_in_flight
        self.inflight = 0
        self.lag = lag
        self._metrics = metrics
        # A fleet's worker names itself on every answer of these routes.
        self._own: list[tuple[bytes, bytes]] = (
            [] if worker is None else [(b"x-llmso-worker", str(worker).encode())]
        )

    def identify(self, scope: Scope) -> Client:
        """The caller of this request, by the key it presented; 401 when a key is
        required and not valid."""
        return self.admission.keys.identify(presented_key(scope))

    async def serve_other(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
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

    async def serve(self, scope: Scope, receive: Receive, send: Send, handler: ASGIApp) -> None:
        """A generation route: see the module docstring."""
        origin = self.web.allowed_origin(scope)
        if origin is not None and self.web.is_preflight(scope):
            # A browser's CORS check, not a request: answered, not counted.
            await _send_empty(send, 204, self.web.preflight_headers(origin))
            return
        if (why := self._saturated()) is not None:
            await self._shed(scope, send, origin, why)
            return
        self.inflight += 1
        try:
            await self._serve(scope, receive, send, handler, origin)
        finally:
            self.inflight -= 1

    def _saturated(self) -> str | None:
        """Why this request is shed (the in-flight ceiling, or the loop's lag: its share
        of requests), or None to serve it."""
        if self.inflight >= self.max_in_flight:
            ceiling = self.max_in_flight
            return f"serves {ceiling} requests at once (server.max_in_flight) and is full"
        lag = self.lag
        if lag is not None and (
            lag.share >= 1.0 or (lag.share > 0.0 and random.random() < lag.share)
        ):
            late = lag.seconds * 1000
            return f"runs {late:.0f} ms behind (its event loop, past server.shed_loop_lag_ms)"
        return None

    async def _shed(self, scope: Scope, send: Send, origin: bytes | None, why: str) -> None:
        if self._metrics is not None:
            self._metrics.shed(scope["path"])
        exc = GatewaySaturated(f"this gateway {why}; retry shortly")
        extra = [*self._own, *(self.web.cors_headers(origin) if origin is not None else [])]
        await _send_error(send, exc, request_id(scope).encode(), extra, scope["path"])

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, handler: ASGIApp, origin: bytes | None
    ) -> None:
        ticket = self.admission.open(
            RequestRecord(request_id=request_id(scope), requested_model="", endpoint=scope["path"])
        )
        record = ticket.record
        door = Pass(self.web, ticket, origin, send, self._own)
        scope[PASS] = door
        try:
            self.web.check_host(scope)
            if scope["method"] != "POST":
                raise MethodNotAllowed(f"method {scope['method']} not allowed on {scope['path']}")
            self.web.check_json(scope)
            ticket.identify(self.identify(scope))
            await handler(scope, BodyDeadline(receive, self.web.body_timeout), door.send)
        except ApiError as exc:
            record.fail("client_error" if exc.status < 500 else "server_error", exc.error_type)
            if not door.started:  # else the handler has answered (and said so in-band)
                extra = [(b"allow", b"POST")] if isinstance(exc, MethodNotAllowed) else []
                await _send_error(door.send, exc, record.request_id.encode(), extra, scope["path"])
        finally:
            try:
                await ticket.finish()
            finally:
                # The pass holds the server's ``send`` (its request cycle), which holds
                # the scope: out of the scope, the request's objects go when it does, not
                # at the collector's next run (a cycle of ~17 objects per request, before).
                del scope[PASS]


class Pass:
    """One request's way through the door: its ticket, and the ``send`` that adds the
    door's headers to the response. Owned by the task serving the request."""

    def __init__(
        self,
        web: WebGuard,
        ticket: Ticket,
        origin: bytes | None,
        send: Send,
        own: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self._web = web
        self.ticket = ticket
        self._send = send
        self.origin = origin
        self.started = False
        self._own = own or []

    @property
    def server_send(self) -> Send:
        """The server's ``send``, behind the door's."""
        return self._send

    async def send(self, message: Message) -> None:
        if self.started:  # the per-frame path of a stream: nothing to add
            await self._send(message)
            return
        if message["type"] == "http.response.start":
            self.started = True
            headers = list(message.get("headers", ()))
            headers.extend(await self._headers(message["status"], headers))
            message = {**message, "headers": headers}
        await self._send(message)

    async def _headers(
        self, status: int, headers: list[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        extra: list[tuple[bytes, bytes]] = [*self._own]
        cost = self._cost(status, headers)
        if cost is not None:
            extra.append((COST_HEADER, cost))
        if self.origin is not None:
            extra.extend(self._web.cors_headers(self.origin))
        if status == 408:
            extra.append((b"connection", b"close"))
        verdict = await self.ticket.standing()
        if verdict is not None:
            extra.extend(rate_limit_headers(verdict))
        return extra

    def _cost(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes | None:
        """What a whole (not streamed) successful answer of a model cost, in USD ("0"
        for a model without prices); a stream's cost is known only at its end (the log
        line, ``llmso_spend_total``)."""
        record = self.ticket.record
        if not record.model or not 200 <= status < 300:
            return None
        for name, value in headers:
            if name == b"content-type" and value.startswith(b"text/event-stream"):
                return None
        return usd_text(record.cost() or 0).encode()


def body_send(scope: Scope, send: Send) -> Send:
    """The ``send`` for the rest of a response whose start went out through ``send``:
    past the door's (which adds nothing to a body), the server's own, one coroutine
    less per frame of a stream; ``send`` itself otherwise."""
    door: Pass | None = scope.get(PASS)
    if door is not None and door.started and send == door.send:
        return door.server_send
    return send


def door_record(scope: Scope) -> RequestRecord | None:
    """The record the front door opened for this request (``None`` outside the door)."""
    door: Pass | None = scope.get(PASS)
    return None if door is None else door.ticket.record


async def admit(scope: Scope, request: GenerationRequest) -> GenerationRequest:
    """The admission a generation handler calls once it has parsed its request."""
    door: Pass | None = scope.get(PASS)
    return request if door is None else await door.ticket.admit(request)


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


def _adding(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return wrapped


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
