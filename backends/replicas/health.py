"""Two small state machines: probe hysteresis and a circuit breaker.

Both are pure (the caller passes the clock) and owned by the event loop of the backend
that holds them; neither is thread-safe nor needs to be.
"""

from __future__ import annotations

from dataclasses import dataclass


class HealthTracker:
    """Up/down with hysteresis: ``failures_down`` consecutive failed probes mark the
    upstream down, ``successes_up`` consecutive passed probes mark it up again.

    It starts down, and the very first passed probe marks it up at once (there is no
    history to smooth yet), so a freshly started gateway is ready as soon as its
    upstream answers.
    """

    def __init__(self, failures_down: int, successes_up: int) -> None:
        self._failures_down = failures_down
        self._successes_up = successes_up
        self._up = False
        self._seen_success = False
        self._streak = 0  # consecutive results that disagree with the current state

    @property
    def up(self) -> bool:
        return self._up

    def record(self, ok: bool) -> bool:
        """Account one probe result; returns the (possibly new) state."""
        if ok and not self._seen_success:
            self._seen_success = True
            self._up = True
            self._streak = 0
            return True
        if ok == self._up:
            self._streak = 0
            return self._up
        self._streak += 1
        needed = self._successes_up if ok else self._failures_down
        if self._streak >= needed:
            self._up = ok
            self._streak = 0
        return self._up


@dataclass(frozen=True, slots=True)
class BreakerDecision:
    allowed: bool
    retry_after: float = 0.0


class CircuitBreaker:
    """Fails fast while an upstream keeps failing.

    ``threshold`` consecutive failed attempts open the breaker for ``cooldown`` seconds;
    while open every request is refused at once. After the cooldown requests pass again
    (half-open): one success closes the breaker, one failure re-opens it for another
    cooldown. Rejections by the upstream (4xx) are answers, not failures: callers record
    them as successes.
    """

    def __init__(self, threshold: int, cooldown: float) -> None:
        self._threshold = threshold
        self._cooldown = cooldown
        self._failures = 0
        self._opened_at = 0.0

    @property
    def is_open(self) -> bool:
        return self._failures >= self._threshold

    def check(self, now: float) -> BreakerDecision:
        if self._failures < self._threshold:
            return BreakerDecision(True)
        remaining = self._opened_at + self._cooldown - now
        if remaining <= 0:
            return BreakerDecision(True)
        return BreakerDecision(False, retry_after=remaining)

    def record_success(self) -> None:
        self._failures = 0

    def record_failure(self, now: float) -> None:
        self._failures += 1
        if self._failures >= self._threshold:
            self._opened_at = now
