"""One replay run (an arm and a seed), and many of them in separate processes.

Arms:
  stock            the trace's Pods as written, kube-scheduler's default profile
  gpugate          the same Pods admitted through gpugate's mutation and validation under
                   ``--policies``; each Pod goes to the profile its schedulerName names
  binpack-profile  the trace's Pods on gpugate's second profile (MostAllocated, GPU weight 5)
  extender         the trace's Pods on the ``gpugate`` profile: the default plugins, weights and
                   normalization plus gpugate's scheduler extender (``webhook.placement``), its
                   score x weight x 10, computed from the blind view (node allocatable, bound pod
                   requests, the modelled device allocation) delivered every ``label_lag`` placements
  gpugate-extender the gpugate arm, where a policy's schedulerName ``gpugate`` reaches that profile
  random, bestfit, fgd   the published schedulers, on the trace records directly
  whole-gpu, shares-only, rightsized   the trace on an H100 twin whose partitioned nodes are whole,
                   time-sliced or MIG; fractional pods ask a whole GPU, a slot, or memory that
                   right-sizing turns into a rung (``webhook.replay.sizing``)
Every arm of one seed sees the same arrival order. Pods are submitted once and never deleted; a
pod that fits nowhere (or is denied) is counted as arrived and failed.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from webhook import names
from webhook.errors import InputError
from webhook.kube import demand as kube_demand
from webhook.kube.demand import PodDemand
from webhook.kube.inventory import EMPTY as EMPTY_INVENTORY
from webhook.kube.inventory import Inventory
from webhook.placement import scoring
from webhook.placement.extender import ExtenderSettings, ExtenderState
from webhook.placement.shapes import ShapeMix
from webhook.policy import loading
from webhook.replay import demand as demand_reading
from webhook.replay import migcluster, workload
from webhook.replay.arrival import arrival_order
from webhook.replay.cluster import ClusterState
from webhook.replay.labels import Relabeler
from webhook.replay.metrics import FragmentTracker, typical_pods
from webhook.replay.model import (
    DEFAULT_PROFILE,
    KubeCluster,
    KubeScheduler,
    NodeLabels,
    PodView,
    Profile,
    binpack_profile,
)
from webhook.replay.records import PodRecord, Trace
from webhook.replay.reference import REFERENCE_SCHEDULERS

KUBE_ARMS = ("stock", "gpugate", "binpack-profile", "extender", "gpugate-extender")
SIZING_ARMS = migcluster.ARMS
"""On the trace's MIG-capable twin (webhook.replay.migcluster), through ``--policies``: webhook.replay.sizing."""
ARMS = KUBE_ARMS + tuple(REFERENCE_SCHEDULERS) + SIZING_ARMS
POLICY_ARMS = ("gpugate", "gpugate-extender") + SIZING_ARMS
"""Arms that admit pods through the policy folder."""
BINPACK = "gpugate-binpack"
EXTENDER_PROFILE = names.EXTENDER_SCHEDULER_NAME
"""schedulerName of the second scheduler's profile with the default plugins and the extender (manifests/scheduler)."""
EXTENDER_ARMS = ("extender", "gpugate-extender")


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
    mig_mix: str = migcluster.DEFAULT_MIX
    """The right-sizing arms: which share of the GPU nodes is partitioned, with which MIG layout."""
    share_replicas: int = migcluster.DEFAULT_REPLICAS
    """The shares-only arm: time-sliced slots per GPU on the partitioned nodes."""


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

    def at(self, values: np.ndarray, arrived_percent: int) -> float:
        """The published binning: mean over pods whose arrived % rounds to the point (else +-1)."""
        rounded = np.round(self.arrived)
        chosen = values[rounded == arrived_percent]
        if len(chosen) == 0:
            chosen = values[np.abs(rounded - arrived_percent) <= 1]
        return float(chosen.mean()) if len(chosen) else float("nan")

    def alloc_at(self, arrived_percent: int) -> float:
        return self.at(self.allocated, arrived_percent)

    def frag_at(self, arrived_percent: int) -> float:
        return self.at(self.fragment, arrived_percent)


def demand_from_trace(records: Iterable[PodRecord]) -> list[PodDemand]:
    """The pod list as the extender would read its pods (a configured mix: what FGD's typical pods use);
    products as the nodes' ``nvidia.com/gpu.product`` labels spell them."""
    return [replace(record_demand(r), products=frozenset(workload.product_of(m) for m in r.gpu_spec))
            for r in records]


