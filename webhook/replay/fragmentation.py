"""Placement metrics: GPU allocation ratio and the FGD fragmentation measure.

Fragmentation follows the published definition (Weng et al., ATC'23): "typical pods" are the most
common request shapes (cpu, per-GPU milli, GPU count, GPU models; memory ignored) of the original
pod list, taken by popularity until they cover 95% of pods, CPU-only pods included. For node n and
typical pod m, if m fits n on GPUs and CPU the fragment is the idle milli on GPUs whose free share is
below m's per-GPU request; in every other case all idle GPU milli of n is fragment. F_n is the
probability-weighted sum; the cluster fragment is the sum over nodes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from webhook.kube.demand import PodDemand
from webhook.replay.cluster import ClusterState

POPULARITY = 0.95


@dataclass(frozen=True)
class TypicalPods:
    """Arrays over the typical shapes; ``access[n, m]`` is whether node n's GPU model suits shape m."""

    cpu: np.ndarray
    milli: np.ndarray
    num: np.ndarray
    prob: np.ndarray
    access: np.ndarray

    @property
    def wants_gpu(self) -> np.ndarray:
        return self.milli > 0


def typical_pods(demands: list[PodDemand], state: ClusterState, *, popularity: float = POPULARITY) -> TypicalPods:
    """Shapes sorted by count (ties: larger cpu, milli, count, models first), cut where they cover ``popularity``."""
    counts = Counter((d.cpu_score or d.cpu, d.milli_per_gpu, d.num_gpu, tuple(sorted(d.products))) for d in demands)
    ordered = sorted(counts.items(), key=lambda item: (item[1], item[0]), reverse=True)
    total = sum(counts.values())
    chosen, covered = [], 0
    for shape, count in ordered:
        if covered >= popularity * total:
            break
        chosen.append((shape, count))
        covered += count
    access = np.ones((state.size, len(chosen)), dtype=bool)
    for column, ((_, milli, _, models), _) in enumerate(chosen):
        if models:
            access[:, column] = state.model_mask(frozenset(models))
        if milli:
            access[:, column] &= state.gpu_count > 0
    return TypicalPods(cpu=np.array([s[0] for s, _ in chosen], dtype=np.int64),
                       milli=np.array([s[1] for s, _ in chosen], dtype=np.int64),
                       num=np.array([s[2] for s, _ in chosen], dtype=np.int64),
                       prob=np.array([c for _, c in chosen], dtype=np.float64) / covered,
                       access=access)


def shape_stats(gpu_left: np.ndarray, typical: TypicalPods) -> tuple[np.ndarray, np.ndarray]:
    """Per node and shape: GPUs with enough left for the shape, and the milli left on the others."""
    enough = gpu_left[:, :, None] >= typical.milli[None, None, :]
    count = enough.sum(axis=1)
    small = np.where(enough, 0, gpu_left[:, :, None]).sum(axis=1)
    return count, small


def node_fragment(count: np.ndarray, small: np.ndarray, total: np.ndarray, cpu_left: np.ndarray,
                  access: np.ndarray, typical: TypicalPods) -> np.ndarray:
    """F_n from per-shape statistics (all arrays row-aligned; one row per node or per candidate)."""
    satisfied = ((count >= typical.num[None, :]) & (cpu_left[:, None] >= typical.cpu[None, :])
                 & access & typical.wants_gpu[None, :])
    fragment = np.where(satisfied, small, total[:, None])
    return fragment @ typical.prob


class FragmentTracker:
    """Keeps F_n for every node, refreshed only for the node that changed."""

    def __init__(self, state: ClusterState, typical: TypicalPods) -> None:
        self.typical = typical
        self.count, self.small = shape_stats(state.gpu_left, typical)
        self.total = state.gpu_left.sum(axis=1)
        self.fragment = node_fragment(self.count, self.small, self.total, state.cpu_left, typical.access, typical)

    def refresh(self, state: ClusterState, node: int) -> None:
        row = state.gpu_left[node:node + 1]
        count, small = shape_stats(row, self.typical)
        self.count[node], self.small[node] = count[0], small[0]
        self.total[node] = row.sum()
        self.fragment[node] = node_fragment(count, small, self.total[node:node + 1],
                                            state.cpu_left[node:node + 1], self.typical.access[node:node + 1],
                                            self.typical)[0]

    def cluster_fragment(self) -> float:
        return float(self.fragment.sum())


def allocation_percent(state: ClusterState) -> float:
    """Allocated GPU milli over GPU capacity, in percent: the published KPI."""
    return 100.0 * state.used_milli / state.capacity_milli
