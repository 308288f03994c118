"""The GPUInventory's consumer of the watches: which PriorityClass is the global default, and what
the inventory says now, read from the labeller's and the extender's caches.

Its own lock guards only the PriorityClasses; the rest is copied from the other consumers
under theirs, one at a time (never two locks held together).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from webhook.balancer.labeller import Labeller
from webhook.placement import gpuinventory as inventory_mod


class InventorySource:
    """Answers ``InventoryPublisher``'s ``content``; every method is thread-safe."""

    def __init__(self, labeller: Labeller, *, ready: Callable[[], bool],
                 pressure: Callable[[], dict[str, float]] | None) -> None:
        self._labeller = labeller
        self._ready = ready
        self._pressure = pressure
        self._defaults: dict[str, bool] = {}
        self._lock = threading.Lock()

    def replace_priority_classes(self, marked: dict[str, bool]) -> None:
        with self._lock:
            self._defaults = dict(marked)

    def priority_class(self, name: str, is_default: bool | None) -> None:
        with self._lock:
            if is_default is None:
                self._defaults.pop(name, None)
            else:
                self._defaults[name] = is_default

    def content(self) -> inventory_mod.Content | None:
        """What the GPUInventory says now, or None until every cache it reads holds a full list."""
        if not self._ready():
            return None
        pressure = self._pressure() if self._pressure is not None else {}
        nodes, requested, dra = self._labeller.snapshot()  # a snapshot under the lock, the sums outside it
        with self._lock:
            defaults = dict(self._defaults)
        return inventory_mod.content(nodes, requested, defaults, pressure, dra=dra)