def record_demand(record: PodRecord) -> PodDemand:
    """A trace row as the published schedulers read it (non-zero cpu/memory defaults for scoring);
    products as the trace names GPU models."""
    return PodDemand.of_gpus(record.num_gpu, record.gpu_milli, cpu=record.cpu_milli,
                             memory_bytes=record.memory_mib * kube_demand.MIB, products=frozenset(record.gpu_spec),
                             cpu_score=record.cpu_milli or kube_demand.DEFAULT_CPU_MILLI,
                             memory_score_bytes=record.memory_mib * kube_demand.MIB or kube_demand.DEFAULT_MEMORY_BYTES)


class Admission:
    """The webhook's decision for each Pod: validate, then apply the mutation's JSON patch.

    Pure functions of (pod, namespace, policies): pods equal but for their name are admitted once
    and the answer reused, which is what makes the real mutation code affordable per trace pod.
    """

    def __init__(self, policies_dir: str | None) -> None:
        from webhook.admission import chain
        from webhook.policy import PolicySet

        self.chain = chain
        self.policies = loading.load_dir(Path(policies_dir)) if policies_dir else PolicySet.empty()
        self.cache: dict[str, dict[str, Any] | None] = {}
        self.applied: dict[str, int] = {}

    def admit(self, pod: dict[str, Any], inventory: Inventory = EMPTY_INVENTORY,
              inventory_key: str = "") -> dict[str, Any] | None:
        """The stored Pod, or None when the validating webhook denies it.

        ``inventory`` is the balancer's GPUInventory the webhook reads; ``inventory_key`` names
        what in it can change the answer (equal keys, equal answers), so the cache stays exact.
        """
        template = copy.deepcopy(pod)
        name = template["metadata"].pop("name")
        key = json.dumps(template, sort_keys=True) + inventory_key
        if key not in self.cache:
            namespace = pod["metadata"]["namespace"]
            # The API server's order: mutate, then validate the mutated pod.
            outcome = self.chain.admit(copy.deepcopy(pod), namespace=namespace, policies=self.policies,
                                       inventory=inventory)
            if outcome.stored is None:
                self.cache[key] = None
            else:
                stored = copy.deepcopy(outcome.stored)
                stored["metadata"].pop("name", None)
                self.cache[key] = stored
                policy = str(outcome.mutation.policy) if outcome.mutation.policy else "(none)"
                self.applied[policy] = self.applied.get(policy, 0) + 1
        admitted = self.cache[key]
        if admitted is None:
            return None
        out = copy.copy(admitted)
        out["metadata"] = {**admitted["metadata"], "name": name}
        return out


def placement_demand(pod: dict[str, Any], view: PodView) -> PodDemand:
    """The extender's reading of an admitted Pod; a share's size from the replay's annotation (via the view)."""
    found = kube_demand.of_pod(pod)
    return replace(found, share_milli=view.demand.share_milli) if view.demand.shares_gpu else found


class BlindExtender:
    """gpugate's extender as the scheduler's profile calls it, fed as the balancer's watch would be.

    The state is ``webhook.placement.extender.ExtenderState``, the code the balancer serves. It
    learns nodes from the trace (allocatable and GPU product label), pod shapes as pods arrive
    (created, before scheduling) and bound pods in batches every ``lag`` placements: the watch's
    delay. The real mutation of the kube cluster stays in ClusterState; this sees only the API.
    """

    def __init__(self, trace: Trace, spec: RunSpec, mix: ShapeMix | None) -> None:
        settings = ExtenderSettings(device_policy="packed" if spec.device_policy == "packed" else "distributed",
                                    levels=spec.extender_levels, mix=mix, assume=spec.extender_assume,
                                    assume_ttl=float(4 * max(1, spec.label_lag)), warm_keys=False,
                                    window=spec.extender_window, tolerance=spec.extender_tolerance)
        self.state = ExtenderState(settings)
        for node in trace.nodes:
            self.state.set_node(node.name, cpu=node.cpu_milli, memory=node.memory_mib * kube_demand.MIB,
                                product=workload.product_of(node.model) if node.gpus else "", gpus=node.gpus)
        if spec.extender_mix == "history":
            # The window as a balancer restarted on a running cluster finds it: full of pods created
            # before, here a seeded draw from the pod list (the trace is that cluster's history).
            history = np.random.default_rng((spec.seed, 3)).integers(len(trace.pods), size=spec.extender_window)
            demands = demand_from_trace(trace.pods)
            for index in history.tolist():
                self.state.seen(demands[index])
        self.names = [node.name for node in trace.nodes]
        self.lag = max(1, spec.label_lag)
        self.pending: list[tuple[str, str, PodDemand]] = []
        self.step = 0
        self.demand = PodDemand()

    def arrive(self, step: int, demand: PodDemand) -> None:
        self.step, self.demand = step, demand
        self.state.seen(demand)

    def prioritize(self, cluster: KubeCluster, pod: PodView, nodes: np.ndarray) -> list[int]:
        return self.state.prioritize(f"pod-{self.step}", self.demand, [self.names[n] for n in nodes.tolist()],
                                     now=float(self.step))

    def bound(self, node: int) -> None:
        """The pod of this step was bound; the watch delivers binds every ``lag`` placements."""
        self.pending.append((f"pod-{self.step}", self.names[node], self.demand))
        if len(self.pending) >= self.lag:
            for key, name, demand in self.pending:
                self.state.bind(key, name, demand)
            self.pending.clear()


