"""Traffic splits and mirrors: the table of split routes, and the choices, made by
hashing so that every gateway replica, and a restarted one, makes the same choice for the
same request.

``pick`` chooses a route's target by weighted rendezvous hashing: each target scores the
request's key and the highest score wins, target ``t`` with probability ``w_t / sum(w)``.
A session key therefore stays on one target while the weights stay the same, and when
they change only the sessions the new weights need elsewhere move. ``mirrored`` says
whether a request is among the share a model copies to its shadow, by its request id.
``Splits`` holds the configured routes and picks a route's target for one request among
those a client key may use.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from config.routes import RouteConfig
from gateway.registry.errors import ModelNotFound

# Odd multiples of 2**-53: exact floats strictly inside (0, 1), so log() never sees 0 or 1.
_SCALE = float(1 << 53)


@dataclass(frozen=True, slots=True)
class SplitKey:
    """What a split hashes for one request: its id, and the session it belongs to (the
    client's ``x-session-id``, else the request's ``user``; ``None`` when neither)."""

    request_id: str
    session: str | None = None

    def for_route(self, sticky: bool) -> str:
        """The session for a sticky route when there is one, else the request id."""
        if sticky and self.session:
            return "session:" + self.session
        return "request:" + self.request_id


def pick(targets: Sequence[tuple[str, float]], key: str) -> str:
    """The target of ``targets`` (``(name, weight > 0)`` pairs, at least one) for ``key``."""
    best, best_score = targets[0][0], -1.0
    for name, weight in targets:
        score = weight / -math.log(unit(name, key))
        if score > best_score:
            best, best_score = name, score
    return best


def mirrored(request_id: str, share: float) -> bool:
    """Whether the request is among the ``share`` (0 < share <= 1) a model mirrors."""
    return unit("mirror", request_id) < share


def unit(salt: str, key: str) -> float:
    """A number in (0, 1), uniform over keys and fixed for ``(salt, key)``."""
    digest = hashlib.blake2b(f"{salt}\0{key}".encode(), digest_size=8).digest()
    return (2 * (int.from_bytes(digest, "big") >> 12) + 1) / _SCALE


class Splits:
    """The configured split routes by name. Owned by the registry, on its loop; a reload
    builds a new one. ``resolve`` maps a configured target to the model (or adapter) name
    it stands for now."""

    def __init__(self, routes: Iterable[RouteConfig], resolve: Callable[[str], str]) -> None:
        self._routes = {route.name: route for route in routes}
        self._resolve = resolve

    def get(self, name: str) -> RouteConfig | None:
        return self._routes.get(name)

    def all(self) -> tuple[RouteConfig, ...]:
        """Every route, in config order."""
        return tuple(self._routes.values())

    def targets(self, name: str) -> tuple[str, ...]:
        """The models (or adapters) route ``name`` may send to; () for other names."""
        route = self._routes.get(name)
        return () if route is None else tuple(self._resolve(t) for t in route.split)

    def choose(
        self, route: RouteConfig, key: SplitKey | None, may_use: Callable[[str], bool] | None
    ) -> str:
        """The target of ``route`` for ``key`` (``None``: a fresh draw) among those
        ``may_use`` lets through; ``ModelNotFound`` when it lets none through."""
        targets = route.targets
        if may_use is not None:
            targets = tuple(t for t in targets if may_use(self._resolve(t[0])))
        if not targets:
            raise ModelNotFound(f"The model '{route.name}' does not exist", param="model")
        key = key or SplitKey(f"{random.getrandbits(64):016x}")
        return pick(targets, key.for_route(route.sticky))
