"""One replay run (an arm and a seed), and many of them in separate processes.

Arms, their kind and world: ``webhook.replay.arms`` (the one table). Kube arms run the
kube-scheduler model (``replay.kubescheduler``) in the run's sharing world (``World``, from
``replay.worlds``: timeslice, dra, or the published model); reference arms run a published
scheduler (``replay.reference``); the right-sizing arms are ``replay.sizing``'s.
Every arm of one seed sees the same arrival order. Pods are submitted once and never deleted; a
pod that fits nowhere (or is denied) is counted as arrived and failed.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import signal
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import numpy as np

from webhook import names
from webhook.errors import InputError
from webhook.kube import allocations, nodedevices
from webhook.kube import demand as kube_demand
from webhook.kube import slices as slices_module
from webhook.kube.demand import PodDemand
from webhook.kube.inventory import EMPTY as EMPTY_INVENTORY
from webhook.kube.inventory import Inventory
from webhook.placement import dra as placement_dra
from webhook.placement.devices import DevicePolicy
from webhook.placement.extender import ExtenderSettings, ExtenderState
from webhook.placement.shapes import ShapeMix
from webhook.replay import arms as arm_table
from webhook.replay import sizing, workload, worlds
from webhook.replay.admitting import CachedAdmission
from webhook.replay.arrival import arrival_order
from webhook.replay.cluster import ClusterState
from webhook.replay.fragmentation import FragmentTracker, typical_pods
from webhook.replay.kubescheduler import (
    DEFAULT_PROFILE,
    KubeCluster,
    KubeScheduler,
    PodView,
    Profile,
    binpack_profile,
)
from webhook.replay.labels import Relabeler
from webhook.replay.nodelabels import NodeLabels
from webhook.replay.records import Trace, TracePod
from webhook.replay.reference import REFERENCE_SCHEDULERS
from webhook.replay.runspec import DRA, PUBLISHED, SHARING, RunResult, RunSpec
from webhook.replay.worlds import World

KUBE_ARMS = arm_table.KUBE_ARMS
SIZING_ARMS = arm_table.SIZING_ARMS
"""On the trace's MIG-capable twin (webhook.replay.migcluster), through ``--policies``: webhook.replay.sizing."""
ARMS = arm_table.NAMES
POLICY_ARMS = arm_table.POLICY_ARMS
"""Arms that admit pods through the policy folder."""
BINPACK = arm_table.BINPACK_PROFILE
EXTENDER_PROFILE = names.EXTENDER_SCHEDULER_NAME
"""schedulerName of the second scheduler's profile with the default plugins and the extender (manifests/scheduler)."""
EXTENDER_ARMS = arm_table.EXTENDER_ARMS
DRA_HOLDER_PREFIX = "dra:"


def demand_from_trace(records: Iterable[TracePod], slot: int | None = None) -> list[PodDemand]:
    """The pod list as the extender would read its pods (a configured mix: what FGD's typical pods use);
    products as the nodes' ``nvidia.com/gpu.product`` labels spell them; ``slot``: the timeslice
    world, where a share reads as one slot of that many thousandths."""
    return [dataclasses.replace(record_demand(r, slot), products=frozenset(workload.product_of(m) for m in r.gpu_spec))
            for r in records]


def record_demand(record: TracePod, slot: int | None = None) -> PodDemand:
    """A trace row as the published schedulers read it (non-zero cpu/memory defaults for scoring);
    products as the trace names GPU models. ``slot``: BestFit-on-slots in the timeslice world, where
    a share is one slot of that many thousandths."""
    milli = slot if slot and record.shares_gpu else record.gpu_milli
    return PodDemand.of_gpus(record.num_gpu, milli, cpu=record.cpu_milli,
                             memory_bytes=record.memory_mib * kube_demand.MIB, products=frozenset(record.gpu_spec),
                             cpu_score=record.cpu_milli or kube_demand.DEFAULT_CPU_MILLI,
                             memory_score_bytes=record.memory_mib * kube_demand.MIB or kube_demand.DEFAULT_MEMORY_BYTES)


