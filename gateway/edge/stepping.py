"""Run an awaitable by hand up to the point where it would first wait.

``first_step`` tells a caller whether the result was already there (no wait: no timer to
arm, nothing to hand out first) or gives a ``Resume`` to await for the rest. Used where a
wait is usually not needed: the body of a request that came with its headers
(``gateway.edge.web.BodyDeadline``) and the frames a stream has ready at once
(``gateway.edge.sse_batch``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from typing import Any


class Resume:
    """Awaitable that continues a step which already yielded ``pending`` to the loop.

    Everything the event loop sends or throws (cancellation included) is forwarded to the
    step, so timeouts and cancellation behave exactly as with a plain ``await``.
    ``throw``: an exception to raise inside the step first (its consumer was closed)."""

    __slots__ = ("_pending", "_step", "_throw")

    def __init__(self, step: Any, pending: Any, throw: BaseException | None = None) -> None:
        self._step = step
        self._pending = pending
        self._throw = throw

    def __await__(self) -> Generator[Any, Any, Any]:
        step = self._step
        value = self._pending
        error = self._throw
        try:
            if error is not None:
                value = step.throw(error)
            while True:
                try:
                    sent = yield value
                except BaseException as exc:  # the loop's cancellation, forwarded as is
                    value = step.throw(exc)
                else:
                    value = step.send(sent)
        except StopIteration as done:
            return done.value


def first_step(awaitable: Awaitable[Any]) -> tuple[Any, Resume | None]:
    """``(result, None)`` when ``awaitable`` finished without waiting, else
    ``(None, resume)``: await ``resume`` for the result. Exceptions propagate."""
    step = awaitable.__await__()
    try:
        pending = step.send(None)
    except StopIteration as done:
        return done.value, None
    return None, Resume(step, pending)
