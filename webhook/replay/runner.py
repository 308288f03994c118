"""One replay run (an arm and a seed), and many of them in separate processes.

Arms, their kind and world: ``webhook.replay.arms`` (the one table). Kube arms run the
kube-scheduler model (``replay.model``) in the run's sharing world (``World``, from
``replay.worlds``: timeslice, dra, or the published model); reference arms run a published
scheduler (``replay.reference``); the right-sizing arms are ``replay.sizing``'s.
Every arm of one seed sees the same arrival order. Pods are submitted once and never deleted; a
pod that fits nowhere (or is denied) is counted as arrived and failed.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
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
from webhook.placement.devices import DevicePolicy, Serves, serves_of
from webhook.placement.extender import ExtenderSettings, ExtenderState
from webhook.placement.shapes import ShapeMix
from webhook.replay import arms as arm_table
from webhook.replay import demand as demand_reading
from webhook.replay import sizing, workload, worlds
from webhook.replay.admitting import Admission as Admission
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
from webhook.replay.runspec import DRA, PUBLISHED, SHARING, TIMESLICE, RunResult, RunSpec

KUBE_ARMS = tuple(arm.name for arm in arm_table.ARMS if arm.kind == "kube")
SIZING_ARMS = arm_table.SIZING_ARMS
"""On the trace's MIG-capable twin (webhook.replay.migcluster), through ``--policies``: webhook.replay.sizing."""
ARMS = arm_table.NAMES
POLICY_ARMS = arm_table.POLICY_ARMS
"""Arms that admit pods through the policy folder."""
BINPACK = "gpugate-binpack"
EXTENDER_PROFILE = names.EXTENDER_SCHEDULER_NAME
"""schedulerName of the second scheduler's profile with the default plugins and the extender (manifests/scheduler)."""
EXTENDER_ARMS = arm_table.EXTENDER_ARMS
DRA_HOLDER_PREFIX = "dra:"


def demand_from_trace(records: Iterable[PodRecord], slot: int | None = None) -> list[PodDemand]:
    """The pod list as the extender would read its pods (a configured mix: what FGD's typical pods use);
    products as the nodes' ``nvidia.com/gpu.product`` labels spell them; ``slot``: the timeslice
    world, where a share reads as one slot of that many thousandths."""
    return [dataclasses.replace(record_demand(r, slot), products=frozenset(workload.product_of(m) for m in r.gpu_spec))
            for r in records]


def record_demand(record: PodRecord, slot: int | None = None) -> PodDemand:
    """A trace row as the published schedulers read it (non-zero cpu/memory defaults for scoring);
    products as the trace names GPU models. ``slot``: BestFit-on-slots in the timeslice world, where
    a share is one slot of that many thousandths."""
    milli = slot if slot and record.shares_gpu else record.gpu_milli
    return PodDemand.of_gpus(record.num_gpu, milli, cpu=record.cpu_milli,
                             memory_bytes=record.memory_mib * kube_demand.MIB, products=frozenset(record.gpu_spec),
                             cpu_score=record.cpu_milli or kube_demand.DEFAULT_CPU_MILLI,
                             memory_score_bytes=record.memory_mib * kube_demand.MIB or kube_demand.DEFAULT_MEMORY_BYTES)