class BlindExtender:
    """gpugate's extender as the scheduler's profile calls it, fed as the balancer's watch would be.

    The state is ``webhook.placement.extender.ExtenderState``, the code the balancer serves. It
    learns nodes from the trace (allocatable and GPU product label), pod shapes as pods arrive
    (created, before scheduling) and bound pods in batches every ``lag`` placements: the watch's
    delay. The real mutation of the kube cluster stays in ClusterState; this sees only the API.
    In the dra world the nodes' GPUs are DRA devices: what bound pods hold comes from each node's
    ResourceSlice and the allocated claims, through ``kube.nodedevices`` and ``placement.dra``.
    """

    def __init__(self, trace: Trace, spec: RunSpec, mix: ShapeMix | None, world: World | None = None) -> None:
        policy: DevicePolicy = "packed" if spec.device_policy == "packed" else "distributed"
        settings = ExtenderSettings(device_policy=policy, levels=spec.extender_levels, mix=mix,
                                    assume=spec.extender_assume, assume_ttl=float(4 * max(1, spec.label_lag)),
                                    warm_keys=False, window=spec.extender_window, tolerance=spec.extender_tolerance)
        self.state = ExtenderState(settings)
        self.dra = world is not None and world.sharing == DRA
        self.trace_nodes = trace.nodes
        for index, node in enumerate(trace.nodes):
            self.state.set_node(node.name, cpu=node.cpu_milli, memory=node.memory_mib * kube_demand.MIB,
                                product=workload.product_of(node.model) if node.gpus else "", gpus=node.gpus,
                                ordered=self.dra and node.gpus > 0, serves=world.serves(index) if world else "any")
        if spec.extender_mix == "history":
            # The window as a balancer restarted on a running cluster finds it: full of pods created
            # before, here a seeded draw from the pod list (the trace is that cluster's history).
            history = np.random.default_rng((spec.seed, 3)).integers(len(trace.pods), size=spec.extender_window)
            demands = demand_from_trace(trace.pods, world.slot if world else None)
            for index in history.tolist():
                self.state.seen(demands[index])
        self.names = [node.name for node in trace.nodes]
        self.name_array = np.array(self.names, dtype=object)
        self.lag = max(1, spec.label_lag)
        self.pending: list[tuple[str, int, PodDemand, tuple[int, ...]]] = []
        self.claims: dict[int, list[allocations.Claim]] = {}
        self.slices: dict[int, slices_module.Slice] = {}
        self.step = 0
        self.calls = 0
        """Scheduling attempts so far: the extender's clock (a pod tried again keeps its step)."""
        self.demand = PodDemand()

    def arrive(self, step: int, demand: PodDemand, *, learn: bool = True) -> None:
        """Pod ``step`` is about to be scheduled; ``learn``: it was just created (its shape joins the
        mix), not tried again after waiting."""
        self.step, self.demand = step, demand
        self.calls += 1
        if learn:
            self.state.seen(demand)

    def release(self, step: int) -> None:
        """Pod ``step`` left its node (the timeline's departures and moves): the watch reports it gone."""
        kept = [entry for entry in self.pending if entry[0] != f"{workload.NAMESPACE}/pod-{step}"]
        if len(kept) < len(self.pending):
            self.pending = kept
            return
        self.state.unbind(f"pod-{step}")

    def prioritize(self, cluster: KubeCluster, pod: PodView, nodes: np.ndarray) -> list[int]:
        return self.state.prioritize(f"pod-{self.step}", self.demand, self.name_array[nodes].tolist(),
                                     now=float(self.calls))

    def bound(self, node: int, devices: tuple[int, ...] = ()) -> None:
        """The pod of this step was bound; the watch delivers binds every ``lag`` placements."""
        self.pending.append((f"{workload.NAMESPACE}/pod-{self.step}", node, self.demand, devices))
        if len(self.pending) >= self.lag:
            for key, index, demand, taken in self.pending:
                self._deliver(key, index, demand, taken)
            self.pending.clear()

    def _deliver(self, key: str, index: int, demand: PodDemand, devices: tuple[int, ...]) -> None:
        name = self.names[index]
        assumed_key = "pod-" + key.rsplit("-", 1)[-1]
        if not self.dra or not demand.uses_devices:
            self.state.bind(assumed_key, name, demand)
            return
        # The pod's GPUs are in its allocated claim: the pod itself counts its cpu and memory only.
        self.state.bind(assumed_key, name, dataclasses.replace(demand, gpus=0, slots=0, share_milli=0))
        node = self.trace_nodes[index]
        milli = demand.share_milli or 1000
        self.claims.setdefault(index, []).append(worlds.allocated_claim(key, node, devices, milli))
        if index not in self.slices:
            self.slices[index] = worlds.node_slice(node)
        held = self.claims[index]
        found = nodedevices.by_node([self.slices[index]], nodedevices.held_keys(held),
                                    nodedevices.consumed_by_key(held)).get(name)
        if found is not None:
            self.state.hold(DRA_HOLDER_PREFIX + name, name, placement_dra.taken_milli(found))


