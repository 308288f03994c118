"""How many idle pods may be evicted now: a token bucket that never lends. Pure (time is an argument).

Unlike the node writes' bucket (``balancer.backoff.TokenBucket``, which grants every call and
says how long to wait), an eviction either fits the budget now or waits for the next look: a
finding that is still idle then is found again, and nothing queues behind a budget that is spent.
"""

from __future__ import annotations


class EvictionBudget:
    """``per_hour`` evictions sustained, at most ``burst`` saved up; starts full."""

    def __init__(self, per_hour: float, burst: int) -> None:
        self.per_hour, self.burst = per_hour, burst
        self.tokens = float(burst)
        self.updated: float | None = None

    def _refill(self, now: float) -> None:
        if self.updated is not None and now > self.updated:
            self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.per_hour / 3600)
        self.updated = now if self.updated is None else max(self.updated, now)

    def available(self, now: float) -> int:
        """Whole evictions the budget allows at ``now``."""
        self._refill(now)
        return int(self.tokens + 1e-9)

    def spend(self, now: float) -> None:
        """One eviction done (or sent: a refused one is given back with :meth:`refund`)."""
        self._refill(now)
        self.tokens = max(self.tokens - 1.0, 0.0)

    def refund(self, now: float) -> None:
        self._refill(now)
        self.tokens = min(float(self.burst), self.tokens + 1.0)
