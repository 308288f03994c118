"""A pure model of kube-scheduler's default profile (and gpugate's binpack profile) over numpy arrays.

It reads what a Pod really says (resources, nodeSelector, required and preferred node affinity with
In, NotIn, Exists, DoesNotExist, Gt, Lt, tolerations, schedulerName) and evaluates it against node
labels and taints; nothing is special-cased for gpugate's own terms. A profile is data: a tuple of
filters and of (score plugin, weight) pairs, as in KubeSchedulerConfiguration. Each score plugin
returns scores already normalized the way its kube-scheduler plugin normalizes them (0..100).

Modelled as kube-scheduler v1.36 does it: NodeResourcesFit LeastAllocated/MostAllocated on non-zero
requests with integer arithmetic, BalancedAllocation on actual requests (the change the pod makes to
1 - std of the fractions),
NodeAffinity preferred weights normalized to the best feasible node, TaintToleration counting
untolerated PreferNoSchedule taints (reverse-normalized), the adaptive percentageOfNodesToScore with
a round-robin start index, and a pick among equal totals (``TIES``). Plugins that cannot change the
result for these pods (PodTopologySpread and InterPodAffinity without constraints or Services,
ImageLocality without images, volumes) are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from webhook.kube import units

# A pod's node selection and tolerations are read by kube.affinity and kube.tolerations (one home
# for every part that reads them); the model evaluates those values.
from webhook.kube.affinity import PreferredTerm as PreferredTerm
from webhook.kube.affinity import Requirement as Requirement
from webhook.kube.affinity import SelectorTerm as SelectorTerm
from webhook.kube.demand import PodDemand
from webhook.kube.tolerations import Toleration as Toleration
from webhook.placement import devices as device_plugin
from webhook.placement.scoring import MAX_EXTENDER_PRIORITY
from webhook.replay.arms import BINPACK_PROFILE
from webhook.replay.cluster import ClusterState
from webhook.replay.nodelabels import NodeLabels
from webhook.replay.records import MILLI
from webhook.replay.runspec import LIST_TIES, RANDOM_TIES, TIES

MAX_NODE_SCORE = 100
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


# --- what the scheduler reads from a Pod ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class PodView:
    """The scheduling-relevant reading of one Pod; ``unsupported`` names what the model cannot place."""

    demand: PodDemand
    resources: frozenset[str] = frozenset()
    node_selector: tuple[tuple[str, str], ...] = ()
    required: tuple[SelectorTerm, ...] | None = None
    preferred: tuple[PreferredTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    scheduler_name: str = "default-scheduler"
    unsupported: str | None = None
    claim_models: tuple[str, ...] = ()
    """For a pod whose claim is one ``firstAvailable`` request with a sub-request per GPU model (the
    dra world's shares, ``worlds.share_ask``): the models in sub-request order, which
    :func:`dynamic_resources_score` ranks nodes by; empty for every other pod."""


# --- the cluster the model schedules onto ------------------------------------------------------

@dataclass
class KubeCluster:
    """Resource state, labels and taints; the only state a profile reads."""

    state: ClusterState
    labels: NodeLabels
    taints: list[tuple[Taint, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.taints:
            self.taints = [()] * self.state.size


Filter = Callable[[KubeCluster, PodView], np.ndarray]
Score = Callable[[KubeCluster, PodView, np.ndarray], np.ndarray]
Extender = Callable[[KubeCluster, PodView, np.ndarray], "list[int] | None"]
"""An extender's prioritize call: 0..10 per candidate node, or None when it fails (ignorable)."""


def _untolerated(cluster: KubeCluster, pod: PodView, effects: tuple[str, ...]) -> np.ndarray:
    counts = np.zeros(cluster.state.size, dtype=np.int64)
    if not any(cluster.taints):  # no node tainted (the usual case): nothing to count, at C speed
        return counts
    by_set: dict[tuple[Taint, ...], int] = {}
    for node, taints in enumerate(cluster.taints):
        if not taints:
            continue
        if taints not in by_set:
            by_set[taints] = sum(1 for t in taints if t.effect in effects
                                 and not any(tol.tolerates(t) for tol in pod.tolerations))
        counts[node] = by_set[taints]
    return counts


# --- filters ---------------------------------------------------------------------------------

def fit_filter(cluster: KubeCluster, pod: PodView) -> np.ndarray:
    """NodeResourcesFit: cpu, memory and GPUs at per-GPU thousandths; unknown extended resources never fit."""
    if pod.unsupported:
        return np.zeros(cluster.state.size, dtype=bool)
    return cluster.state.fits(pod.demand)


def node_affinity_filter(cluster: KubeCluster, pod: PodView) -> np.ndarray:
    """NodeAffinity: nodeSelector (all pairs) and the required terms (any term)."""
    mask = np.ones(cluster.state.size, dtype=bool)
    for key, value in pod.node_selector:
        mask &= cluster.labels.requirement(Requirement(key, "In", (value,)))
    if pod.required is not None:
        anyterm = np.zeros(cluster.state.size, dtype=bool)
        for term in pod.required:
            anyterm |= cluster.labels.term(term)
        mask &= anyterm
    return mask


def taint_filter(cluster: KubeCluster, pod: PodView) -> np.ndarray:
    """TaintToleration: a NoSchedule or NoExecute taint the pod does not tolerate rules the node out."""
    return _untolerated(cluster, pod, ("NoSchedule", "NoExecute")) == 0


# --- scores ----------------------------------------------------------------------------------

def default_normalize(raw: np.ndarray, *, reverse: bool) -> np.ndarray:
    """kube-scheduler's DefaultNormalizeScore: scale to the maximum, optionally reversed."""
    top = int(raw.max()) if len(raw) else 0
    if top == 0:
        return np.full(len(raw), MAX_NODE_SCORE if reverse else 0, dtype=np.int64)
    scaled = MAX_NODE_SCORE * raw // top
    return MAX_NODE_SCORE - scaled if reverse else scaled


def taint_toleration_score(cluster: KubeCluster, pod: PodView, nodes: np.ndarray) -> np.ndarray:
    return default_normalize(_untolerated(cluster, pod, ("PreferNoSchedule",))[nodes], reverse=True)


FIRST_AVAILABLE_MAX = 8
"""resource.k8s.io/v1 FirstAvailableDeviceRequestMaxSize."""


def dynamic_resources_score(cluster: KubeCluster, pod: PodView, nodes: np.ndarray) -> np.ndarray:
    """kube-scheduler's DynamicResources Score (v1.36, DRAPrioritizedList GA, weight 2 in the default
    plugins: pkg/scheduler/apis/config/v1/default_plugins.go ``applyDynamicResources``): per claim,
    ``FirstAvailableDeviceRequestMaxSize - i`` for the ``firstAvailable`` sub-request ``i`` the node
    would allocate (pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go
    ``computeScore``), normalized to the best node. With one sub-request per GPU model, a node of
    the first model listed scores 100, of the second 87, and so on; a pod without such a claim
    scores 0 everywhere."""
    if not pod.claim_models:
        return np.zeros(len(nodes), dtype=np.int64)
    order = {model: i for i, model in enumerate(pod.claim_models)}
    models = cluster.state.models
    raw = np.array([FIRST_AVAILABLE_MAX - order[models[i]] if models[i] in order else 0
                    for i in cluster.state.model_index[nodes].tolist()], dtype=np.int64)
    return default_normalize(raw, reverse=False)


def node_affinity_score(cluster: KubeCluster, pod: PodView, nodes: np.ndarray) -> np.ndarray:
    raw = np.zeros(len(nodes), dtype=np.int64)
    for preferred in pod.preferred:
        raw += np.where(cluster.labels.term(preferred.term)[nodes], preferred.weight, 0)
    return default_normalize(raw, reverse=False)


def _requested_and_allocatable(cluster: KubeCluster, pod: PodView, nodes: np.ndarray, resource: str,
                               *, non_zero: bool) -> tuple[np.ndarray, np.ndarray] | None:
    state, demand = cluster.state, pod.demand
    if resource == "cpu":
        used = state.cpu_score_used if non_zero else state.cpu_used
        return used[nodes] + (demand.cpu_score if non_zero else demand.cpu), state.cpu_cap[nodes]
    if resource == "memory":
        used = state.mem_score_used if non_zero else state.mem_used
        return used[nodes] + (demand.memory_score_mib if non_zero else demand.memory_mib), state.mem_cap[nodes]
    if units.pooled(resource):
        # The GPU resources scoring may weigh (the per-device pool); MIG slices are integer extended
        # resources, checked by the fit filter (ClusterState.fits) and weighed by no profile here.
        # "if it's an extended resource, and the pod doesn't request it": skipped (resource_allocation.go).
        if resource not in pod.resources:
            return None
        # Both GPU resources draw on the node's one pool of devices, accounted in thousandths.
        used = state.capacity_per_node_milli()[nodes] - state.gpu_left[nodes].sum(axis=1)
        return used + demand.gpu_request_milli, state.gpu_count[nodes] * MILLI
    return None


def resources_fit_score(strategy: str, weights: tuple[tuple[str, int], ...]) -> Score:
    """NodeResourcesFit scoring (LeastAllocated or MostAllocated) over the given resources and weights."""

    def score(cluster: KubeCluster, pod: PodView, nodes: np.ndarray) -> np.ndarray:
        total = np.zeros(len(nodes), dtype=np.int64)
        weight_sum = np.zeros(len(nodes), dtype=np.int64)
        for resource, weight in weights:
            found = _requested_and_allocatable(cluster, pod, nodes, resource, non_zero=True)
            if found is None:
                continue
            requested, allocatable = found
            usable = allocatable > 0
            safe = np.where(usable, allocatable, 1)
            if strategy == "LeastAllocated":
                part = np.where(requested > allocatable, 0, (allocatable - requested) * MAX_NODE_SCORE // safe)
            else:
                part = np.minimum(requested, allocatable) * MAX_NODE_SCORE // safe
            total += np.where(usable, part * weight, 0)
            weight_sum += np.where(usable, weight, 0)
        return np.where(weight_sum > 0, total // np.maximum(weight_sum, 1), 0)

    score.__name__ = f"NodeResourcesFit[{strategy}]"
    return score


def balanced_allocation_score(cluster: KubeCluster, pod: PodView, nodes: np.ndarray) -> np.ndarray:
    """NodeResourcesBalancedAllocation as kube-scheduler v1.36 scores it: the change in balance.

    Before v1.36 the score was the balance with the pod alone, ``(1 - std) * 100`` over the cpu and
    memory fractions; since v1.36 (pkg/scheduler/framework/plugins/noderesources/
    balanced_allocation.go, ``balancedResourceScorer``) it is ``50 + (50 + with - without) / 2``
    with both balances in whole points, so a node is rewarded for what the pod improves, not for
    being balanced already. The old formula made 75-84% of the real v1.36.3 decisions on
    tests/e2e's trace slice, this one all but one in 864. Fractions are of actual requests (not
    the non-zero defaults) capped at 1; best-effort pods are skipped (PreScore returns Skip).
    """
    demand, state = pod.demand, cluster.state
    if demand.cpu == 0 and demand.memory_mib == 0:
        return np.zeros(len(nodes), dtype=np.int64)
    cpu_cap = np.maximum(state.cpu_cap[nodes], 1)
    mem_cap = np.maximum(state.mem_cap[nodes], 1)

    def balance(cpu: np.ndarray, memory: np.ndarray) -> np.ndarray:
        std = np.abs(np.minimum(cpu / cpu_cap, 1.0) - np.minimum(memory / mem_cap, 1.0)) / 2
        return ((1.0 - std) * MAX_NODE_SCORE).astype(np.int64)

    with_pod = balance(state.cpu_used[nodes] + demand.cpu, state.mem_used[nodes] + demand.memory_mib)
    without = balance(state.cpu_used[nodes], state.mem_used[nodes])
    half = MAX_NODE_SCORE // 2
    return half + (half + with_pod - without) // 2


# --- profiles ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Profile:
    """A scheduler profile as data; ``percentage_of_nodes_to_score`` 0 means kube-scheduler's adaptive rule."""

    name: str
    filters: tuple[Filter, ...]
    scores: tuple[tuple[Score, int], ...]
    percentage_of_nodes_to_score: int = 0
    extenders: tuple[tuple[Extender, int], ...] = ()
    """Prioritize extenders and their weights: score x weight x MaxNodeScore/MaxExtenderPriority."""


DEFAULT_FILTERS: tuple[Filter, ...] = (fit_filter, node_affinity_filter, taint_filter)
LEAST_ALLOCATED = resources_fit_score("LeastAllocated", (("cpu", 1), ("memory", 1)))
# manifests/scheduler/scheduler-config.yaml: MostAllocated, nvidia.com/gpu 5, cpu 1, memory 1, score all nodes.
BINPACK_WEIGHTS: tuple[tuple[str, int], ...] = (("nvidia.com/gpu", 5), ("cpu", 1), ("memory", 1))

DEFAULT_PROFILE = Profile(
    name="default-scheduler",
    filters=DEFAULT_FILTERS,
    scores=((taint_toleration_score, 3), (node_affinity_score, 2), (LEAST_ALLOCATED, 1),
            (balanced_allocation_score, 1), (dynamic_resources_score, 2)),
)


def binpack_profile(weights: tuple[tuple[str, int], ...] = BINPACK_WEIGHTS, percentage: int = 100) -> Profile:
    """gpugate's second profile: the default plugins with NodeResourcesFit switched to MostAllocated."""
    return Profile(
        name=BINPACK_PROFILE,
        filters=DEFAULT_FILTERS,
        scores=((taint_toleration_score, 3), (node_affinity_score, 2),
                (resources_fit_score("MostAllocated", weights), 1), (balanced_allocation_score, 1),
                (dynamic_resources_score, 2)),
        percentage_of_nodes_to_score=percentage,
    )


def heap_top(totals: list[int]) -> int:
    """The index Go's ``container/heap`` puts on top after ``heap.Init`` of ``totals`` with
    ``nodeScoreHeap.Less`` (a higher total first) and every Randomizer 0: the host kube-scheduler
    v1.36.3 pops when no extender scored. Not always the first best total in order: a best total
    deep in the heap can be sifted above an earlier one."""
    heap = list(range(len(totals)))
    size = len(heap)
    for start in range(size // 2 - 1, -1, -1):
        parent = start
        while (child := 2 * parent + 1) < size:
            if child + 1 < size and totals[heap[child + 1]] > totals[heap[child]]:
                child += 1
            if not totals[heap[child]] > totals[heap[parent]]:
                break
            heap[parent], heap[child] = heap[child], heap[parent]
            parent = child
    return heap[0]


def nodes_to_find(total: int, percentage: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind: stop after this many feasible nodes."""
    if total < 100 or percentage >= 100:
        return total
    if percentage <= 0:
        percentage = max(5, 50 - total // 125)
    return max(100, total * percentage // 100)


class KubeScheduler:
    """Schedules one pod at a time with the profile its schedulerName names.

    Holds what kube-scheduler carries between cycles: the round-robin start index of the node scan.
    Randomness comes only from the ``rng`` argument; ``ties`` is one of ``TIES``.
    """

    def __init__(self, profiles: tuple[Profile, ...], rng: np.random.Generator, ties: str = RANDOM_TIES) -> None:
        if ties not in TIES:
            raise ValueError(f"ties {ties!r}: not one of {', '.join(TIES)}")
        self.profiles = {profile.name: profile for profile in profiles}
        self.rng = rng
        self.ties = ties
        self.next_start = 0

    def schedule(self, cluster: KubeCluster, pod: PodView) -> int | None:
        """The chosen node index, or None when no node passes the filters (or no profile has the name)."""
        profile = self.profiles.get(pod.scheduler_name)
        if profile is None:
            return None
        size = cluster.state.size
        feasible = np.ones(size, dtype=bool)
        for check in profile.filters:
            feasible &= check(cluster, pod)
        # The feasible nodes in scan order: from the round-robin start index, wrapping around.
        start = self.next_start
        indices = np.flatnonzero(feasible)
        cut = int(np.searchsorted(indices, start))
        nodes = np.concatenate((indices[cut:], indices[:cut])) if cut else indices
        wanted = nodes_to_find(size, profile.percentage_of_nodes_to_score)
        if len(nodes) > wanted:
            nodes = nodes[:wanted]
            processed = (int(nodes[-1]) - start) % size + 1
        else:
            processed = size
        self.next_start = (start + processed) % size
        if len(nodes) == 0:
            return None
        if len(nodes) == 1:
            return int(nodes[0])
        total = np.zeros(len(nodes), dtype=np.int64)
        for plugin, weight in profile.scores:
            total += weight * plugin(cluster, pod, nodes)
        # schedule_one.go prioritizeNodes: extender scores are added unclipped, scaled by weight x 100/10.
        randomized = False
        for extender, weight in profile.extenders:
            priorities = extender(cluster, pod, nodes)
            if priorities is not None:  # an error: ignorable extenders are skipped
                total += np.asarray(priorities, dtype=np.int64) * weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
                randomized = True  # v1.36.3 sets a Randomizer for the nodes an extender scored
        best = np.flatnonzero(total == total.max())
        if len(best) > 1 and self.ties == LIST_TIES and not randomized:
            return int(nodes[heap_top(total.tolist())])
        return int(nodes[best[self.rng.integers(len(best))]])

    @staticmethod
    def devices(cluster: KubeCluster, node: int, demand: PodDemand, policy: str = "distributed") -> tuple[int, ...]:
        """GPUs the device plugin hands the pod on the chosen node: ``webhook.placement.devices``.

        Whole GPUs: the first free ones. A DRA share (``first``): the first device with room. A
        time-sliced share: NVIDIA's device plugin defaults to
        its ``distributed`` allocation policy (the GPU with the fewest replicas taken, here the most
        left that fits); ``packed`` (k8s-device-plugin PR #1621) takes the fullest GPU that fits.
        The extender models the same rule, from the same module.
        """
        if not demand.num_gpu:
            return ()
        left = cluster.state.gpu_left[node].tolist()
        if demand.shares_gpu:
            # "first": the dra world, where kube-scheduler's allocator takes the first device (in the
            # slice's order) with the memory left (found by tests/e2e/test_replay_fidelity.py's dra world:
            # "first" used to fall through to distributed here).
            rule = cast(device_plugin.DevicePolicy, policy if policy in ("packed", "first") else "distributed")
            return (device_plugin.share_device(left, demand.milli_per_gpu, rule),)
        return device_plugin.whole_devices(left, demand.num_gpu)
