"""Web safety: a gateway on a laptop is reachable from every page its user opens.

- ``Host`` allow-list (DNS-rebinding defence): bound to a loopback address, only
  loopback names are served unless ``server.allowed_hosts`` says otherwise.
- Generation routes take only ``application/json``: a ``text/plain`` POST is a "simple"
  request a page may send cross-origin without a CORS preflight.
- CORS is off unless ``server.cors_origins`` lists the origin.
- ``BodyDeadline`` bounds the time a request body may take to arrive (slow-loris).

And the headers the front door reads: the request id and the client key presented
(``presented_key``; ``gateway.access.keys`` decides whose it is).

``WebGuard`` is immutable, built once per app from ``server:``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import time

from config.schema import ServerConfig
from gateway.edge.asgi_types import Message, Receive, Scope
from gateway.edge.stepping import first_step
from gateway.errors import HostNotAllowed, RequestTimeout, UnsupportedMediaType
from gateway.observe.ids import fresh_hex

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
_EXPOSED = (
    b"x-request-id, retry-after, x-ratelimit-limit-requests, x-ratelimit-remaining-requests, "
    b"x-ratelimit-reset-requests, x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, "
    b"x-ratelimit-reset-tokens, x-llmso-cost"
)
_ALLOWED_HEADERS = (
    b"authorization, api-key, x-api-key, anthropic-version, content-type, x-request-id"
)
_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:@/+=-]{1,128}$")


def request_id(scope: Scope) -> str:
    """The client's ``X-Request-Id`` when it is a sane token, else a fresh one."""
    for key, value in scope["headers"]:
        if key == b"x-request-id" and _REQUEST_ID.match(value):
            return bytes(value).decode()
    return fresh_hex(16)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def presented_key(scope: Scope) -> bytes | None:
    """``Authorization: Bearer``, else Azure's ``api-key``, else Anthropic's ``x-api-key``
    (what the Anthropic SDKs send)."""
    auth = header(scope, b"authorization")
    if auth is not None:
        scheme, _, value = auth.partition(b" ")
        if scheme.lower() == b"bearer":
            return value.strip() or None
        return None
    for name in (b"api-key", b"x-api-key"):
        found = header(scope, name)
        if found is not None:
            return found.strip() or None
    return None


def host_name(raw: bytes) -> str:
    """The host part of a ``Host`` header, lower-cased, without the port."""
    text = raw.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[: text.find("]") + 1] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


class WebGuard:
    def __init__(self, server: ServerConfig, bind_host: str | None) -> None:
        hosts: frozenset[str] | None = None
        if server.allowed_hosts is not None:
            hosts = frozenset(h.lower() for h in server.allowed_hosts)
        elif bind_host is not None and is_loopback(bind_host):
            hosts = LOOPBACK_NAMES
        self._hosts = None if hosts is not None and "*" in hosts else hosts
        self._suffixes = tuple(h for h in (hosts or ()) if h.startswith("."))
        self._origins = frozenset(server.cors_origins)
        self.cors = bool(self._origins)
        self.body_timeout = server.body_timeout

    def check_host(self, scope: Scope) -> None:
        if self._hosts is None:
            return
        raw = header(scope, b"host")
        name = host_name(raw) if raw is not None else ""
        if name in self._hosts or (name and name.endswith(self._suffixes)):
            return
        raise HostNotAllowed(
            "this gateway does not serve that Host; add it to server.allowed_hosts"
        )

    @staticmethod
    def check_json(scope: Scope) -> None:
        raw = header(scope, b"content-type") or b""
        media = raw.split(b";", 1)[0].strip().lower()
        if media != b"application/json":
            raise UnsupportedMediaType(
                "request body must be application/json (set Content-Type)", param="content-type"
            )

    def allowed_origin(self, scope: Scope) -> bytes | None:
        """The ``Access-Control-Allow-Origin`` value for this request, if its origin may call."""
        if not self.cors:
            return None
        origin = header(scope, b"origin")
        if origin is None:
            return None
        if "*" in self._origins or origin.decode("latin-1") in self._origins:
            return origin
        return None

    def is_preflight(self, scope: Scope) -> bool:
        return (
            self.cors
            and scope["method"] == "OPTIONS"
            and header(scope, b"access-control-request-method") is not None
        )

    def preflight_headers(self, origin: bytes) -> list[tuple[bytes, bytes]]:
        return [
            (b"access-control-allow-origin", origin),
            (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
            (b"access-control-allow-headers", _ALLOWED_HEADERS),
            (b"access-control-max-age", b"600"),
            (b"vary", b"Origin"),
        ]

    @staticmethod
    def cors_headers(origin: bytes) -> list[tuple[bytes, bytes]]:
        return [
            (b"access-control-allow-origin", origin),
            (b"access-control-expose-headers", _EXPOSED),
            (b"vary", b"Origin"),
        ]


class BodyDeadline:
    """A ``receive`` that fails with 408 when the body is not complete in ``timeout`` s.

    Once the last body message is in, it is a plain pass-through (the disconnect watcher
    waits on ``receive`` for the whole response and must not time out).
    """

    __slots__ = ("_deadline", "_done", "_receive")

    def __init__(self, receive: Receive, timeout: float) -> None:
        self._receive = receive
        self._deadline = time.monotonic() + timeout
        self._done = False

    async def __call__(self) -> Message:
        if self._done:
            return await self._receive()
        # A small body comes with the headers: no timer when it is already in.
        message: Message
        message, rest = first_step(self._receive())
        if rest is not None:
            remaining = self._deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(0.0, remaining)):
                    message = await rest
            except TimeoutError:
                self._done = True
                raise RequestTimeout("request body did not arrive in time") from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._done = True
        return message