class World:
    """What a run's sharing world changes: the nodes, how a pod is written and read, the device rule."""

    def __init__(self, trace: Trace, sharing: str, spec: RunSpec) -> None:
        self.sharing = sharing
        self.replicas = spec.share_replicas
        self.slot = worlds.slot_milli(self.replicas) if sharing == TIMESLICE else None
        self.sliced = worlds.sliced_nodes(trace.nodes, trace.pods, self.replicas) if sharing == TIMESLICE else None
        self.models = sorted({node.model for node in trace.nodes if node.gpus})
        self.gpus = [node.gpus for node in trace.nodes]
        self.memory_of = worlds.memory_by_subrequest(self.models)
        self.device_policy = "first" if sharing == DRA else spec.device_policy
        self._asks: dict[int, int] = {}

    def serves(self, node: int) -> Serves:
        """What the node's allocatable tells the extender it takes (``devices.serves_of``, the rule
        the balancer applies): in timeslice a time-sliced node advertises only
        ``nvidia.com/gpu.shared``, the others only ``nvidia.com/gpu``; in dra and the published
        model any GPU takes either."""
        if self.sliced is None:
            return "any"
        gpus = self.gpus[node]
        return serves_of(0, gpus * self.replicas) if self.sliced[node] else serves_of(gpus, 0)

    def pod_for(self, record: PodRecord) -> dict[str, Any]:
        if self.sharing == PUBLISHED:
            return workload.pod_for(record)
        return worlds.pod_for(record, self.sharing)

    def claim_milli(self, milli: int) -> int:
        """A share claim's size as the scheduler and the extender read it from its template."""
        if milli not in self._asks:
            self._asks[milli] = placement_dra.share_milli(worlds.share_ask(milli, self.models), self.memory_of)
        return self._asks[milli]

    def view(self, pod: dict[str, Any], record: PodRecord) -> PodView:
        found = demand_reading.view(pod, slot_milli=self.slot)
        if self.sharing == DRA and record.shares_gpu and kube_demand.claim_refs(pod):
            demand = dataclasses.replace(found.demand, share_milli=self.claim_milli(record.gpu_milli))
            # The claim's sub-requests, one per GPU model in this order (worlds.share_ask): what
            # kube-scheduler's DynamicResources plugin scores nodes by (model.dynamic_resources_score).
            found = dataclasses.replace(found, demand=demand, claim_models=tuple(self.models))
        return found

    def extender_demand(self, pod: dict[str, Any], view: PodView, record: PodRecord) -> PodDemand:
        """The extender's reading of an admitted Pod: its requests, and in dra its share claim; in the
        published model (no world) a share's size from the replay's annotation, via the view."""
        found = kube_demand.of_pod(pod, slot_milli=self.slot or kube_demand.DEFAULT_SLOT_MILLI)
        if self.sharing in (PUBLISHED, DRA) and view.demand.shares_gpu:
            return dataclasses.replace(found, share_milli=view.demand.share_milli, gpus=0)
        return found

    def cluster(self, trace: Trace) -> KubeCluster:
        state = ClusterState(trace.nodes, sliced=self.sliced)
        labels = [workload.node_labels(node) for node in trace.nodes]
        if self.sliced is not None:
            labels = [worlds.timeslice_labels(found, self.replicas) if sliced else found
                      for found, sliced in zip(labels, self.sliced, strict=True)]
        return KubeCluster(state=state, labels=NodeLabels(state.names, labels))


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
        self.demand = PodDemand()

    def arrive(self, step: int, demand: PodDemand) -> None:
        self.step, self.demand = step, demand
        self.state.seen(demand)

    def prioritize(self, cluster: KubeCluster, pod: PodView, nodes: np.ndarray) -> list[int]:
        return self.state.prioritize(f"pod-{self.step}", self.demand, self.name_array[nodes].tolist(),
                                     now=float(self.step))

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


def trace_mix(records: Iterable[PodRecord], slot: int | None = None) -> ShapeMix:
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


