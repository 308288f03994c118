"""What one replay run is asked (``RunSpec``) and what it measured (``RunResult``): plain values.

Every run module (``runner``, ``sizing``) and every reader (``report``, the CLI, the benchmarks)
imports these from here, so no run module imports another to get them. Importing it needs no
numpy: ``gpugate replay`` reads its options' defaults from ``RunSpec`` before it knows whether the
replay extra is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from webhook.kube import units
from webhook.placement import scoring

if TYPE_CHECKING:
    import numpy as np

TIMESLICE = "timeslice"
DRA = "dra"
SHARING = (TIMESLICE, DRA)
"""The sharing worlds (``--sharing``): how a pod that asks part of a GPU is served (docs/placement.md)."""
PUBLISHED = "published"
"""The world of the reference arms: the FGD artifact's model (a share is its size on any GPU)."""
MIG_TWIN = "mig-twin"
"""The world of the right-sizing arms: the trace on an H100 twin (``migcluster``)."""
DEFAULT_MIG_MIX = "all-balanced=0.15"
"""The right-sizing arms' default ``--mig-mix``: the share of the twin's GPU nodes partitioned, per layout."""
SHIPPED_DEVICE_POLICY = "packed"
"""What ``gpugate replay --device-allocation`` models by default: the device plugin's policy for
time-sliced shares as manifests/gpu-operator's time-slicing-4 sets it. ``RunSpec``'s own default is
the plugin's default (``distributed``), what a run built in code gets unless it says otherwise."""
RANDOM_TIES = "random"
LIST_TIES = "list"
TIES = (RANDOM_TIES, LIST_TIES)
"""How equal best totals are broken. ``random``: uniformly, what kube-scheduler intends (each node's
``Randomizer`` orders equal totals in ``nodeScoreHeap``) and what v1.36.3 and v1.37.2 do for nodes an
extender scored. ``list``: those releases without an extender, where no Randomizer is set (pkg/scheduler/
schedule_one.go ``prioritizeNodes``; kubernetes PR #141024 proposes setting it for every node) and
the host is whichever tied node ``heap.Init`` brings to the top of the scored list; here that list
is in scan order, while a real scheduler's is the parallel filter's completion order, roughly the
scan order with jitter (``kubescheduler.heap_top``; tests/e2e/scheduler_ties.py measures how ties
fell on the real one)."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    arm: str
    seed: int
    label_lag: int = 1
    tune: float = 1.3
    policies: str | None = None
    """Policy folder for the gpugate arm (a path, so a worker process loads it itself)."""
    taint_congested: bool = False
    device_policy: str = "distributed"
    """How the device plugin picks a GPU for a time-sliced share: distributed (its default) or packed."""
    extender_weight: int = scoring.RECOMMENDED_WEIGHT
    extender_percentage: int = 100
    """percentageOfNodesToScore of the extender's profile: 100 (proposed), 0 for the adaptive default."""
    extender_levels: str = "rank"
    extender_mix: str = "history"
    """Where the extender's pod-shape mix comes from: history (default) learns from the pods created,
    its window starting full of earlier pods, as a balancer restarted on a running cluster finds it
    (a seeded draw from the pod list, the cluster's history); window learns from the pods created
    in this replay only (a new, empty cluster); trace is a configured mix, the pod list's."""
    extender_assume: bool = True
    extender_window: int = 2000
    extender_tolerance: float = 0.05
    extender_cpu_pods: bool = True
    """The extender arm sends CPU-only pods to the extender's profile too (else to default-scheduler)."""
    mig_mix: str = DEFAULT_MIG_MIX
    """The right-sizing arms: which share of the GPU nodes is partitioned, with which MIG layout."""
    share_replicas: int = units.DEFAULT_SLOT_REPLICAS
    """The shares-only arm, and the timeslice world: time-sliced slots per GPU."""
    sharing: str = TIMESLICE
    """The sharing world of the kube arms (``SHARING``): timeslice (a share is a slot, as
    manifests/ ship) or dra (a share is a consumable-capacity claim of its memory); ``published``
    runs them in the reference arms' model (a share is its size on any GPU), which no stock
    component implements. The reference arms ignore it: they stay in their published model."""
    ties: str = RANDOM_TIES
    """How the kube-scheduler model breaks equal best totals (``TIES``): random, as
    kube-scheduler intends and does for nodes an extender scored, or list, as v1.36.3 and v1.37.2
    do without an extender (the heap's top of the scored list)."""


@dataclass(frozen=True)
class RunResult:
    """Per submitted pod: arrived GPU request, allocation and fragment (% of GPU capacity)."""

    arm: str
    seed: int
    workload: str
    arrived: np.ndarray
    allocated: np.ndarray
    fragment: np.ndarray
    placed: np.ndarray
    failed: int
    denied: int
    seconds: float
    served: np.ndarray | None = None
    """The right-sizing arms: the trace's GPU request of the pods placed so far (% of GPU capacity)."""
    rungs: tuple[tuple[str, int, int], ...] = ()
    """The right-sizing arms: per GPU resource the fractional pods asked, (resource, placed, failed)."""
    oversubscribed: int = 0
    """Placed fractional pods whose trace share is larger than the capacity their resource reserves."""
    shares_placed: int = 0
    """Placed fractional pods (the whole run): what ``oversubscribed`` is a part of."""
    world: str = ""
    """The sharing world the run was in (``SHARING``), or ``published`` for the reference arms'
    own model; the right-sizing arms say ``mig-twin``."""

    def at(self, values: np.ndarray, arrived_percent: int) -> float:
        """The published binning: mean over pods whose arrived % rounds to the point (else +-1)."""
        import numpy as np

        rounded = np.round(self.arrived)
        chosen = values[rounded == arrived_percent]
        if len(chosen) == 0:
            chosen = values[np.abs(rounded - arrived_percent) <= 1]
        return float(chosen.mean()) if len(chosen) else float("nan")

    def alloc_at(self, arrived_percent: int) -> float:
        return self.at(self.allocated, arrived_percent)

    def frag_at(self, arrived_percent: int) -> float:
        return self.at(self.fragment, arrived_percent)