def extender_profile(extender: BlindExtender, spec: RunSpec) -> Profile:
    """The second scheduler's ``gpugate`` profile: the default plugins plus the extender."""
    return Profile(name=EXTENDER_PROFILE, filters=DEFAULT_PROFILE.filters, scores=DEFAULT_PROFILE.scores,
                   percentage_of_nodes_to_score=spec.extender_percentage,
                   extenders=((extender.prioritize, spec.extender_weight),))


def kube_cluster(trace: Trace) -> KubeCluster:
    state = ClusterState(trace.nodes)
    labels = NodeLabels(state.names, [workload.node_labels(node) for node in trace.nodes])
    return KubeCluster(state=state, labels=labels)


def trace_mix(records: Iterable[TracePod], slot: int | None = None) -> ShapeMix:
    """The pod list's own shape mix: what ``--extender-mix trace`` configures, and what
    ``gpugate replay`` writes as ``pod-mix.yaml`` for the balancer."""
    return ShapeMix.from_demands(demand_from_trace(records, slot))


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


Placement = tuple[int, tuple[int, ...]]
"""Where a pod went: its node and the GPUs it holds there."""


class ReferencePlacer:
    """A reference arm: a published scheduler places the trace rows as they are."""

    def __init__(self, reference: str, spec: RunSpec, state: ClusterState, demands: list[PodDemand],
                 rng: np.random.Generator, tracker: FragmentTracker) -> None:
        self.scheduler = REFERENCE_SCHEDULERS[reference](np.random.default_rng((spec.seed, 2)).permutation(state.size))
        self.state, self.demands, self.rng, self.tracker = state, demands, rng, tracker
        self.denied = 0

    def place(self, index: int, step: int) -> Placement | None:
        feasible = np.flatnonzero(self.state.fits(self.demands[index]))
        if len(feasible) == 0:
            return None
        return self.scheduler.place(self.state, self.demands[index], feasible, self.rng, self.tracker)

    def bound(self, index: int) -> PodDemand:
        return self.demands[index]

    def placed(self, node: int) -> None:
        """Nothing to relabel: the published schedulers read no labels."""