def run(trace: Trace, spec: RunSpec) -> RunResult:
    """Replay one arm with one seed; pure apart from loading the policy folder named in ``spec``."""
    arm = arm_table.BY_NAME.get(spec.arm)
    if arm is None:
        raise InputError(f"unknown arm {spec.arm!r}; choose from {', '.join(ARMS)}")
    if spec.sharing not in (*SHARING, PUBLISHED):
        raise InputError(f"unknown sharing world {spec.sharing!r}; choose from {', '.join((*SHARING, PUBLISHED))}")
    if arm.kind == "sizing":
        return sizing.run(trace, spec)
    started = time.perf_counter()
    world = World(trace, arm_table.world_of(spec.arm, spec.sharing), spec)
    records = trace.pods
    demands = [record_demand(record, world.slot) for record in records]
    cluster = world.cluster(trace)
    state = cluster.state
    tracker = FragmentTracker(state, typical_pods(demands, state))
    order = arrival_order(records, state.capacity_milli, spec.seed, tune=spec.tune)
    rng = np.random.default_rng((spec.seed, 1))
    place: Callable[[int], tuple[int, tuple[int, ...]] | None]
    relabeler: Relabeler | None = None
    denied = 0
    arrivals = [0]  # the current arrival step, read by the extender's closure
    if arm.kind == "reference":
        scheduler = REFERENCE_SCHEDULERS[arm.reference](np.random.default_rng((spec.seed, 2)).permutation(state.size))

        def place(index: int) -> tuple[int, tuple[int, ...]] | None:
            feasible = np.flatnonzero(state.fits(demands[index]))
            if len(feasible) == 0:
                return None
            return scheduler.place(state, demands[index], feasible, rng, tracker)
    else:
        profiles = [DEFAULT_PROFILE, binpack_profile()]
        extender: BlindExtender | None = None
        if arm.extender:
            mix = trace_mix(records, world.slot) if spec.extender_mix == "trace" else None
            extender = BlindExtender(trace, spec, mix, world)
            profiles.append(extender_profile(extender, spec))
        kube = KubeScheduler(tuple(profiles), rng)
        relabeler = Relabeler(lag=spec.label_lag, taint_congested=spec.taint_congested)
        relabeler.start(cluster)
        admission = Admission(spec.policies) if arm.policies else None
        published = balancer_inventory(trace, spec, extender) if admission is not None else EMPTY_INVENTORY
        published_key = json.dumps(published.type_pressure)
        views: dict[int, PodView | None] = {}
        placement_demands: dict[int, PodDemand] = {}

        # Without admission a pod's reading depends on its row's requests alone (not its name or
        # qos label): each distinct row is read once.
        readings: dict[PodRecord, tuple[PodView, PodDemand]] = {}

        def view_of(index: int) -> PodView | None:
            if index not in views and admission is None:
                same = dataclasses.replace(records[index], name="", qos="")
                if same in readings:
                    views[index], placement_demands[index] = readings[same]
                    return views[index]
            if index not in views:
                pod: dict[str, Any] | None = world.pod_for(records[index])
                if admission is not None and pod is not None:
                    pod = admission.admit(pod, published, published_key)
                if pod is None:
                    views[index] = None
                else:
                    found = world.view(pod, records[index])
                    routed = {"binpack-profile": BINPACK}.get(spec.arm)
                    if spec.arm == "extender" and (spec.extender_cpu_pods or found.demand.num_gpu):
                        routed = EXTENDER_PROFILE
                    if routed:
                        found = dataclasses.replace(found, scheduler_name=routed)
                    views[index] = found
                    placement_demands[index] = world.extender_demand(pod, found, records[index])
                    if admission is None:
                        readings[dataclasses.replace(records[index], name="", qos="")] = \
                            (found, placement_demands[index])
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
            devices = kube.devices(cluster, node, pod_view.demand, world.device_policy)
            if extender is not None:
                extender.bound(node, devices)
            return node, devices

    arrived = np.empty(len(order))
    allocated = np.empty(len(order))
    served = np.empty(len(order))
    fragment = np.empty(len(order))
    placed = np.zeros(len(order), dtype=bool)
    total = useful = overcommitted = shares = 0
    capacity = state.capacity_milli
    for step, index in enumerate(order):
        arrivals[0] = step
        record = records[index]
        total += record.gpu_request_milli
        placement = place(index)
        if placement is not None:
            node, devices = placement
            # The kube arms bind what the admitted Pod asks for; the references, the trace row.
            bound = demands[index] if arm.kind == "reference" else views[index].demand  # type: ignore
            state.bind(node, bound, devices)
            tracker.refresh(state, node)
            if relabeler is not None:  # the balancer sees the pod once it is bound
                relabeler.placed(cluster, node)
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
                     fragment=fragment, placed=placed, failed=int((~placed).sum()), denied=denied,
                     seconds=time.perf_counter() - started, served=served if world.sharing != PUBLISHED else None,
                     oversubscribed=overcommitted, shares_placed=shares, world=world.sharing)


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
