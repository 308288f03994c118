"""Pacing of the balancer's API calls (pure: clocks and random sources are arguments).

Three tools that hold calls back: exponential backoff with jitter after an error (jitter spreads
the retries of many replicas and informers after an apiserver hiccup, so they do not come back in
lockstep and knock it over again), a token bucket that caps the rate of node patches, and the
per-node write schedule that coalesces the changes of one node into as few patches as the rules
allow.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

V = TypeVar("V")


class Uniform(Protocol):
    """The one thing backoff asks of a random source (``random.Random`` has it)."""

    def uniform(self, a: float, b: float) -> float: ...


@dataclass
class Backoff:
    """Delays ``initial * 2**n`` capped at ``maximum``, each drawn uniformly from its upper half."""

    initial: float
    maximum: float
    rng: Uniform
    attempts: int = 0

    def next(self) -> float:
        ceiling = min(self.maximum, self.initial * (2 ** min(self.attempts, 30)))
        self.attempts += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0


@dataclass
class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up: client-go's ``tokenBucketRateLimiter``.

    :meth:`reserve` always grants the token and says how long to wait before using it (the
    balance may go negative, as ``golang.org/x/time/rate``'s reservations do), so callers on
    several threads queue fairly without polling.
    """

    rate: float
    burst: int
    tokens: float = field(init=False)
    updated: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)

    def reserve(self, now: float) -> float:
        """Take one token; return the seconds to wait before the call it pays for (0: go now)."""
        if self.updated is not None and now > self.updated:
            self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.rate)
        self.updated = now if self.updated is None else max(self.updated, now)
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


@dataclass
class WriteSchedule(Generic[V]):
    """Which node to write when: the latest wanted value per key, written at most once per
    ``interval`` unless the change is urgent.

    A key moves through: :meth:`want` (pending) -> :meth:`due` (handed to a writer, "busy") ->
    :meth:`take` (the value to send, read as late as possible so the newest wins) -> one of
    :meth:`written`, :meth:`failed` (retry no earlier than a time) or :meth:`release` (not sent,
    e.g. this replica stopped leading). A key is never handed out twice at once.

    Due times sit in a heap (stale entries are skipped when they surface), so a pass costs
    O(changes * log n), not a scan of 5,000 pending nodes per watch event.
    """

    interval: float
    wanted: dict[str, V] = field(default_factory=dict)
    urgent: set[str] = field(default_factory=set)
    last_write: dict[str, float] = field(default_factory=dict)
    not_before: dict[str, float] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)
    coalesced: int = 0
    """Wanted values that replaced a pending one instead of costing a patch of their own."""
    _heap: list[tuple[float, str]] = field(default_factory=list)

    def want(self, key: str, value: V, *, urgent: bool) -> None:
        """Ask for ``value`` on ``key``; it replaces any pending value (the latest wins)."""
        pending = key in self.wanted
        if pending and self.wanted[key] != value:
            self.coalesced += 1
        self.wanted[key] = value
        if urgent and key not in self.urgent:
            self.urgent.add(key)
            pending = False  # due earlier now
        if not pending:
            self._push(key)

    def drop(self, key: str) -> None:
        """Nothing to write any more (the node already carries what we want)."""
        self.wanted.pop(key, None)
        self.urgent.discard(key)
        self.not_before.pop(key, None)

    def forget(self, key: str) -> None:
        """The node is gone: drop its history too."""
        self.drop(key)
        self.last_write.pop(key, None)

    def due_at(self, key: str) -> float:
        """When ``key``'s pending value may be written (-inf: now)."""
        at = float("-inf")
        if key not in self.urgent and key in self.last_write:
            at = self.last_write[key] + self.interval
        return max(at, self.not_before.get(key, float("-inf")))

    def due(self, now: float) -> list[str]:
        """Pending keys whose time has come, urgent ones first; each is marked busy."""
        ready: dict[str, None] = {}  # a set in insertion order: 5,000 first labels are not O(n^2)
        later: list[str] = []
        while self._heap and self._heap[0][0] <= now:
            _, key = heapq.heappop(self._heap)
            if key not in self.wanted or key in self.busy or key in ready:
                continue  # stale: written, dropped, already handed out
            if self.due_at(key) <= now:
                ready[key] = None
            else:
                later.append(key)
        for key in later:
            self._push(key)
        keys = sorted(ready, key=lambda key: (key not in self.urgent, key))
        self.busy.update(keys)
        return keys

    def next_at(self) -> float | None:
        """The earliest time a pending key that is not busy becomes due, or None."""
        while self._heap:
            at, key = self._heap[0]
            if key in self.wanted and key not in self.busy and self.due_at(key) == at:
                return at
            heapq.heappop(self._heap)
            if key in self.wanted and key not in self.busy:
                self._push(key)
        return None

    def take(self, key: str) -> V | None:
        """The value to send for a busy key now (None: nothing is wanted any more)."""
        return self.wanted.get(key)

    def written(self, key: str, value: V, now: float) -> None:
        """``value`` was stored; a newer wanted value stays pending for after the interval."""
        self.busy.discard(key)
        self.last_write[key] = now
        self.not_before.pop(key, None)
        if self.wanted.get(key) == value:
            self.wanted.pop(key, None)
            self.urgent.discard(key)
        else:
            self._push(key)

    def failed(self, key: str, *, retry_at: float) -> None:
        """Not stored; keep it pending and try again no earlier than ``retry_at``."""
        self.busy.discard(key)
        self.not_before[key] = retry_at
        self._push(key)

    def release(self, key: str) -> None:
        """Handed back unsent (no leadership, shutting down, nothing to send); stays pending."""
        self.busy.discard(key)
        if key in self.wanted:
            self._push(key)

    def pending(self) -> int:
        return len(self.wanted)

    def _push(self, key: str) -> None:
        heapq.heappush(self._heap, (self.due_at(key), key))