class KubePlacer:
    """A kube arm: each pod as the world writes it (admitted through the policies for the policy
    arms), read as kube-scheduler reads it and scheduled by the model's profiles, the extender's
    among them for the extender arms; the balancer's labels follow the binds."""

    def __init__(self, arm: arm_table.Arm, spec: RunSpec, trace: Trace, world: World, cluster: KubeCluster,
                 rng: np.random.Generator) -> None:
        self.spec, self.records, self.world, self.cluster = spec, trace.pods, world, cluster
        self.direct_extender = arm.extender and not arm.policies
        """Every pod goes to the extender's profile (no policy's schedulerName decides)."""
        self.profile = arm.profile
        """The profile every pod names (the arm's row); empty: its own."""
        profiles = [DEFAULT_PROFILE, binpack_profile()]
        self.extender: BlindExtender | None = None
        if arm.extender:
            mix = trace_mix(trace.pods, world.slot) if spec.extender_mix == "trace" else None
            self.extender = BlindExtender(trace, spec, mix, world)
            profiles.append(extender_profile(self.extender, spec))
        self.kube = KubeScheduler(tuple(profiles), rng, ties=spec.ties)
        self.relabeler = Relabeler(lag=spec.label_lag, taint_congested=spec.taint_congested)
        self.relabeler.start(cluster)
        self.admission = CachedAdmission(spec.policies) if arm.policies else None
        self.published = balancer_inventory(trace, spec, self.extender) if self.admission else EMPTY_INVENTORY
        self.published_key = json.dumps(self.published.type_pressure)
        self.views: dict[int, PodView | None] = {}
        self.demands: dict[int, PodDemand] = {}
        # Without admission a pod's reading depends on its row's requests alone (not its name or
        # qos label): each distinct row is read once.
        self.readings: dict[TracePod, tuple[PodView, PodDemand]] = {}
        self.denied = 0

    def view_of(self, index: int) -> PodView | None:
        """The pod as the scheduler reads it (None: the webhook denied it); what the extender reads
        of it lands in ``demands``."""
        if index in self.views:
            return self.views[index]
        record = self.records[index]
        same = dataclasses.replace(record, name="", qos="") if self.admission is None else None
        if same is not None and same in self.readings:
            self.views[index], self.demands[index] = self.readings[same]
            return self.views[index]
        pod: dict[str, Any] | None = self.world.pod_for(record)
        if self.admission is not None and pod is not None:
            pod = self.admission.admit(pod, self.published, self.published_key)
        if pod is None:
            self.views[index] = None
            return None
        found = self.world.view(pod, record)
        routed = self.profile
        if self.direct_extender and (self.spec.extender_cpu_pods or found.demand.num_gpu):
            routed = EXTENDER_PROFILE
        if routed:
            found = dataclasses.replace(found, scheduler_name=routed)
        self.views[index], self.demands[index] = found, self.world.extender_demand(pod, found, record)
        if same is not None:
            self.readings[same] = (found, self.demands[index])
        return found

    def place(self, index: int, step: int, *, learn: bool = True, pod_view: PodView | None = None) -> Placement | None:
        """Schedule the pod (``step`` names it); ``learn``: it was just created, not tried again;
        ``pod_view``: the pod as read with something added (the rebalancer's toleration)."""
        pod_view = pod_view or self.view_of(index)
        if pod_view is None:
            self.denied += 1
            return None
        if self.extender is not None:
            self.extender.arrive(step, self.demands[index], learn=learn)
        node = self.kube.schedule(self.cluster, pod_view)
        if node is None:
            return None
        devices = self.kube.devices(self.cluster, node, pod_view.demand, self.world.device_policy)
        if self.extender is not None:
            self.extender.bound(node, devices)
        return node, devices

    def bound(self, index: int) -> PodDemand:
        """What the admitted Pod asks for: what the cluster binds."""
        view = self.views[index]
        assert view is not None
        return view.demand

    def placed(self, node: int) -> None:
        self.relabeler.placed(self.cluster, node)  # the balancer sees the pod once it is bound


