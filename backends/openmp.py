"""The OpenMP wait policy the gateway's engines run with, unless the user chose one.

torch's CPU kernels run on libgomp here (Intel's libiomp in some builds). After each
parallel region its worker threads spin-wait for the next one (libgomp: up to
``GOMP_SPINCOUNT`` iterations; libiomp: ``KMP_BLOCKTIME`` ms). The hf engine shares its
process, and usually its cores, with the event loop that streams its tokens, and on a
shared machine with other processes: a spinning worker takes the core the loop (or the
team's own preempted thread) needs. A passive policy makes idle workers sleep at once
(measurements: docs/hf_profile.md, "OpenMP wait policy").

The runtime reads these variables once, when torch first starts its thread pool, so they
must be set before any import of torch: ``llmso serve`` does it at the start of its
command, and process-isolation workers get them in their environment.
"""

from __future__ import annotations

from collections.abc import MutableMapping

# Any of these set by the user means they chose the runtime's waiting behaviour.
_USER_CHOICE = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "KMP_LIBRARY")


def apply_wait_policy(env: MutableMapping[str, str]) -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``env`` unless a wait setting is there already;
    returns whether it set it."""
    if any(name in env for name in _USER_CHOICE):
        return False
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
