"""vLLM's LoRA adapter endpoints on one replica (``AdapterOps`` of ``backends.replicas``).

- ``GET /v1/models`` lists each adapter as a model whose ``parent`` is the base model's
  id (the base has ``"parent": null``): ``parse_adapters``.
- ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` answers 200 with a line of
  plain text; 400 when the name is taken (already loaded, or the base's own name), 404
  when the path holds no adapter. The routes exist only when the server runs with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (else 404 too).
- ``POST /v1/unload_lora_adapter {"lora_name"}``: 200, or 404 when it has no such adapter.

Every call is bounded by a timeout and every body read by a size. Owned by the backend's
event loop; the backend hands it a getter for its session (None while stopped).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from backends.base import NotReady, UpstreamRejected
from backends.openai_proxy.engines import split_base_url
from backends.openai_proxy.errors import from_exception, from_status
from backends.replicas.replica import Replica

LOAD_PATH = "/load_lora_adapter"
UNLOAD_PATH = "/unload_lora_adapter"
_MAX_LIST = 1024 * 1024  # a model list with thousands of adapters still fits
_MAX_ANSWER = 64 * 1024
_ALREADY_LOADED = "already been loaded"
_JSON = {"Accept": "application/json"}


def parse_adapters(payload: Any) -> frozenset[str]:
    """The adapter ids in a ``/v1/models`` answer: entries with a string ``parent``."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return frozenset()
    return frozenset(
        entry["id"]
        for entry in data
        if isinstance(entry, dict)
        and isinstance(entry.get("id"), str)
        and isinstance(entry.get("parent"), str)
    )


class UpstreamAdapters:
    """List, load and unload adapters on the replicas of one model. See the module doc."""

    def __init__(
        self,
        session: Callable[[], aiohttp.ClientSession | None],
        *,
        list_seconds: float,
        load_seconds: float,
    ) -> None:
        self._session = session
        self._list_timeout = aiohttp.ClientTimeout(total=list_seconds)
        # Loading reads the adapter's weights from disk: bounded like a first token.
        self._load_timeout = aiohttp.ClientTimeout(total=load_seconds)

    async def listed(self, replica: Replica) -> frozenset[str] | None:
        session = self._session()
        if session is None:
            return None
        url = split_base_url(replica.url)[1] + "/models"
        try:
            async with session.get(url, timeout=self._list_timeout) as response:
                if response.status != 200:
                    return None
                raw = await response.content.read(_MAX_LIST)
            return parse_adapters(orjson.loads(raw))
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError):
            return None  # keep what we knew; the health probe judges the replica

    async def load(self, replica: Replica, name: str, source: str) -> None:
        try:
            await self._post(replica, LOAD_PATH, {"lora_name": name, "lora_path": source})
        except UpstreamRejected as error:
            # Loaded meanwhile by another gateway, or listed after our last read.
            if not (error.status == 400 and _ALREADY_LOADED in error.message):
                raise

    async def unload(self, replica: Replica, name: str) -> None:
        try:
            await self._post(replica, UNLOAD_PATH, {"lora_name": name})
        except UpstreamRejected as error:
            if error.status != 404:  # 404: it does not have it, which is the goal
                raise

    async def _post(self, replica: Replica, path: str, body: dict[str, str]) -> None:
        session = self._session()
        if session is None:
            raise NotReady("backend stopped")
        url = split_base_url(replica.url)[1] + path
        try:
            post = session.post(url, json=body, headers=_JSON, timeout=self._load_timeout)
            async with post as response:
                if response.status != 200:
                    raw = await response.content.read(_MAX_ANSWER)
                    raise from_status(response.status, raw, response.headers.get("Retry-After"))
                await response.content.read(_MAX_ANSWER)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise from_exception(exc, url=url) from None
