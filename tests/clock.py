"""A clock a test sets by hand, for code that takes ``clock: Callable[[], float]``.

The lease (``webhook/lease.py``) and the inventory file watcher (``admission/inventoryfile.py``)
read time only through the callable they are given; a test moves ``now`` instead of sleeping.
"""

from __future__ import annotations


class Clock:
    """Returns ``now`` when called; the test assigns or advances it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
