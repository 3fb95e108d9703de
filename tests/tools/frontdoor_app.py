"""The app of the front-door service tests, in-process over ASGI with an echo backend.

``app_factory()`` builds apps (each with its own lifespan) and closes them at the end;
``drive`` runs one request through the raw ASGI interface when a test needs to control
``receive`` (a trickling body, a client that leaves mid-stream).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from backends.base import (
    Backend,
    BackendEvent,
    Finished,
    GenerationRequest,
    ModelInfo,
    Started,
    TextDelta,
    Usage,
)
from config.schema import AppConfig, ModelConfig
from gateway.app import build_app

ADMIN = "admin-secret-1"
KEY_A = "sk-team-a-0123456789"
KEY_B = "sk-team-b-0123456789"
PROMPT_TOKENS = 7


class EchoBackend:
    """Up to three ``tok`` (fewer if max_tokens says so); a prompt of ``hold`` waits for
    ``release`` before its second token."""

    def __init__(self, config: ModelConfig) -> None:
        self.calls: list[GenerationRequest] = []
        self.release = asyncio.Event()

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def ready(self) -> bool:
        return True

    def info(self) -> ModelInfo:
        return ModelInfo(max_context=4096)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        self.calls.append(request)
        yield Started(queued_at=1.0, started_at=1.0)
        hold = bool(request.messages) and request.messages[-1].content == "hold"
        count = len(range(3)[: request.sampling.max_tokens])
        for index in range(count):
            if hold and index == 1:
                await self.release.wait()
            yield TextDelta(index=0, text=" tok")
        yield Finished(index=0, reason="length")
        yield Usage(prompt_tokens=PROMPT_TOKENS, completion_tokens=count)


def make_config(**sections: Any) -> AppConfig:
    models = [
        {"name": "alpha", "backend": "openai", "base_url": "http://u", "capabilities": ["small"]},
        {"name": "beta", "backend": "openai", "base_url": "http://u", "aliases": ["b"]},
    ]
    return AppConfig.model_validate({"models": models, **sections})


def keys(*entries: dict[str, Any], **limits: Any) -> dict[str, Any]:
    return {"auth": {"required": True, "keys": list(entries)}, **limits}


class App:
    def __init__(self, app: Any, backends: dict[str, EchoBackend]) -> None:
        self.asgi = app
        self.backends = backends
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


AppFactory = Callable[..., Awaitable["App"]]


@contextlib.asynccontextmanager
async def app_factory() -> AsyncIterator[AppFactory]:
    opened: list[tuple[Any, App]] = []

    async def make(config: AppConfig, **kwargs: Any) -> App:
        backends: dict[str, EchoBackend] = {}

        def factory(model: ModelConfig, _on_crash: Any) -> Backend:
            backends[model.name] = EchoBackend(model)
            return backends[model.name]

        app = build_app(config, admin_key=ADMIN, backend_factory=factory, **kwargs)
        lifespan = app.lifespan()
        await lifespan.__aenter__()
        made = App(app, backends)
        opened.append((lifespan, made))
        return made

    yield make
    for lifespan, made in opened:
        await made.http.aclose()
        await lifespan.__aexit__(None, None, None)


def chat(model: str = "alpha", content: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def drive(
    app: Any, path: str, headers: list[tuple[bytes, bytes]], messages: list[Any]
) -> tuple[int, dict[bytes, bytes], bytes]:
    """Run one request through the ASGI app; ``messages`` are what ``receive`` returns,
    in order (a float: sleep that long first), then it waits forever."""
    sent: list[dict[str, Any]] = []
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        while queue:
            item = queue.pop(0)
            if isinstance(item, float):
                await asyncio.sleep(item)
                continue
            return dict(item)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": headers,
        "query_string": b"",
        "server": ("127.0.0.1", 8000),
    }
    await asyncio.wait_for(app(scope, receive, send), 10)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


JSON_HEADERS = [(b"content-type", b"application/json"), (b"host", b"t")]


JSON_HEADERS = [(b"content-type", b"application/json"), (b"host", b"t")]


def team(name: str, key: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "key": key, **fields}
