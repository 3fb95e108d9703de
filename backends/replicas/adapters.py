"""LoRA adapters across replicas: which replica serves which, and loading one where none does.

An engine that serves adapters (vLLM ``--enable-lora``) names each as a model of its
own. The gateway keeps, per replica, the adapters it serves (``Replica.adapters``): what
the engine lists, read with every round of health probes, plus what this gateway loaded
there itself. A request for an adapter goes to a replica that holds it (``prefer``);
when none does and the adapter has a source, the least-loaded eligible replica is named
its target and loads it before the request is sent (``ready``), once however many
requests wait for it. Without a source (or with loading off) the request goes where the
policy sends it and the engine answers: the list may lag behind the engine.

Transport-agnostic: the backend passes ``AdapterOps`` (how to list, load and unload on
one replica). Ownership: the event loop of the backend that built it; the catalog, the
targets and the loads in flight are its only state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from backends.base import BackendCrashed, BackendError, UpstreamRejected
from backends.replicas.replica import Replica

log = logging.getLogger("llmso.route")


class AdapterOps(Protocol):
    """One engine's adapter calls on one replica, each bounded by a timeout."""

    async def listed(self, replica: Replica) -> frozenset[str] | None:
        """The adapters the replica serves now; None when it could not be read."""
        ...

    async def load(self, replica: Replica, name: str, source: str) -> None:
        """Load ``name`` from ``source``; raises ``BackendError`` when it was not loaded."""
        ...

    async def unload(self, replica: Replica, name: str) -> None:
        """Unload ``name`` (done when the replica does not have it); raises
        ``BackendError`` on any other failure."""
        ...


class Adapters:
    """The adapters of one model and where they are loaded. See the module doc."""

    def __init__(
        self, model: str, ops: AdapterOps, catalog: Mapping[str, str | None], load: bool
    ) -> None:
        self._model = model
        self._ops = ops
        self._catalog: dict[str, str | None] = dict(catalog)
        self._load = load
        self._targets: dict[str, str] = {}
        """Adapter -> URL of the replica named to load it, until that load ends."""
        self._loads: dict[tuple[str, str], asyncio.Task[None]] = {}
        """In flight, by (replica URL, adapter): the one load every waiter shares."""

    # ------------------------------------------------------------------ catalog

    def update(self, catalog: Mapping[str, str | None], load: bool) -> None:
        """A new set of adapters (hot reload): names not in it are no longer served
        (the engines keep them until told otherwise)."""
        self._catalog = dict(catalog)
        self._load = load

    def known(self, name: str) -> bool:
        return name in self._catalog

    def add(self, name: str, source: str | None) -> None:
        self._catalog[name] = source

    def forget(self, name: str) -> None:
        self._catalog.pop(name, None)
        self._targets.pop(name, None)

    def _loadable(self, name: str) -> str | None:
        """The source ``name`` loads from, when this gateway may load it."""
        return self._catalog.get(name) if self._load else None

    # ------------------------------------------------------------------ routing

    def prefer(self, name: str, eligible: Sequence[Replica]) -> list[Replica] | None:
        """The replicas among ``eligible`` a request for ``name`` should go to: those
        holding it (or named to load it), else the least-loaded one, which becomes its
        target; None when none holds it and it cannot be loaded (any replica will do)."""
        target = self._targets.get(name)
        holders = [r for r in eligible if name in r.adapters or r.url == target]
        if holders:
            return holders
        if self._loadable(name) is None or not eligible:
            return None
        # The lowest score, then the fewest in flight (scores are 0 without /metrics).
        chosen = min(eligible, key=lambda r: (r.score(), r.inflight))
        self._targets[name] = chosen.url
        return [chosen]

    async def ready(self, replica: Replica, name: str) -> None:
        """Return once ``replica`` serves ``name``: at once when it lists it or the
        adapter cannot be loaded (the engine answers), else after the one load of it
        there that every request waiting for it shares. Raises the load's error, named
        after the adapter (``UpstreamRejected`` with ``param="model"`` when refused)."""
        source = self._loadable(name)
        if name in replica.adapters or source is None:
            return
        key = (replica.url, name)
        task = self._loads.get(key)
        if task is None:
            task = asyncio.create_task(self._load_on(replica, name, source))
            self._loads[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        # Shielded: a client that leaves does not cancel the load others wait for.
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and current is not None and not current.cancelling():
                raise BackendCrashed("backend stopped while loading an adapter") from None
            raise

    def _finished(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        self._loads.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have left

    async def _load_on(self, replica: Replica, name: str, source: str) -> None:
        started = time.monotonic()
        try:
            await self._ops.load(replica, name, source)
        except BackendError as error:
            replica.count_adapter_load(error)
            log.warning(
                "adapter load failed model=%s adapter=%s replica=%s error=%s",
                self._model, name, replica.url, error,
            )  # fmt: skip
            raise self._load_error(name, error) from None
        finally:
            if self._targets.get(name) == replica.url:
                del self._targets[name]  # loaded (held from now on) or failed (pick anew)
        replica.hold_adapter(name)
        replica.count_adapter_load(None)
        log.info(
            "adapter loaded model=%s adapter=%s replica=%s seconds=%.2f",
            self._model, name, replica.url, time.monotonic() - started,
        )  # fmt: skip

    def _load_error(self, name: str, error: BackendError) -> BackendError:
        """``error`` renamed for the client: a refusal names the ``model`` field (the
        adapter asked for), with its own code; other errors keep their class."""
        message = f"the upstream could not load adapter {name!r} of {self._model!r}: {error}"
        if isinstance(error, UpstreamRejected):
            return UpstreamRejected(
                message, status=error.status, param="model", code="adapter_load_failed"
            )
        return type(error)(message, **error.fields())

    # ------------------------------------------------------------------ listing

    async def refresh(self, replicas: Iterable[Replica]) -> None:
        """Read each replica's own list (skipped while no adapter is configured)."""
        if self._catalog:
            await asyncio.gather(*(self._refresh_one(r) for r in replicas))

    async def _refresh_one(self, replica: Replica) -> None:
        epoch = replica.adapter_epoch
        listed = await self._ops.listed(replica)
        if listed is not None:
            replica.record_adapters(listed, epoch)

    # ------------------------------------------------------------------ removal

    async def unload(self, name: str, replicas: Sequence[Replica]) -> None:
        """Unload ``name`` from every replica that holds it, once loads of it in flight
        ended. A replica that fails keeps it (logged): the gateway no longer routes to
        it either way."""
        pending = [task for (_, adapter), task in self._loads.items() if adapter == name]
        await asyncio.gather(*pending, return_exceptions=True)
        holders = [r for r in replicas if name in r.adapters]
        await asyncio.gather(*(self._unload_one(r, name) for r in holders))

    async def _unload_one(self, replica: Replica, name: str) -> None:
        try:
            await self._ops.unload(replica, name)
        except BackendError as error:
            log.warning(
                "adapter unload failed model=%s adapter=%s replica=%s error=%s",
                self._model, name, replica.url, error,
            )  # fmt: skip
            return
        replica.drop_adapter(name)
        log.info("adapter unloaded model=%s adapter=%s replica=%s", self._model, name, replica.url)

    async def stop(self) -> None:
        """Cancel the loads in flight (their waiters get ``CancelledError``)."""
        tasks = list(self._loads.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, BackendError):
                await task
