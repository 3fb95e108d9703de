"""The retry walk over replicas, shared by every replica-backed call (generation streams
of both remote backends, embeddings).

One attempt picks a replica (``ReplicaSet.pick``) and runs the caller's ``attempt`` on
it. A failure is accounted to that replica (health, ejection, metrics); a retryable one
is retried, up to ``retries`` times, on an eligible replica not tried yet for this
request, and only when every one had its go after a jittered backoff (longer when the
upstream said how long, ``Overloaded.retry_after``). The caller's ``attempt`` must return
only once it is safe to commit to that replica: when it has its first events, none of
which reached the client yet. A stream that broke later and resumes
(``backends.openai_proxy.resume``) walks again, starting with another replica.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

from backends.backoff import Backoff
from backends.base import BackendCrashed, BackendError, GenerationRequest, Overloaded
from backends.replicas.replica import Replica
from backends.replicas.replica_set import ReplicaSet

T = TypeVar("T")

RETRY_BACKOFF = Backoff(base=0.1, cap=2.0)


class GiveUp(Exception):
    """Raised by an ``attempt`` for an error that must not be retried anywhere (it is
    accounted to the replica, then raised as is)."""

    def __init__(self, error: BackendError) -> None:
        super().__init__(str(error))
        self.error = error


async def first_success(
    replicas: ReplicaSet,
    request: GenerationRequest | None,
    attempt: Callable[[Replica], Awaitable[T]],
    *,
    retries: int,
    retryable: Callable[[BackendError], bool],
    stopping: Callable[[], bool],
    exclude: Collection[str] = (),
) -> tuple[T, Replica, float]:
    """``(attempt's result, the replica it ran on, seconds slept in backoffs)``. The
    replica is still counted in flight: the caller ``release``s it when done. Raises the
    last error when it is not retryable or the retries are spent, ``BackendCrashed``
    when the backend stopped meanwhile, ``UpstreamUnavailable`` when every replica is
    ejected. ``exclude``: URLs that count as tried already (a stream resumed after its
    replica broke goes elsewhere first)."""
    tried: list[str] = list(exclude)
    count = 0
    slept = 0.0
    while True:
        replica = replicas.pick(request, tried, count)
        try:
            result = await attempt(replica)
        except GiveUp as give_up:
            replica.release()
            replica.account(give_up.error, time.monotonic())
            raise give_up.error from None
        except BackendError as error:
            replica.release()
            replica.account(error, time.monotonic())
            if stopping():
                raise BackendCrashed("backend stopped") from error
            if not retryable(error) or count >= retries:
                raise
            tried.append(replica.url)
            count += 1
            if not replicas.candidates(tried, time.monotonic()):
                tried.clear()  # every replica had its go: back off, then start over
                delay = backoff_delay(count - 1, error)
                await asyncio.sleep(delay)
                slept += delay
            continue
        except BaseException:
            replica.release()
            raise
        replica.account(None, time.monotonic())
        return result, replica, slept


def backoff_delay(attempt: int, error: BackendError) -> float:
    hinted = error.retry_after if isinstance(error, Overloaded) else 0.0
    return max(min(hinted, RETRY_BACKOFF.cap), RETRY_BACKOFF.jittered(attempt + 1))
