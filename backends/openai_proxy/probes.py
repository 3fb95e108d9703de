"""``Prober``: the health probe of one replica, and what the upstream says about itself.

Until the model list was read once (from any replica), a probe reads ``/v1/models`` to
learn the upstream's model id (when not configured) and its context size; later probes
read the engine's health path. Owned by the backend's event loop; the backend hands it
the session it opens on start (``None`` once stopped: probes then fail).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from backends.openai_proxy.engines import EngineProfile, split_base_url
from backends.replicas.replica import Replica
from config.schema import OpenAIModelConfig


class Prober:
    __slots__ = ("_config", "_discovered", "_profile", "context", "model", "session")

    def __init__(self, config: OpenAIModelConfig, profile: EngineProfile) -> None:
        self._config = config
        self._profile = profile
        self.model = config.upstream_model or config.name  # the id sent upstream
        self.context: int | None = None  # the upstream's context size, once learnt
        self.session: aiohttp.ClientSession | None = None
        self._discovered = False

    async def probe(self, replica: Replica) -> bool:
        """One health probe of ``replica``: True when it answered 200."""
        session = self.session
        if session is None:
            return False
        discovering = not self._discovered
        path = "/models" if discovering else self._profile.health_path
        root, api = split_base_url(replica.url)
        url = api + path if discovering else root + path
        ok = False
        try:
            timeout = aiohttp.ClientTimeout(total=2 * self._config.connect_timeout)
            async with session.get(url, timeout=timeout) as response:
                ok = response.status == 200
                if ok and discovering:
                    self._learn(await response.read())
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            ok = False
        return ok

    def _learn(self, raw: bytes) -> None:
        """Take the upstream model id (when not configured) and its context size."""
        self._discovered = True
        models: Any = orjson.loads(raw).get("data") or []
        if not models:
            return
        if self._config.upstream_model is None:
            names = [m.get("id") for m in models]
            if self._config.name not in names and isinstance(names[0], str):
                self.model = names[0]
        for model in models:
            if model.get("id") == self.model:
                length = model.get("max_model_len")
                if isinstance(length, int) and length > 0:
                    self.context = length