def extender_profile(extender: BlindExtender, spec: RunSpec) -> Profile:
    """The second scheduler's ``gpugate`` profile: the default plugins plus the extender."""
    return Profile(name=EXTENDER_PROFILE, filters=DEFAULT_PROFILE.filters, scores=DEFAULT_PROFILE.scores,
                   percentage_of_nodes_to_score=spec.extender_percentage,
                   extenders=((extender.prioritize, spec.extender_weight),))


def kube_cluster(trace: Trace) -> KubeCluster:
    state = ClusterState(trace.nodes)
    labels = NodeLabels(state.names, [workload.node_labels(node) for node in trace.nodes])
    return KubeCluster(state=state, labels=labels)


def trace_mix(records: Iterable[PodRecord]) -> ShapeMix:
    """The pod list's own shape mix: what ``--extender-mix trace`` configures, and what
    ``gpugate replay`` writes as ``pod-mix.yaml`` for the balancer."""
    return ShapeMix.from_demands(demand_from_trace(records))


def balancer_inventory(trace: Trace, spec: RunSpec, extender: BlindExtender | None = None) -> Inventory:
    """The GPUInventory's type pressure as the balancer publishes it for the webhook: from the shape
    window of its extender state (``ExtenderState.type_pressure``, the code it serves), filled as a
    balancer restarted on a running cluster finds it (``BlindExtender``'s history draw). Held for the
    whole run: the window's mix changes slowly once full. Dated at the epoch and judged without a
    clock (``now`` None), so it counts as fresh; without history (``--extender-mix window``) it
    says nothing, as a new balancer on an empty cluster would. ``extender``: the arm's own, read
    before its first pod, instead of a second one built alike."""
    if spec.extender_mix != "history":
        return EMPTY_INVENTORY
    state = (extender or BlindExtender(trace, spec, None)).state
    return Inventory(generated_at=datetime.fromtimestamp(0, UTC),
                     type_pressure=tuple(sorted(state.type_pressure().items())))


