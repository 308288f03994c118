"""Exponential backoff with jitter (pure: the random source is an argument).

Jitter spreads the retries of many replicas (and of our own informers) after an apiserver
hiccup, so they do not come back in lockstep and knock it over again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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
