"""Hot reload: re-read the config file on SIGHUP or when it changes, then apply it.

``ConfigWatcher`` is owned by the event loop, like the registry it drives. It polls the
file's identity (mtime, size, inode) about once a second, which needs no extra
dependency and also sees editors that replace the file by renaming. A config that fails
to load or validate is rejected with a logged reason; the old one keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from config.loader import ConfigError, load_config
from config.schema import AppConfig
from gateway.registry.registry import ModelRegistry
from gateway.registry.values import ConfigDiff

log = logging.getLogger(__name__)

_Stamp = tuple[int, int, int] | None


class ConfigWatcher:
    """Reloads ``path`` into ``registry`` on SIGHUP and on file change.

    ``start()`` installs the SIGHUP handler when the loop runs in the main thread (it
    logs and carries on without it elsewhere) and starts polling; ``stop()`` undoes both.
    Reloads run one at a time.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        path: Path | str,
        *,
        interval: float = 1.0,
        loader: Callable[[Path], AppConfig] = load_config,
        on_reload: Callable[[AppConfig], None] | None = None,
    ) -> None:
        self._registry = registry
        self._path = Path(path)
        self._interval = interval
        self._loader = loader
        self._on_reload = on_reload
        self._lock = asyncio.Lock()
        self._stamp: _Stamp = None
        self._poller: asyncio.Task[None] | None = None
        self._signal_installed = False
        self._pending: set[asyncio.Task[ConfigDiff | None]] = set()
        self.reloads = 0
        self.rejected = 0

    @property
    def signal_installed(self) -> bool:
        return self._signal_installed

    def start(self) -> None:
        self._stamp = _stamp(self._path)
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
            self._signal_installed = True
        except (NotImplementedError, RuntimeError, ValueError) as exc:
            log.warning("config watcher: no SIGHUP handler (%s); file polling only", exc)
        self._poller = asyncio.create_task(self._poll(), name="config-watcher")
        log.info("watching %s for changes (SIGHUP reloads too)", self._path)

    async def stop(self) -> None:
        if self._signal_installed:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._signal_installed = False
        tasks = [t for t in (self._poller, *self._pending) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._poller = None

    async def reload(self, trigger: str = "manual") -> ConfigDiff | None:
        """Load and apply the file now; ``None`` when the new config was rejected."""
        async with self._lock:
            self._stamp = _stamp(self._path)
            try:
                config = await asyncio.to_thread(self._loader, self._path)
            except ConfigError as exc:
                self.rejected += 1
                log.error("config reload (%s) rejected, keeping the old config: %s", trigger, exc)
                return None
            diff = await self._registry.apply_config(config)
            if self._on_reload is not None:
                self._on_reload(config)  # client keys (gateway.access)
            self.reloads += 1
            log.info("config reload (%s) applied from %s", trigger, self._path)
            return diff

    def _on_sighup(self) -> None:
        log.info("SIGHUP: reloading %s", self._path)
        task = asyncio.create_task(self.reload("SIGHUP"), name="config-reload")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            current = _stamp(self._path)
            if current is None or current == self._stamp:
                continue  # a missing file (mid-rename) is not a config change
            try:
                await self.reload("file changed")
            except Exception:  # keep watching whatever one reload did
                log.exception("config reload failed")


def _stamp(path: Path) -> _Stamp:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)
