"""The limiter arithmetic, and the in-process store that applies it.

Per-minute limits (``rpm``, ``tpm``) are GCRA (the generic cell rate algorithm): each
key keeps one number, its *theoretical arrival time* ``tat``. Taking ``cost`` units
moves ``tat`` to ``max(tat, now) + cost * 60 / limit``; the take fits while ``tat`` stays
within 60 s of ``now``. A full minute's worth may therefore arrive at once, and the
allowance refills continuously (``limit`` per 60 s). A refund moves ``tat`` back, never
before ``now``; a charge past the reservation moves it forward (debt that later
requests wait out). ``max_parallel`` is a set of leases, each with an expiry so a
lost release (a crashed gateway) cannot hold a slot forever. ``tokens_per_day`` is a
counter named after the UTC day, so it resets at 00:00 UTC by construction.
``max_budget`` (picodollars, ``gateway.observe.cost``) is checked against the spend of
the current ``budget_period`` (``gateway.access.periods``) at admission, reserving
nothing, and each settlement adds the request's cost to the period it ends in.

An admission is all or nothing: a refused request consumes no allowance. The Redis
store (``gateway.access.redis_store``) runs the same arithmetic in one Lua script.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from config.frontdoor import BudgetPeriod
from gateway.access.periods import DAY, bounds, label

WINDOW = 60.0
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class KeyLimits:
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    tokens_per_day: int | None = None
    max_budget: int | None = None  # picodollars per budget_period
    budget_period: BudgetPeriod = "month"


@dataclass(frozen=True, slots=True)
class Ask:
    """One admission: ``cost`` tokens reserved (prompt estimate + ``max_tokens``)."""

    key: str
    limits: KeyLimits
    cost: int
    lease: str


@dataclass(frozen=True, slots=True)
class Window:
    """The state of one per-minute limit, as OpenAI's ``x-ratelimit-*`` headers show it."""

    limit: int
    remaining: int
    reset: float  # seconds until the allowance is full again


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str | None = None  # rpm | tpm | too_large | parallel | budget | spend | store
    retry_after: float = 0.0
    requests: Window | None = None
    tokens: Window | None = None
    day: str = ""
    day_used: int = 0
    inflight: int = 0
    spent: int = 0  # picodollars spent in the current budget period (with a max_budget)
    budget_resets_at: float = 0.0  # the period's end, seconds since the epoch


@dataclass(frozen=True, slots=True)
class Settlement:
    """The end of one admitted request: ``delta`` = real tokens minus the reservation;
    ``cost``: what it cost, in picodollars (charged with a ``max_budget``)."""

    key: str
    limits: KeyLimits
    lease: str
    day: str
    delta: int
    cost: int = 0


# --------------------------------------------------------------------------- arithmetic


def gcra_take(tat: float, now: float, limit: int, cost: int) -> tuple[bool, float, float]:
    """``(fits, new_tat, retry_after)`` for taking ``cost`` of a per-minute ``limit``.

    ``retry_after`` is ``inf`` when ``cost`` alone exceeds the limit (it never fits).
    """
    interval = WINDOW / limit
    new = max(tat, now) + cost * interval
    if new - now <= WINDOW + _EPS:
        return True, new, 0.0
    if cost > limit:
        return False, tat, math.inf
    return False, tat, new - now - WINDOW


def gcra_adjust(tat: float, now: float, limit: int, delta: int) -> float:
    """Charge (``delta > 0``) or refund (``delta < 0``) after the fact."""
    return max(now, max(tat, now) + delta * WINDOW / limit)


def gcra_window(tat: float, now: float, limit: int) -> Window:
    used = max(0.0, tat - now)
    remaining = math.floor((WINDOW - used) * limit / WINDOW + _EPS)
    return Window(limit, max(0, min(limit, remaining)), used)


