"""What the rebalancer's decision knows of every node at once, and what it remembers between rounds (pure).

``Memo`` keeps answers about one node (``freeing.room``, ``freeing.cheapest``) while its view and the
pods that may leave it are the same: a caller that plans round after round keeps one, so an
unchanged node is not looked at again. ``Table`` holds every node's ``freeing.Room`` as columns, so
the questions asked of all nodes for each waiting pod (does it fit one now; which could fit it
after evictions) are a few array comparisons, not a loop; the exact answer is then asked of the
nodes that pass. A plan gives the same moves with or without either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from webhook.kube.demand import PodDemand
from webhook.placement import freeing
from webhook.placement.devices import DevicePolicy
from webhook.placement.inputs import NodeView

Going = tuple[tuple[str, str, int], ...]
"""The pods that may leave a node: (pod, its unit, the unit's size); a unit may span nodes, so its
size is part of what an answer about this node depends on."""


def going_from(view: NodeView, unit_of: Mapping[str, str], sizes: Mapping[str, int]) -> Going:
    return tuple((b.key, unit_of[b.key], sizes[unit_of[b.key]]) for b in view.pods if b.key in unit_of)


class Memo:
    """Answers about one node, kept while its view and its ``Going`` are the same."""

    def __init__(self) -> None:
        self.rooms: dict[str, tuple[NodeView, Going, freeing.Room]] = {}
        self.cheapest: dict[tuple[str, PodDemand], tuple[NodeView, Going, tuple[str, ...] | None]] = {}

    def room(self, view: NodeView, going: Going, unit_of: Mapping[str, str]) -> freeing.Room:
        found = self.rooms.get(view.name)
        if found is None or found[0] is not view or found[1] != going:
            found = self.rooms[view.name] = (view, going, freeing.room(view, unit_of))
        return found[2]

    def freeing(self, view: NodeView, going: Going, demand: PodDemand, unit_of: Mapping[str, str],
                sizes: Mapping[str, int], policy: DevicePolicy) -> tuple[str, ...] | None:
        key = (view.name, demand)
        found = self.cheapest.get(key)
        if found is None or found[0] is not view or found[1] != going:
            found = self.cheapest[key] = (view, going, freeing.cheapest(view, demand, unit_of, sizes, policy))
        return found[2]


COLUMNS = ("whole_now", "whole_most", "share_now", "share_most", "cpu_now", "cpu_most", "memory_now", "memory_most")


class Table:
    """Every node's ``Room`` as columns, in the order of ``names``; ``update`` one row after a move."""

    def __init__(self, names: Sequence[str], rooms: Mapping[str, freeing.Room]) -> None:
        self.names = list(names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.columns = {column: np.array([getattr(rooms[n], column) for n in self.names], dtype=np.int64)
                        for column in COLUMNS}
        self._masks: dict[frozenset[str], np.ndarray] = {}

    def update(self, name: str, room: freeing.Room) -> None:
        row = self.index[name]
        for column in COLUMNS:
            self.columns[column][row] = getattr(room, column)

    def usable(self, nodes: frozenset[str] | None) -> np.ndarray:
        """The rows a pod may use (all when ``nodes`` is None)."""
        if nodes is None:
            return np.ones(len(self.names), dtype=bool)
        if nodes not in self._masks:
            self._masks[nodes] = np.array([n in nodes for n in self.names], dtype=bool)
        return self._masks[nodes]

    def could_fit(self, demand: PodDemand, nodes: frozenset[str] | None, *, now: bool) -> list[str]:
        """The nodes ``freeing.could_fit`` lets through, in ``names`` order."""
        when = "now" if now else "most"
        c = self.columns
        mask = self.usable(nodes) & (c[f"cpu_{when}"] >= demand.cpu) & (c[f"memory_{when}"] >= demand.memory_bytes)
        if demand.gpus:
            mask &= c[f"whole_{when}"] >= demand.gpus
        elif demand.share_milli:
            mask &= c[f"share_{when}"] >= demand.share_milli
        return [self.names[i] for i in np.flatnonzero(mask).tolist()]
