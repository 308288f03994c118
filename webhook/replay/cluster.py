"""The replayed cluster's state as numpy arrays, one row per node: what every scheduler reads.

GPUs are accounted per device in thousandths (``gpu_left[n, g]``; absent devices are padded with 0
left, which no request fits and no sum notices), as the published simulator does. Other extended
resources (MIG slices ``nvidia.com/mig-<profile>``; time-sliced slots when a run counts them as
integers) are accounted as kube-scheduler's NodeResourcesFit does: an integer allocatable per node
and resource, requests summed, a pod fits where ``allocatable - requested >= its request`` for
every resource it asks (a node without the resource has 0). The state is an explicit argument
everywhere: mutable, but never global.

What one pod asks is the vocabulary's ``webhook.kube.demand.PodDemand``, read here in the model's
units: ``memory_mib``, ``num_gpu`` GPUs of ``milli_per_gpu`` thousandths each, ``products``,
``extended``; scoring reads ``cpu_score`` / ``memory_score_mib`` (kube-scheduler's non-zero requests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from webhook.kube.demand import PodDemand
from webhook.replay.records import MILLI, NodeRecord


class ClusterState:
    """Capacities and what is bound so far; ``bind`` is the only mutation.

    ``extended`` maps an extended resource to its allocatable on each node (in node order).
    """

    def __init__(self, nodes: tuple[NodeRecord, ...], extended: Mapping[str, Sequence[int]] | None = None,
                 sliced: Sequence[bool] | None = None) -> None:
        self.nodes = nodes
        self.names = [node.name for node in nodes]
        self.size = len(nodes)
        self.max_gpus = max(1, max(node.gpus for node in nodes))
        self.cpu_cap = np.array([node.cpu_milli for node in nodes], dtype=np.int64)
        self.mem_cap = np.array([node.memory_mib for node in nodes], dtype=np.int64)
        self.gpu_count = np.array([node.gpus for node in nodes], dtype=np.int64)
        self.models = sorted({node.model for node in nodes})
        self.model_index = np.array([self.models.index(node.model) for node in nodes], dtype=np.int64)
        self.cpu_used = np.zeros(self.size, dtype=np.int64)
        self.mem_used = np.zeros(self.size, dtype=np.int64)
        self.cpu_score_used = np.zeros(self.size, dtype=np.int64)
        self.mem_score_used = np.zeros(self.size, dtype=np.int64)
        present = np.arange(self.max_gpus)[None, :] < self.gpu_count[:, None]
        self.gpu_left = np.where(present, MILLI, 0).astype(np.int64)
        self.used_milli = 0
        self.capacity_milli = int(self.gpu_count.sum()) * MILLI
        self.extended_names = tuple(sorted(extended or {}))
        self.extended_cap = np.zeros((self.size, len(self.extended_names)), dtype=np.int64)
        for column, resource in enumerate(self.extended_names):
            self.extended_cap[:, column] = np.asarray((extended or {})[resource], dtype=np.int64)
        self.extended_used = np.zeros_like(self.extended_cap)
        self.sliced = None if sliced is None else np.asarray(sliced, dtype=bool)
        """The timeslice world's time-sliced nodes (``renameByDefault``): they offer only slots
        (``nvidia.com/gpu.shared``), the others only whole GPUs. None: any GPU takes either."""

    @property
    def cpu_left(self) -> np.ndarray:
        return self.cpu_cap - self.cpu_used

    @property
    def mem_left(self) -> np.ndarray:
        return self.mem_cap - self.mem_used

    def model_mask(self, models: frozenset[str]) -> np.ndarray:
        """Nodes whose GPU model the demand accepts (all nodes when it names none)."""
        if not models:
            return np.ones(self.size, dtype=bool)
        wanted = [index for index, model in enumerate(self.models) if model in models]
        return np.isin(self.model_index, wanted)

    def fits(self, demand: PodDemand) -> np.ndarray:
        """Resource fit: cpu, memory, and GPUs at per-GPU thousandths (the published simulator's filter)."""
        mask = (self.cpu_left >= demand.cpu) & (self.mem_left >= demand.memory_mib)
        if demand.num_gpu:
            mask &= self.gpu_count > 0
            if demand.products:
                mask &= self.model_mask(demand.products)
            if demand.milli_per_gpu < MILLI:
                mask &= (self.gpu_left >= demand.milli_per_gpu).any(axis=1)
            else:
                mask &= (self.gpu_left >= MILLI).sum(axis=1) >= demand.num_gpu
            if self.sliced is not None:
                mask &= self.sliced if demand.shares_gpu else ~self.sliced
        for resource, count in demand.extended:
            if resource not in self.extended_names:
                return np.zeros(self.size, dtype=bool)  # no node has it: allocatable 0 everywhere
            column = self.extended_names.index(resource)
            mask &= self.extended_cap[:, column] - self.extended_used[:, column] >= count
        return mask

    def extended_left(self, resource: str) -> np.ndarray:
        """Allocatable minus requested of one extended resource, per node (0 where absent)."""
        if resource not in self.extended_names:
            return np.zeros(self.size, dtype=np.int64)
        column = self.extended_names.index(resource)
        return self.extended_cap[:, column] - self.extended_used[:, column]

    def capacity_per_node_milli(self) -> np.ndarray:
        return self.gpu_count * MILLI

    def whole_free(self) -> np.ndarray:
        """Whole free GPUs per node (what the device plugin would report as allocatable minus requested)."""
        return (self.gpu_left >= MILLI).sum(axis=1)

    def first_free(self, node: int, count: int) -> tuple[int, ...]:
        """The lowest-index fully free GPUs: how exclusive GPUs are picked in every arm."""
        free = np.flatnonzero(self.gpu_left[node] >= MILLI)
        return tuple(int(g) for g in free[:count])

    def room(self, node: int) -> NodeRoom:
        """What the node has left, as plain numbers (``NodeRoom.fits`` asks it many times cheaply)."""
        left = self.gpu_left[node]
        extended = tuple(zip(self.extended_names, (self.extended_cap[node] - self.extended_used[node]).tolist(),
                             strict=True))
        return NodeRoom(cpu=int(self.cpu_cap[node] - self.cpu_used[node]),
                        memory=int(self.mem_cap[node] - self.mem_used[node]), gpus=int(self.gpu_count[node]),
                        model=self.models[self.model_index[node]], whole=int((left >= MILLI).sum()),
                        most=int(left.max()) if len(left) else 0,
                        sliced=None if self.sliced is None else bool(self.sliced[node]), extended=extended)

    def release(self, node: int, demand: PodDemand, gpus: tuple[int, ...]) -> None:
        """Undo ``bind``: the pod left the node (the timeline's departures and moves)."""
        self.cpu_used[node] -= demand.cpu
        self.mem_used[node] -= demand.memory_mib
        self.cpu_score_used[node] -= demand.cpu_score
        self.mem_score_used[node] -= demand.memory_score_mib
        for gpu in gpus:
            self.gpu_left[node, gpu] += demand.milli_per_gpu
        self.used_milli -= demand.milli_per_gpu * len(gpus)
        for resource, count in demand.extended:
            self.extended_used[node, self.extended_names.index(resource)] -= count

    def bind(self, node: int, demand: PodDemand, gpus: tuple[int, ...]) -> None:
        self.cpu_used[node] += demand.cpu
        self.mem_used[node] += demand.memory_mib
        self.cpu_score_used[node] += demand.cpu_score
        self.mem_score_used[node] += demand.memory_score_mib
        for gpu in gpus:
            if self.gpu_left[node, gpu] < demand.milli_per_gpu:  # pragma: no cover - a scheduler bug
                raise AssertionError(f"GPU {gpu} of node {self.names[node]} cannot take {demand.milli_per_gpu}")
            self.gpu_left[node, gpu] -= demand.milli_per_gpu
        self.used_milli += demand.milli_per_gpu * len(gpus)
        for resource, count in demand.extended:
            column = self.extended_names.index(resource)
            if self.extended_cap[node, column] - self.extended_used[node, column] < count:  # pragma: no cover
                raise AssertionError(f"node {self.names[node]} cannot take {count} {resource}")
            self.extended_used[node, column] += count


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """One node's room left (``ClusterState.room``), for the timeline's question of whether a waiting
    pod could now fit where a pod just left: the answer ``ClusterState.fits`` gives for that node."""

    cpu: int
    memory: int
    gpus: int
    model: str
    whole: int
    """GPUs with all their thousandths left."""
    most: int
    """The most thousandths left on one GPU."""
    sliced: bool | None
    extended: tuple[tuple[str, int], ...]

    def fits(self, demand: PodDemand) -> bool:
        if self.cpu < demand.cpu or self.memory < demand.memory_mib:
            return False
        if demand.num_gpu:
            if not self.gpus or (demand.products and self.model not in demand.products):
                return False
            if self.sliced is not None and self.sliced != demand.shares_gpu:
                return False
            if (self.most if demand.milli_per_gpu < MILLI else self.whole * MILLI) < \
                    (demand.milli_per_gpu if demand.milli_per_gpu < MILLI else demand.num_gpu * MILLI):
                return False
        if demand.extended:
            left = dict(self.extended)
            return all(left.get(resource, 0) >= count for resource, count in demand.extended)
        return True


def best_fit_gpu(state: ClusterState, node: int, milli: int) -> int:
    """The fitting GPU with the least left (lowest index on ties): the simulator's "best" GPU choice."""
    left = state.gpu_left[node]
    candidates = np.where(left >= milli, left, MILLI + 1)
    return int(np.argmin(candidates))