def openai_duration(seconds: float) -> str:
    """A ``Window.reset`` as OpenAI writes it: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1.0:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60.0)
    if minutes:
        return f"{int(minutes)}m{round(rest)}s"
    return f"{round(rest, 3):g}s"


def utc_day(now: float) -> str:
    """The UTC day as days since the epoch (what the Redis script can compute too)."""
    return str(int(now // 86400))


def seconds_to_midnight(now: float) -> float:
    return 86400.0 - (now % 86400.0)


# --------------------------------------------------------------------------- memory store


class MemoryStore:
    """Limits for one gateway process. Owned by the event loop; no awaits inside a call,
    so each admission is atomic with respect to every other."""

    def __init__(self, *, lease_ttl: float) -> None:
        self._lease_ttl = lease_ttl
        self._today = ""
        self._rpm: dict[str, float] = {}
        self._tpm: dict[str, float] = {}
        self._leases: dict[str, dict[str, float]] = {}
        self._day: dict[tuple[str, str], int] = {}
        self._spend: dict[str, tuple[str, int]] = {}  # key -> (period, picodollars spent)
        self.now = time.time

    async def admit(self, ask: Ask) -> Verdict:
        return self.admit_at(ask, self.now())

    async def settle(self, settlement: Settlement) -> None:
        self.settle_at(settlement, self.now())

    async def peek(self, key: str, limits: KeyLimits) -> Verdict:
        now = self.now()
        return self._verdict(key, limits, now, utc_day(now), None)

    async def close(self) -> None:
        return None

    def admit_at(self, ask: Ask, now: float) -> Verdict:
        key, limits = ask.key, ask.limits
        day = utc_day(now)
        leases = self._live_leases(key, now)
        refused: tuple[str, float] | None = None
        used = self._day.get((key, day), 0)
        spent, resets_at = self._spent(key, limits, now)
        if limits.tokens_per_day is not None and used >= limits.tokens_per_day:
            refused = ("budget", seconds_to_midnight(now))
        elif limits.max_budget is not None and spent >= limits.max_budget:
            refused = ("spend", resets_at - now)
        elif limits.max_parallel is not None and len(leases) >= limits.max_parallel:
            refused = ("parallel", 1.0)
        new_rpm = new_tpm = None
        if refused is None and limits.rpm is not None:
            fits, new_rpm, wait = gcra_take(self._rpm.get(key, 0.0), now, limits.rpm, 1)
            refused = None if fits else ("rpm", wait)
        if refused is None and limits.tpm is not None:
            fits, new_tpm, wait = gcra_take(self._tpm.get(key, 0.0), now, limits.tpm, ask.cost)
            refused = None if fits else ("too_large" if math.isinf(wait) else "tpm", wait)
        if refused is not None:
            return self._verdict(key, limits, now, day, refused)
        if new_rpm is not None:
            self._rpm[key] = new_rpm
        if new_tpm is not None:
            self._tpm[key] = new_tpm
        if limits.max_parallel is not None:
            leases[ask.lease] = now + self._lease_ttl
        if limits.tokens_per_day is not None:
            self._day[(key, day)] = used + ask.cost
            self._forget_old_days(day)
        return self._verdict(key, limits, now, day, None)

    def settle_at(self, settlement: Settlement, now: float) -> None:
        key, limits = settlement.key, settlement.limits
        self._leases.get(key, {}).pop(settlement.lease, None)
        if limits.tpm is not None and key in self._tpm:
            self._tpm[key] = gcra_adjust(self._tpm[key], now, limits.tpm, settlement.delta)
        day_key = (key, settlement.day)
        if limits.tokens_per_day is not None and day_key in self._day:
            self._day[day_key] = max(0, self._day[day_key] + settlement.delta)
        if limits.max_budget is not None and settlement.cost > 0:
            spent, _ = self._spent(key, limits, now)
            start, _ = bounds(now, limits.budget_period)
            self._spend[key] = (label(limits.budget_period, start), spent + settlement.cost)

    def _spent(self, key: str, limits: KeyLimits, now: float) -> tuple[int, float]:
        """The key's spend in the period holding ``now``, and that period's end (0s
        without a ``max_budget``). One entry per key: a new period starts from 0."""
        if limits.max_budget is None:
            return 0, 0.0
        start, end = bounds(now, limits.budget_period)
        found = self._spend.get(key)
        spent = (
            found[1] if found is not None and found[0] == label(limits.budget_period, start) else 0
        )
        return spent, end * DAY

    def _live_leases(self, key: str, now: float) -> dict[str, float]:
        leases = self._leases.setdefault(key, {})
        for lease, expiry in list(leases.items()):
            if expiry <= now:
                del leases[lease]
        return leases

    def _forget_old_days(self, today: str) -> None:
        # Bounded: once a new UTC day starts, the counters of earlier days go.
        if today != self._today:
            self._today = today
            for stale in [k for k in self._day if k[1] != today]:
                del self._day[stale]

    def _verdict(
        self,
        key: str,
        limits: KeyLimits,
        now: float,
        day: str,
        refused: tuple[str, float] | None,
    ) -> Verdict:
        requests = tokens = None
        if limits.rpm is not None:
            requests = gcra_window(self._rpm.get(key, 0.0), now, limits.rpm)
        if limits.tpm is not None:
            tokens = gcra_window(self._tpm.get(key, 0.0), now, limits.tpm)
        spent, resets_at = self._spent(key, limits, now)
        return Verdict(
            refused is None,
            refused[0] if refused else None,
            refused[1] if refused else 0.0,
            requests,
            tokens,
            day,
            self._day.get((key, day), 0),
            len(self._live_leases(key, now)),
            spent,
            resets_at,
        )
