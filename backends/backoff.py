"""The one exponential backoff: the registry's restart delays and the openai backend's
retries both count attempts with it."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before attempt ``n`` after a failure: ``base * 2**(n-1)``, capped at ``cap``."""

    base: float = 1.0
    cap: float = 60.0

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return min(self.cap, self.base * 2.0 ** min(failures - 1, 30))

    def jittered(self, failures: int) -> float:
        """``delay`` scaled by a random factor in [0.5, 1): spreads clients retrying at once."""
        return self.delay(failures) * (0.5 + random.random() / 2)
