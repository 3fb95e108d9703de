"""What one admission costs through each limit store a fleet may use (docs/workers.md):

- ``memory``: this process's ``MemoryStore`` (one gateway process; the floor);
- ``hub``: the supervisor's store over the fleet's UNIX socket (``--workers N`` with
  ``limits.store: memory``): ``HubLimits`` in this process, the ``Hub`` in a child;
- ``redis``: ``RedisStore`` against a local ``redis-server`` (when one is installed).

Each request is what the front door does for a key with limits: one ``admit`` and one
``settle``. Measured one at a time (the latency a request pays) and 64 at a time (the
wall per request when many wait together), with the CPU the store's server spent per
request (``/proc``, the hub's child or redis-server)::

    python -m bench.studies.fleet_store [--requests 20000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.machine import machine_info
from bench.procstat import process_cpu_seconds
from config.frontdoor import LimitsConfig
from config.schema import ResponsesConfig
from gateway.access.limits import Ask, KeyLimits, MemoryStore, Settlement
from gateway.access.store import Store
from gateway.fleet.hub import Hub
from gateway.fleet.link import FleetLink, Seat
from gateway.fleet.stores import HubLimits, SharedStores

LIMITS = KeyLimits(rpm=10**9, tpm=10**12, max_parallel=10**6)


def _run_hub(path: str) -> None:
    async def serve() -> None:
        hub = Hub(SharedStores(LimitsConfig(), ResponsesConfig()))
        await hub.start(path)
        await asyncio.Event().wait()

    import uvloop  # as the supervisor runs its hub

    uvloop.run(serve())


async def _one(store: Store, i: int) -> None:
    verdict = await store.admit(Ask("team", LIMITS, 100, f"lease-{i}"))
    await store.settle(Settlement("team", LIMITS, f"lease-{i}", verdict.day, -10))


async def _measure(
    store: Store, requests: int, concurrency: int, server_cpu: Callable[[], float | None]
) -> dict[str, float | None]:
    for i in range(200):  # warm-up: connections, first-use costs
        await _one(store, i)
    cpu0, server0, t0 = time.process_time(), server_cpu(), time.perf_counter()
    if concurrency == 1:
        for i in range(requests):
            await _one(store, i)
    else:
        queue = iter(range(requests))

        async def worker() -> None:
            for i in queue:
                await _one(store, i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    server1 = server_cpu()
    server = None if server0 is None or server1 is None else (server1 - server0)
    return {
        "wall_us_per_request": wall / requests * 1e6,
        "client_cpu_us_per_request": (time.process_time() - cpu0) / requests * 1e6,
        "server_cpu_us_per_request": None if server is None else server / requests * 1e6,
    }


async def _rows(requests: int) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    stores: list[tuple[str, Callable[[], Awaitable[tuple[Store, Callable[[], float | None]]]]]]
    stores = [("memory", _memory), ("hub", _hub)]
    from shutil import which

    if which("redis-server"):
        stores.append(("redis", _redis))
    for name, open_store in stores:
        store, server_cpu = await open_store()
        try:
            rows[name] = {f"c={c}": await _measure(store, requests, c, server_cpu) for c in (1, 64)}
        finally:
            await store.close()
            await _CLEANUP.pop(name, _nothing)()
    return rows


_CLEANUP: dict[str, Callable[[], Awaitable[None]]] = {}


async def _nothing() -> None:
    return None


async def _memory() -> tuple[Store, Callable[[], float | None]]:
    return MemoryStore(lease_ttl=60), lambda: 0.0


async def _hub() -> tuple[Store, Callable[[], float | None]]:
    folder = tempfile.mkdtemp(prefix="llmso-store-study-")
    path = os.path.join(folder, "hub.sock")
    child = multiprocessing.get_context("spawn").Process(target=_run_hub, args=(path,))
    child.start()
    link = FleetLink(Seat(path, 0, 1))
    for _ in range(600):  # until the child's hub listens
        try:
            await link.connect()
            break
        except (FileNotFoundError, ConnectionRefusedError):
            await asyncio.sleep(0.05)

    async def stop() -> None:
        await link.close()
        child.terminate()
        child.join()

    _CLEANUP["hub"] = stop
    pid = child.pid
    assert pid is not None
    return HubLimits(link), lambda: process_cpu_seconds(pid)


async def _redis() -> tuple[Store, Callable[[], float | None]]:
    from gateway.access.redis_store import RedisStore
    from tests.tools.redis_server import RedisServer
    from tests.tools.servers import free_port

    server = RedisServer(free_port())
    server.start()

    async def stop() -> None:
        server.kill()

    _CLEANUP["redis"] = stop
    process = server.process
    assert process is not None
    store = RedisStore(server.url, prefix="study", lease_ttl=60, timeout=2.0)
    return store, lambda: process_cpu_seconds(process.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    meta = machine_info()
    import uvloop  # as a worker runs its link

    rows = uvloop.run(_rows(args.requests))
    print(f"load average at start: {meta['loadavg_at_start']}; {args.requests} requests each")
    print("store   level  wall us/req  client CPU us/req  server CPU us/req")
    for name, levels in rows.items():
        for level, figures in levels.items():
            server = figures["server_cpu_us_per_request"]
            print(
                f"{name:7} {level:6} {figures['wall_us_per_request']:11.1f} "
                f"{figures['client_cpu_us_per_request']:18.1f} "
                f"{'-' if server is None else f'{server:.1f}':>18}"
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"meta": meta, "requests": args.requests, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
