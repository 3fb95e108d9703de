"""Which LoRA adapters the hf engine holds, and loading them while it serves.

A model's adapters are those its config lists plus those registered at run time
(``add``); at most ``max_loras`` are resident in the runner's bank at once. A request for
one that is not resident loads it: the folder is read and a new bank stacked on a worker
thread (never on the event loop or the engine thread), taking a free slot or the least
recently used adapter's whose requests have all finished; the engine thread moves the
runner onto the new bank between steps (``Engine.between_steps``), before any request
submitted after the swap. Every request pins its adapter until it ends, so a running
sequence's slot never changes under it; a load that finds every slot pinned is refused
(``Overloaded``, retry) rather than queued behind requests of unknown length.

Owner: the backend's event loop; every method is called there. ``install`` hands a bank
to the engine thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from backends.base import InvalidRequest, ModelNotFound, Overloaded
from backends.hf.adapters.bank import AdapterError, AdapterWeights, LoraBank, read_adapter
from backends.hf.loading.model_source import ModelSourceError, adapter_folder

log = logging.getLogger("llmso.hf")


@dataclass(slots=True)
class _Resident:
    weights: AdapterWeights
    slot: int
    key: int
    pins: int = 0


class AdapterPool:
    """See the module doc."""

    def __init__(
        self,
        model: str,
        layers: list[Any],
        sources: Mapping[str, str],
        *,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
        install: Callable[[LoraBank | None], None],
    ) -> None:
        self._model = model
        self.layers = layers  # the model's decoder layers (read-only)
        self._sources = dict(sources)  # every adapter a request may name
        self._max_loras = max_loras
        self._max_rank = max_rank
        self._dtype, self._device = dtype, device
        self._install = install
        self._resident: OrderedDict[str, _Resident] = OrderedDict()  # oldest use first
        self._loads: dict[str, asyncio.Task[None]] = {}  # single flight per adapter
        self._waiting: dict[str, int] = {}  # callers awaiting each load
        self._swap = asyncio.Lock()  # one bank built at a time
        self._keys = itertools.count()
        self.loads = 0
        self.evictions = 0

    # ------------------------------------------------------------------ at load

    def preload(self) -> LoraBank | None:
        """Read every configured adapter (so a broken one fails the model's load, not a
        request later) and make the first ``max_loras`` resident; the bank to start
        with. Called once, off the loop, before the engine runs."""
        for number, (name, source) in enumerate(self._sources.items()):
            weights = self._read(name, source)
            if number < self._max_loras:
                self._resident[name] = _Resident(weights, number, next(self._keys))
            else:
                self._check(weights)
        return self._build()

    # ------------------------------------------------------------------ per request

    def names(self) -> frozenset[str]:
        return frozenset(self._sources)

    def resident(self) -> tuple[str, ...]:
        """The resident adapters, least recently used first."""
        return tuple(self._resident)

    async def acquire(self, name: str) -> None:
        """Pin ``name`` resident for one request (``release`` it), loading it first when
        it is not. Raises ``InvalidRequest`` for an unknown or unreadable adapter and
        ``Overloaded`` when every slot serves running requests."""
        resident = self._resident.get(name)
        if resident is not None:
            resident.pins += 1
            self._resident.move_to_end(name)
            return
        if name not in self._sources:
            raise InvalidRequest(f"model {self._model!r} has no adapter {name!r}", param="model")
        task = self._loads.get(name)
        if task is None:
            task = self._loads[name] = asyncio.create_task(self._load(name))
            task.add_done_callback(lambda _: self._loads.pop(name, None))
        # The load pins the adapter for every caller waiting on it as it installs the
        # bank: pinning after this await instead would let another load evict it first.
        self._waiting[name] = self._waiting.get(name, 0) + 1
        try:
            # Shielded: a client that leaves must not cancel a load others wait on.
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done() and not task.cancelled() and task.exception() is None:
                self.release(name)  # pinned on our behalf, but we are gone
            raise
        finally:
            left = self._waiting.pop(name) - 1
            if left:
                self._waiting[name] = left

    def release(self, name: str) -> None:
        resident = self._resident.get(name)
        if resident is None:
            return
        resident.pins -= 1
        if resident.pins == 0 and name not in self._sources:  # removed while in use
            asyncio.get_running_loop().create_task(self._drop(name))

    # ------------------------------------------------------------------ at run time

    async def add(self, name: str, source: str) -> None:
        """Register an adapter: read and checked against the model now (a worker
        thread), made resident by its first request."""
        if name in self._sources:
            raise InvalidRequest(f"adapter {name!r} is already registered", param="name")
        weights = await asyncio.to_thread(self._read, name, source)
        await asyncio.to_thread(self._check, weights)
        self._sources[name] = source

    async def remove(self, name: str) -> None:
        """Forget an adapter; its running requests finish on it, then its slot frees."""
        if self._sources.pop(name, None) is None:
            raise ModelNotFound(f"model {self._model!r} has no adapter {name!r}")
        resident = self._resident.get(name)
        if resident is not None and resident.pins == 0:
            await self._drop(name)

    # ------------------------------------------------------------------ internals

    async def _load(self, name: str) -> None:
        weights = await asyncio.to_thread(self._read, name, self._sources[name])
        async with self._swap:
            slot = self._free_slot()
            self._resident[name] = _Resident(weights, slot, next(self._keys))
            try:
                bank = await asyncio.to_thread(self._build)
            except BaseException:
                del self._resident[name]
                raise
            self._install(bank)
            self._resident[name].pins = self._waiting.get(name, 0)  # see acquire
            self.loads += 1
            log.info(
                "%s: adapter %s loaded into slot %d (resident: %s)",
                self._model, name, slot, ", ".join(self._resident),
            )  # fmt: skip

    async def _drop(self, name: str) -> None:
        async with self._swap:
            resident = self._resident.get(name)
            if resident is None or resident.pins or name in self._sources:
                return
            del self._resident[name]
            self._install(await asyncio.to_thread(self._build))
            log.info("%s: adapter %s unloaded", self._model, name)

    def _free_slot(self) -> int:
        """A slot for one more adapter: a free one, else the least recently used unpinned
        adapter's (evicted here, before the new bank is built, so no request can pin it
        meanwhile)."""
        taken = {r.slot for r in self._resident.values()}
        free = [slot for slot in range(self._max_loras) if slot not in taken]
        if free:
            return free[0]
        for victim, resident in self._resident.items():
            if resident.pins == 0:
                del self._resident[victim]
                self.evictions += 1
                log.info("%s: adapter %s evicted (least recently used)", self._model, victim)
                return resident.slot
        raise Overloaded(
            f"model {self._model!r}: all {self._max_loras} adapter slots (max_loras) serve "
            "running requests",
            retry_after=1.0,
        )

    def _build(self) -> LoraBank | None:
        if not self._resident:
            return None
        count = 1 + max(r.slot for r in self._resident.values())
        slots: list[AdapterWeights | None] = [None] * count
        keys = [-1] * count
        for resident in self._resident.values():
            slots[resident.slot], keys[resident.slot] = resident.weights, resident.key
        return LoraBank(self.layers, slots, keys=keys, dtype=self._dtype, device=self._device)

    def _read(self, name: str, source: str) -> AdapterWeights:
        try:
            weights = read_adapter(name, adapter_folder(source))
        except (AdapterError, ModelSourceError) as exc:
            raise InvalidRequest(f"{self._model}: {exc}", param="source") from exc
        if weights.rank > self._max_rank:
            raise InvalidRequest(
                f"{self._model}: adapter {name!r} has rank {weights.rank}, above "
                f"max_lora_rank ({self._max_rank})",
                param="source",
            )
        return weights

    def _check(self, weights: AdapterWeights) -> None:
        """Whether the adapter's targets and shapes are this model's (a one-slot bank)."""
        try:
            LoraBank(self.layers, [weights], dtype=self._dtype, device=self._device)
        except AdapterError as exc:
            raise InvalidRequest(f"{self._model}: {exc}", param="source") from exc
