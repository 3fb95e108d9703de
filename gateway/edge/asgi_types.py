"""The ASGI interface's types, named once for every module of the edge that speaks it.

A ``Scope`` is one connection's or request's description, a ``Message`` one event in
either direction, ``Receive``/``Send`` the server's two callables, and an ``ASGIApp``
anything that serves a scope with them (the app, a route's handler, FastAPI).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
