"""Balance policies: which replica serves the next request. Pure; no I/O, no clock.

A policy sees only what the caller passes: the indices of the replicas it may use now
(healthy, not ejected, not yet tried for this request), each replica's in-flight count
and load score, and the request's affinity key. Each policy object is owned by the one
backend that built it (its round-robin cursor and random generator are its only state).

- ``round_robin``: the next eligible replica in config order.
- ``least_loaded``: power of two choices. Two distinct replicas at random, the lower
  load wins. Sampling keeps many gateways from herding onto the one replica that looked
  idle in the last scrape (Mitzenmacher; what Ray Serve and llm-d do).
- ``prefix``: consistent hashing with bounded load (Mirrokni, Thorup, Zadimoghaddam
  2018). The key picks a point on a ring of virtual nodes; the first replica clockwise
  whose in-flight count stays under ``bounded_capacity`` (``factor`` times the mean, with
  a noise floor at small loads) takes it, so a hot prefix spills to the next replica on
  the ring instead of melting one. The ring hashes the replica URLs, so every gateway
  with the same config agrees on it.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from backends.base import GenerationRequest, RequestKind

_VNODES = 160  # virtual nodes per replica: key shares within a few % of even


@dataclass(frozen=True, slots=True)
class Choice:
    index: int
    """Position of the chosen replica in the configured list."""
    reason: str
    """Why: ``only``, ``next``, ``p2c``, ``affinity`` or ``spill`` (a bounded label)."""


class Policy(Protocol):
    name: str

    def choose(
        self,
        eligible: Sequence[int],
        inflight: Sequence[int],
        load: Sequence[float],
        key: str,
    ) -> Choice: ...


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._cursor = 0

    def choose(
        self, eligible: Sequence[int], inflight: Sequence[int], load: Sequence[float], key: str
    ) -> Choice:
        count = len(inflight)
        for step in range(count):
            index = (self._cursor + step) % count
            if index in eligible:
                self._cursor = index + 1
                return Choice(index, "next")
        raise ValueError("no eligible replica")


class LeastLoaded:
    name = "least_loaded"

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(
        self, eligible: Sequence[int], inflight: Sequence[int], load: Sequence[float], key: str
    ) -> Choice:
        if not eligible:
            raise ValueError("no eligible replica")
        if len(eligible) == 1:
            return Choice(eligible[0], "only")
        first, second = self._rng.sample(list(eligible), 2)
        # Ties (all idle) go either way at random, which is the spread we want.
        best = (
            first if (load[first], inflight[first]) <= (load[second], inflight[second]) else second
        )
        return Choice(best, "p2c")


class PrefixAffinity:
    name = "prefix"

    def __init__(self, urls: Sequence[str], load_factor: float) -> None:
        self._factor = load_factor
        points = sorted(
            (_hash(f"{url}#{v}"), index) for index, url in enumerate(urls) for v in range(_VNODES)
        )
        self._points = [point for point, _ in points]
        self._owners = [owner for _, owner in points]

    def primary(self, key: str) -> int:
        """The replica that owns ``key`` when every replica is eligible and idle."""
        return self._owners[bisect.bisect(self._points, _hash(key)) % len(self._points)]

    def choose(
        self, eligible: Sequence[int], inflight: Sequence[int], load: Sequence[float], key: str
    ) -> Choice:
        if not eligible:
            raise ValueError("no eligible replica")
        allowed = set(eligible)
        capacity = bounded_capacity(sum(inflight[i] for i in allowed), len(allowed), self._factor)
        start = bisect.bisect(self._points, _hash(key))
        seen: set[int] = set()
        first: int | None = None
        for step in range(len(self._points)):
            owner = self._owners[(start + step) % len(self._points)]
            if owner in seen or owner not in allowed:
                continue
            seen.add(owner)
            if first is None:
                first = owner
            if inflight[owner] < capacity:
                return Choice(owner, "affinity" if owner == first else "spill")
            if len(seen) == len(allowed):
                break
        # Unreachable in practice (the mean is always under capacity); stay total anyway.
        return Choice(first if first is not None else eligible[0], "affinity")


def bounded_capacity(total: int, replicas: int, factor: float) -> int:
    """Most requests one replica may hold once this one is placed: ``factor`` times the
    mean (the paper's bound), but never within two standard deviations of the mean.
    In-flight counts are small integers that fluctuate like Poisson counts (standard
    deviation ~ sqrt(mean)): at 4 in flight per replica the plain bound (6) is one
    fluctuation away, so keys whose home is merely busy right now would spill although
    nothing is hot. The noise floor decides below ~9 per replica (factor 1.5); above,
    the factor does."""
    mean = (total + 1) / replicas
    return max(math.ceil(factor * mean), math.ceil(mean + 2.0 * math.sqrt(mean)))


def build_policy(name: str, urls: Sequence[str], load_factor: float) -> Policy:
    if name == "round_robin":
        return RoundRobin()
    if name == "prefix":
        return PrefixAffinity(urls, load_factor)
    return LeastLoaded()


def affinity_key(request: GenerationRequest, chars: int) -> str:
    """What ``prefix`` hashes: the session header, else ``user``, else the first
    ``chars`` characters of the rendered conversation (or prompt), the part an engine's
    prefix cache can reuse across requests."""
    if request.session_id:
        return f"s:{request.session_id}"
    if request.user:
        return f"u:{request.user}"
    if request.kind is RequestKind.CHAT:
        parts: list[str] = []
        size = 0
        for message in request.messages:
            parts.append(f"{message.role}\x1f{message.content}\x1e")
            size += len(parts[-1])
            if size >= chars:
                break
        return "p:" + "".join(parts)[:chars]
    return "p:" + request.prompt[:chars]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
