"""Pure choices for traffic splits and mirrors, made by hashing so that every gateway
replica, and a restarted one, makes the same choice for the same request.

``pick`` chooses a route's target by weighted rendezvous hashing: each target scores the
request's key and the highest score wins, target ``t`` with probability ``w_t / sum(w)``.
A session key therefore stays on one target while the weights stay the same, and when
they change only the sessions the new weights need elsewhere move. ``mirrored`` says
whether a request is among the share a model copies to its shadow, by its request id.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

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
