"""The local store of a fleet on one host with no Redis: the supervisor's hub holds one
``MemoryStore`` (client limits) and one ``MemoryResponseStore`` (``/v1/responses``), and
every worker reaches them over its fleet channel.

Limits stay exact across workers for the reason they are exact in one process: the hub's
event loop is their one owner and runs each admission without an await inside, so two
workers' admissions never interleave. ``HubLimits`` and ``HubResponses`` are the
workers' side (the ``Store`` and ``ResponseStore`` protocols), ``SharedStores`` the
hub's; between them each value travels as a small JSON array (``ask_wire`` and friends).
A store call costs one round trip on the UNIX socket (docs/workers.md has the figure).
"""

from __future__ import annotations

import math
from typing import Any

from config.frontdoor import LimitsConfig
from config.schema import ResponsesConfig
from gateway.access.limits import Ask, KeyLimits, MemoryStore, Settlement, Verdict, Window
from gateway.api.responses.store import MemoryResponseStore, StoredResponse, StoreUnavailable
from gateway.fleet.link import FleetLink

LIMITS_OPS = frozenset({"limits.admit", "limits.settle", "limits.peek"})
RESPONSES_OPS = frozenset({"responses.get", "responses.put", "responses.delete"})

# --------------------------------------------------------------------------- the wire


def limits_wire(limits: KeyLimits) -> list[Any]:
    li = limits
    return [li.rpm, li.tpm, li.max_parallel, li.tokens_per_day, li.max_budget, li.budget_period]


def limits_of(raw: list[Any]) -> KeyLimits:
    rpm, tpm, max_parallel, tokens_per_day, max_budget, period = raw
    return KeyLimits(rpm, tpm, max_parallel, tokens_per_day, max_budget, period)


def ask_wire(ask: Ask) -> list[Any]:
    return [ask.key, limits_wire(ask.limits), ask.cost, ask.lease]


def ask_of(raw: list[Any]) -> Ask:
    return Ask(raw[0], limits_of(raw[1]), raw[2], raw[3])


def settlement_wire(settlement: Settlement) -> list[Any]:
    s = settlement
    return [s.key, limits_wire(s.limits), s.lease, s.day, s.delta, s.cost]


def settlement_of(raw: list[Any]) -> Settlement:
    return Settlement(raw[0], limits_of(raw[1]), raw[2], raw[3], raw[4], raw[5])


def _window_wire(window: Window | None) -> list[float] | None:
    return None if window is None else [window.limit, window.remaining, window.reset]


def _window_of(raw: list[float] | None) -> Window | None:
    return None if raw is None else Window(int(raw[0]), int(raw[1]), float(raw[2]))


def verdict_wire(verdict: Verdict) -> list[Any]:
    v = verdict
    # JSON has no infinity: a request too large to ever fit travels as -1.
    wait = -1.0 if math.isinf(v.retry_after) else v.retry_after
    requests, tokens = _window_wire(v.requests), _window_wire(v.tokens)
    return [
        *(v.allowed, v.reason, wait, requests, tokens, v.day, v.day_used, v.inflight),
        *(v.spent, v.budget_resets_at),
    ]


def verdict_of(raw: list[Any]) -> Verdict:
    allowed, reason, wait, requests, tokens, day, day_used, inflight, spent, resets = raw
    return Verdict(
        allowed=allowed,
        reason=reason,
        retry_after=math.inf if wait < 0 else wait,
        requests=_window_of(requests),
        tokens=_window_of(tokens),
        day=day,
        day_used=day_used,
        inflight=inflight,
        spent=spent,
        budget_resets_at=resets,
    )


# --------------------------------------------------------------------------- the workers'


class HubLimits:
    """A worker's limit store: the hub's ``MemoryStore``. Calls are bounded by the
    ``GuardedStore`` in front of it (``limits.store_timeout``, failure policy)."""

    kind = "fleet"

    def __init__(self, link: FleetLink) -> None:
        self._link = link

    async def admit(self, ask: Ask) -> Verdict:
        return verdict_of(await self._link.call("limits.admit", ask_wire(ask)))

    async def settle(self, settlement: Settlement) -> None:
        await self._link.call("limits.settle", settlement_wire(settlement))

    async def peek(self, key: str, limits: KeyLimits) -> Verdict:
        return verdict_of(await self._link.call("limits.peek", [key, limits_wire(limits)]))

    async def close(self) -> None:
        return None  # the link is the app's, closed by its lifespan


class HubResponses:
    """A worker's Responses store: the hub's ``MemoryResponseStore``; a call that fails
    or takes longer than ``timeout`` is a 503, as with Redis."""

    def __init__(self, link: FleetLink, timeout: float) -> None:
        self._link = link
        self._timeout = timeout

    async def get(self, response_id: str) -> StoredResponse | None:
        data = await self._call("responses.get", response_id)
        return None if data is None else StoredResponse.decode(data.encode())

    async def put(self, response_id: str, entry: StoredResponse) -> None:
        await self._call("responses.put", [response_id, entry.encode().decode()])

    async def delete(self, response_id: str) -> bool:
        removed: bool = await self._call("responses.delete", response_id)
        return removed

    async def close(self) -> None:
        return None

    async def _call(self, op: str, body: Any) -> Any:
        try:
            return await self._link.call(op, body, self._timeout)
        except Exception as exc:  # closed, timed out, or the hub's own failure
            raise StoreUnavailable(f"response store unavailable: {exc}") from None


# --------------------------------------------------------------------------- the hub's


class SharedStores:
    """The stores the hub serves: limits when ``limits`` is given (``limits.store`` is
    ``memory``), responses when ``responses`` is. Owned by the hub's event loop."""

    def __init__(self, limits: LimitsConfig | None, responses: ResponsesConfig | None) -> None:
        self.limits = None if limits is None else MemoryStore(lease_ttl=limits.lease_ttl)
        self.responses = (
            None if responses is None else MemoryResponseStore(responses.max_entries, responses.ttl)
        )

    def serves(self, op: str) -> bool:
        if op in LIMITS_OPS:
            return self.limits is not None
        return op in RESPONSES_OPS and self.responses is not None

    async def handle(self, op: str, body: Any) -> Any:
        if op in LIMITS_OPS:
            return await self._limits(op, body)
        return await self._responses(op, body)

    async def _limits(self, op: str, body: Any) -> Any:
        store = self.limits
        assert store is not None  # serves() said so
        if op == "limits.admit":
            return verdict_wire(await store.admit(ask_of(body)))
        if op == "limits.settle":
            await store.settle(settlement_of(body))
            return None
        return verdict_wire(await store.peek(body[0], limits_of(body[1])))

    async def _responses(self, op: str, body: Any) -> Any:
        store = self.responses
        assert store is not None
        if op == "responses.get":
            found = await store.get(body)
            return None if found is None else found.encode().decode()
        if op == "responses.put":
            await store.put(body[0], StoredResponse.decode(body[1].encode()))
            return None
        return await store.delete(body)
