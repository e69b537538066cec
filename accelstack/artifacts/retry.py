"""How hard to try one mirror before moving on to the next: retries, backoff and jitter."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

__all__ = ["RetryPolicy"]


@dataclass
class RetryPolicy:
    """How hard to try one mirror before moving on to the next.

    ``retries`` counts failures in a row that made no progress (an attempt that received bytes
    resets the count, since resuming costs nothing); ``max_attempts`` caps all attempts on one
    mirror. The delay before retry ``n`` is ``min(backoff_max, backoff_base * 2**(n-1))`` times a
    random factor in ``[1 - jitter, 1]`` (a server's ``Retry-After`` is honoured up to
    ``backoff_max``).
    """

    retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    jitter: float = 0.5
    max_attempts: int = 50

    def delay(self, failures: int, retry_after: Optional[float] = None) -> float:
        base = min(self.backoff_max, self.backoff_base * (2 ** max(0, failures - 1)))
        base *= 1.0 - self.jitter * random.random()
        if retry_after is not None:
            base = max(base, min(retry_after, self.backoff_max))
        return base