def run(trace: Trace, spec: RunSpec) -> RunResult:
    """Replay one arm with one seed; pure apart from loading the policy folder named in ``spec``."""
    if spec.arm not in ARMS:
        raise InputError(f"unknown arm {spec.arm!r}; choose from {', '.join(ARMS)}")
    if spec.arm in SIZING_ARMS:
        from webhook.replay import sizing  # it builds on this module's Admission and RunResult

        return sizing.run(trace, spec)
    started = time.perf_counter()
    records = trace.pods
    demands = [record_demand(record) for record in records]
    cluster = kube_cluster(trace)
    state = cluster.state
    tracker = FragmentTracker(state, typical_pods(demands, state))
    order = arrival_order(records, state.capacity_milli, spec.seed, tune=spec.tune)
    rng = np.random.default_rng((spec.seed, 1))
    place: Callable[[int], tuple[int, tuple[int, ...]] | None]
    relabeler: Relabeler | None = None
    denied = 0
    arrivals = [0]  # the current arrival step, read by the extender's closure
    if spec.arm in REFERENCE_SCHEDULERS:
        scheduler = REFERENCE_SCHEDULERS[spec.arm](np.random.default_rng((spec.seed, 2)).permutation(state.size))

        def place(index: int) -> tuple[int, tuple[int, ...]] | None:
            feasible = np.flatnonzero(state.fits(demands[index]))
            if len(feasible) == 0:
                return None
            return scheduler.place(state, demands[index], feasible, rng, tracker)
    else:
        profiles = [DEFAULT_PROFILE, binpack_profile()]
        extender: BlindExtender | None = None
        if spec.arm in EXTENDER_ARMS:
            mix = trace_mix(records) if spec.extender_mix == "trace" else None
            extender = BlindExtender(trace, spec, mix)
            profiles.append(extender_profile(extender, spec))
        kube = KubeScheduler(tuple(profiles), rng)
        relabeler = Relabeler(lag=spec.label_lag, taint_congested=spec.taint_congested)
        relabeler.start(cluster)
        admission = Admission(spec.policies) if spec.arm in ("gpugate", "gpugate-extender") else None
        published = balancer_inventory(trace, spec, extender) if admission is not None else EMPTY_INVENTORY
        published_key = json.dumps(published.type_pressure)
        views: dict[int, PodView | None] = {}
        placement_demands: dict[int, PodDemand] = {}

        def view_of(index: int) -> PodView | None:
            if index not in views:
                pod: dict[str, Any] | None = workload.pod_for(records[index])
                if admission is not None and pod is not None:
                    pod = admission.admit(pod, published, published_key)
                if pod is None:
                    views[index] = None
                else:
                    found = demand_reading.view(pod)
                    routed = {"binpack-profile": BINPACK}.get(spec.arm)
                    if spec.arm == "extender" and (spec.extender_cpu_pods or found.demand.num_gpu):
                        routed = EXTENDER_PROFILE
                    if routed:
                        found = PodView(**{**{f: getattr(found, f) for f in PodView.__slots__},
                                           "scheduler_name": routed})
                    views[index] = found
                    placement_demands[index] = placement_demand(pod, found)
            return views[index]

        def place(index: int) -> tuple[int, tuple[int, ...]] | None:
            nonlocal denied
            pod_view = view_of(index)
            if pod_view is None:
                denied += 1
                return None
            if extender is not None:
                extender.arrive(arrivals[0], placement_demands[index])
            node = kube.schedule(cluster, pod_view)
            if node is None:
                return None
            if extender is not None:
                extender.bound(node)
            return node, kube.devices(cluster, node, pod_view.demand, spec.device_policy)

    arrived = np.empty(len(order))
    allocated = np.empty(len(order))
    fragment = np.empty(len(order))
    placed = np.zeros(len(order), dtype=bool)
    total = 0
    capacity = state.capacity_milli
    for step, index in enumerate(order):
        arrivals[0] = step
        total += records[index].gpu_request_milli
        placement = place(index)
        if placement is not None:
            node, devices = placement
            # The kube arms bind what the admitted Pod asks for; the references, the trace row.
            bound = demands[index] if spec.arm in REFERENCE_SCHEDULERS else views[index].demand  # type: ignore
            state.bind(node, bound, devices)
            tracker.refresh(state, node)
            if relabeler is not None:  # the balancer sees the pod once it is bound
                relabeler.placed(cluster, node)
            placed[step] = True
        arrived[step] = 100.0 * total / capacity
        allocated[step] = 100.0 * state.used_milli / capacity
        fragment[step] = 100.0 * tracker.cluster_fragment() / capacity
    return RunResult(arm=spec.arm, seed=spec.seed, workload=trace.workload, arrived=arrived, allocated=allocated,
                     fragment=fragment, placed=placed, failed=int((~placed).sum()), denied=denied,
                     seconds=time.perf_counter() - started)


_WORKER_TRACE: Trace | None = None


def _init_worker(trace: Trace) -> None:
    global _WORKER_TRACE  # per worker process, set once before any task: the trace is sent once
    _WORKER_TRACE = trace


def _run_in_worker(spec: RunSpec) -> RunResult:
    assert _WORKER_TRACE is not None
    return run(_WORKER_TRACE, spec)


def run_many(trace: Trace, specs: Iterable[RunSpec], *, workers: int,
             progress: Callable[[RunResult], None] | None = None) -> list[RunResult]:
    """Independent runs in separate processes (one when ``workers`` is 1), in the order given."""
    specs = list(specs)
    if workers <= 1 or len(specs) <= 1:
        results = []
        for spec in specs:
            result = run(trace, spec)
            if progress:
                progress(result)
            results.append(result)
        return results
    done: dict[int, RunResult] = {}
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(trace,)) as pool:
        futures = {pool.submit(_run_in_worker, spec): i for i, spec in enumerate(specs)}
        for future in as_completed(futures):
            result = future.result()
            done[futures[future]] = result
            if progress:
                progress(result)
    return [done[i] for i in range(len(specs))]
