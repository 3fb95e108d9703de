"""Closed-loop and open-loop (Poisson) load against one server, one load level at a time.

Both loops are bounded by a request count and/or a duration and stop by themselves; every
request carries its own timeout (``RequestOptions.timeout_s``). The event loop running
:func:`run_level` owns all of its state; nothing is shared between calls.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from bench.client import RequestOptions, RequestResult, send_request
from bench.prompts import Prompt


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """One load level: exactly one of ``concurrency`` (closed loop) or ``rate`` (open loop).

    The measured phase stops issuing requests after ``num_requests`` or ``duration_s``,
    whichever comes first (at least one must be set). ``warmup`` requests run first at the
    same concurrency (or at most 4 at a time in open loop) and are marked ``warmup``.
    """

    concurrency: int | None = None
    rate: float | None = None
    num_requests: int | None = None
    duration_s: float | None = None
    warmup: int = 0
    seed: int = 0
    max_inflight: int = 1024

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("set exactly one of concurrency or rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate must be > 0")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("set num_requests or duration_s so the run ends by itself")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError("num_requests must be >= 1")
        if self.warmup < 0:
            raise ValueError("warmup must be >= 0")

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"rate={self.rate:g}"


@dataclass(frozen=True, slots=True)
class LevelRun:
    """Results of one level: warm-up and measured samples, measured wall time, client CPU."""

    load: LoadSpec
    results: tuple[RequestResult, ...]
    wall_s: float
    client_cpu_s: float

    @property
    def measured(self) -> tuple[RequestResult, ...]:
        return tuple(r for r in self.results if not r.warmup)


def _pick(prompts: Sequence[Prompt], i: int) -> Prompt:
    return prompts[i % len(prompts)]


async def _closed_loop(
    session: aiohttp.ClientSession,
    options: RequestOptions,
    prompts: Sequence[Prompt],
    *,
    concurrency: int,
    num_requests: int | None,
    duration_s: float | None,
    origin: float,
    warmup: bool,
) -> list[RequestResult]:
    results: list[RequestResult] = []
    issued = 0
    deadline = None if duration_s is None else time.perf_counter() + duration_s

    async def worker() -> None:
        nonlocal issued
        while num_requests is None or issued < num_requests:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            i = issued
            issued += 1
            results.append(
                await send_request(session, options, _pick(prompts, i), i, origin, warmup=warmup)
            )

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def _open_loop(
    session: aiohttp.ClientSession,
    options: RequestOptions,
    prompts: Sequence[Prompt],
    *,
    rate: float,
    num_requests: int | None,
    duration_s: float | None,
    seed: int,
    max_inflight: int,
    origin: float,
) -> list[RequestResult]:
    """Poisson arrivals; if ``max_inflight`` requests are outstanding, arrivals wait."""
    rng = random.Random(seed)
    gate = asyncio.Semaphore(max_inflight)
    tasks: list[asyncio.Task[RequestResult]] = []
    start = time.perf_counter()
    next_at = start

    async def one(i: int) -> RequestResult:
        try:
            return await send_request(session, options, _pick(prompts, i), i, origin)
        finally:
            gate.release()

    i = 0
    try:
        while num_requests is None or i < num_requests:
            if duration_s is not None and next_at - start >= duration_s:
                break
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            await gate.acquire()
            tasks.append(asyncio.create_task(one(i)))
            i += 1
            next_at += rng.expovariate(rate)
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


async def run_level(
    session: aiohttp.ClientSession,
    options: RequestOptions,
    prompts: Sequence[Prompt],
    load: LoadSpec,
    on_measured: Callable[[], None] | None = None,
) -> LevelRun:
    """Warm up, then run the measured phase of one load level. ``on_measured`` runs
    between the two, e.g. to read a server's CPU so that the warm-up's (a fresh
    process's first requests pay one-time costs) is not counted."""
    origin = time.perf_counter()
    warm: list[RequestResult] = []
    if load.warmup:
        warm = await _closed_loop(
            session,
            options,
            prompts,
            concurrency=min(load.concurrency or 4, load.warmup),
            num_requests=load.warmup,
            duration_s=None,
            origin=origin,
            warmup=True,
        )
    if on_measured is not None:
        on_measured()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    if load.concurrency is not None:
        measured = await _closed_loop(
            session,
            options,
            prompts,
            concurrency=load.concurrency,
            num_requests=load.num_requests,
            duration_s=load.duration_s,
            origin=origin,
            warmup=False,
        )
    else:
        assert load.rate is not None  # guaranteed by LoadSpec.__post_init__
        measured = await _open_loop(
            session,
            options,
            prompts,
            rate=load.rate,
            num_requests=load.num_requests,
            duration_s=load.duration_s,
            seed=load.seed,
            max_inflight=load.max_inflight,
            origin=origin,
        )
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    return LevelRun(load=load, results=tuple(warm + measured), wall_s=wall, client_cpu_s=cpu)


def new_session(max_connections: int, connect_timeout_s: float = 10.0) -> aiohttp.ClientSession:
    """One pooled session for a whole run; the caller closes it."""
    # Idle pooled connections are dropped before uvicorn's 5 s keep-alive would close them
    # under us (a POST on a half-closed socket fails instead of being retried).
    connector = aiohttp.TCPConnector(limit=max_connections, keepalive_timeout=3.0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)
