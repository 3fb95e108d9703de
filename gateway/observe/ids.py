"""Fresh identifiers for requests and responses.

They name a request in logs, headers and response bodies and must not collide; they
guard nothing, so they come from the ``random`` module's generator (seeded from the OS at
start-up and again in a forked child) instead of a ``getrandom`` system call per id, two
per request.
"""

from __future__ import annotations

import random


def fresh_hex(nbytes: int) -> str:
    """``2 * nbytes`` lowercase hex digits, like ``secrets.token_hex(nbytes)``."""
    return f"{random.getrandbits(8 * nbytes):0{2 * nbytes}x}"