def run(trace: Trace, spec: RunSpec) -> RunResult:
    """Replay one arm with one seed; pure apart from loading the policy folder named in ``spec``."""
    arm = arm_table.BY_NAME.get(spec.arm)
    if arm is None:
        raise InputError(f"unknown arm {spec.arm!r}; choose from {', '.join(arm_table.BY_NAME)}")
    if spec.sharing not in (*SHARING, PUBLISHED):
        raise InputError(f"unknown sharing world {spec.sharing!r}; choose from {', '.join((*SHARING, PUBLISHED))}")
    if arm.rebalancer:
        raise InputError(f"the {spec.arm} arm moves running pods, which only a replay in time has: add --timeline")
    if arm.kind == "sizing":
        return sizing.run(trace, spec)
    started = time.perf_counter()
    world = World(trace, arm.world or spec.sharing, spec)
    demands = [record_demand(record, world.slot) for record in trace.pods]
    cluster = world.cluster(trace)
    tracker = FragmentTracker(cluster.state, typical_pods(demands, cluster.state))
    rng = np.random.default_rng((spec.seed, 1))
    placer: ReferencePlacer | KubePlacer = (
        ReferencePlacer(arm.reference, spec, cluster.state, demands, rng, tracker) if arm.kind == "reference"
        else KubePlacer(arm, spec, trace, world, cluster, rng))
    return _replay(trace, spec, world, cluster.state, tracker, placer, started)


def _replay(trace: Trace, spec: RunSpec, world: World, state: ClusterState, tracker: FragmentTracker,
            placer: ReferencePlacer | KubePlacer, started: float) -> RunResult:
    """Submit every pod once in the seed's arrival order and record the curves after each."""
    records, capacity = trace.pods, state.capacity_milli
    order = arrival_order(records, capacity, spec.seed, tune=spec.tune)
    arrived, allocated, served, fragment = (np.empty(len(order)) for _ in range(4))
    placed = np.zeros(len(order), dtype=bool)
    total = useful = overcommitted = shares = 0
    for step, index in enumerate(order):
        record = records[index]
        total += record.gpu_request_milli
        placement = placer.place(index, step)
        if placement is not None:
            node, devices = placement
            state.bind(node, placer.bound(index), devices)
            tracker.refresh(state, node)
            placer.placed(node)
            placed[step] = True
            useful += record.gpu_request_milli
            shares += record.shares_gpu
            if world.slot and record.shares_gpu and record.gpu_milli > world.slot:
                overcommitted += 1
        arrived[step] = 100.0 * total / capacity
        allocated[step] = 100.0 * state.used_milli / capacity
        served[step] = 100.0 * useful / capacity
        fragment[step] = 100.0 * tracker.cluster_fragment() / capacity
    return RunResult(arm=spec.arm, seed=spec.seed, workload=trace.workload, arrived=arrived, allocated=allocated,
                     fragment=fragment, placed=placed, failed=int((~placed).sum()), denied=placer.denied,
                     seconds=time.perf_counter() - started, served=served if world.sharing != PUBLISHED else None,
                     oversubscribed=overcommitted, shares_placed=shares, world=world.sharing)


_WORKER_TRACE: Trace | None = None


def _init_worker(trace: Trace) -> None:
    global _WORKER_TRACE  # per worker process, set once before any task: the trace is sent once
    _WORKER_TRACE = trace
    # A terminal's Ctrl-C reaches every process of the group: the workers leave it to the parent,
    # which stops them (SIGTERM) at once, instead of each printing a traceback and taking the next run.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_in_worker(task: tuple[int, RunSpec]) -> tuple[int, RunResult]:
    assert _WORKER_TRACE is not None
    return task[0], run(_WORKER_TRACE, task[1])


def run_many(trace: Trace, specs: Iterable[RunSpec], *, workers: int,
             progress: Callable[[RunResult], None] | None = None) -> list[RunResult]:
    """Independent runs in separate processes (one when ``workers`` is 1), in the order given.

    Whatever stops the caller (Ctrl-C raised in the main thread) terminates the workers before it
    propagates, so no run goes on after the command has ended."""
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
    pool = multiprocessing.Pool(min(workers, len(specs)), initializer=_init_worker, initargs=(trace,))
    try:
        for index, result in pool.imap_unordered(_run_in_worker, enumerate(specs)):
            done[index] = result
            if progress:
                progress(result)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
    return [done[i] for i in range(len(specs))]
