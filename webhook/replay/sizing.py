"""The right-sizing arms: whole-gpu, shares-only and rightsized on the trace's MIG-capable twin.

What right-sizing buys, measured on one cluster and one pod list (``webhook.replay.migcluster``
documents the twin, the layouts and how a trace row becomes a pod in each arm):

* every pod goes through the webhook's real mutation and validation (``admitting.CachedAdmission``, the
  ``--policies`` folder: whole-GPU pods match ``training``, fractional pods ``inference``, whose
  ladder 1g.10gb, 2g.20gb, 3g.40gb, a time-sliced share, a whole 80 GB GPU fits the H100 layouts);
* a pod that asks memory is admitted with the GPUInventory the balancer would publish now: the
  balancer's own pure core (``webhook.placement.gpuinventory.offers``) over the twin's nodes as the
  balancer reads them and the requests bound so far, so the rung chosen is one the cluster offers
  at that moment (the balancer's publishing delay is not modelled). The inventory is rebuilt
  whenever the set of (resource, product) with something free changes, the only thing the
  webhook's choice reads from it besides the static unit memory, and the admission cache is keyed
  on that set, so reusing answers between rebuilds changes no decision;
* scheduling is the replay's kube-scheduler model (``kubescheduler.KubeScheduler``, default profile, the
  balancer's labels every ``--label-lag`` placements, from ``webhook.placement.marks`` over each
  node's whole GPUs, slots and slices: ``TwinRelabeler``). It was extended, not forked: ``ClusterState``
  accounts integer extended resources per node as NodeResourcesFit does and ``demand.view`` reads
  MIG slices (and, here, time-sliced slots) into them. That is the whole change kube-scheduler's
  accounting needs, because no default score plugin weighs extended resources (LeastAllocated and
  BalancedAllocation default to cpu and memory), so the vectorized model stays the one model.

Reported per run: allocation (physical GPU capacity taken, % of the twin's GPUs) and the trace's
GPU request of the pods placed (``served``), both by arrived % as the other arms; pods placed,
failed and denied; per GPU resource the fractional pods got, how many were placed and failed;
and for shares-only the placed pods whose trace share exceeds a slot (time-slicing isolates no
memory, so those would contend). There is no fragment measure (FGD's is defined on per-GPU
thousandths, not on slices): its column is NaN.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np

from webhook import names
from webhook.errors import InputError
from webhook.kube import units
from webhook.kube.demand import PodDemand
from webhook.kube.inventory import Inventory
from webhook.placement import gpuinventory as balancer_inventory
from webhook.placement import marks
from webhook.replay import demand as demand_reading
from webhook.replay import migcluster
from webhook.replay.admitting import CachedAdmission
from webhook.replay.arrival import arrival_order
from webhook.replay.cluster import ClusterState
from webhook.replay.kubescheduler import DEFAULT_PROFILE, KubeCluster, KubeScheduler, PodView, binpack_profile
from webhook.replay.labels import Relabeler
from webhook.replay.nodelabels import NodeLabels
from webhook.replay.records import MILLI, Trace
from webhook.replay.runspec import MIG_TWIN, RunResult, RunSpec

GENERATED_AT = datetime(2026, 1, 1, tzinfo=UTC)
"""A fixed stamp: the replay's inventory is always fresh (the webhook is called without a clock)."""


class Offers:
    """The GPUInventory the balancer would publish for the replayed cluster now."""

    def __init__(self, nodes: tuple[migcluster.SizedNode, ...], state: ClusterState) -> None:
        self.nodes = nodes
        self.state = state
        self.infos = migcluster.node_infos(nodes)
        self.key: str | None = None
        self.inventory = Inventory()

    def signature(self) -> str:
        """The GPU resources with something free on some node (all the twin's GPUs are one product)."""
        free = [names.GPU_RESOURCE] if bool((self.state.gpu_left >= MILLI).any()) else []
        left = self.state.extended_cap - self.state.extended_used
        has_free = [bool(v) for v in np.any(left > 0, axis=0)]
        free += [r for r, has in zip(self.state.extended_names, has_free, strict=True) if has]
        return "|".join(free)

    def current(self) -> tuple[Inventory, str]:
        key = self.signature()
        if key != self.key:
            state = self.state
            whole_used = {i: int(state.gpu_count[i] - (state.gpu_left[i] >= MILLI).sum()) for i in range(state.size)}
            extended_used = {resource: {i: int(v) for i, v in enumerate(state.extended_used[:, column].tolist())}
                             for column, resource in enumerate(state.extended_names)}
            requested = migcluster.requested(self.nodes, whole_used, extended_used)
            self.inventory = Inventory(generated_at=GENERATED_AT,
                                       offers=balancer_inventory.offers(self.infos, requested))
            self.key = key
        return self.inventory, "\ninventory:" + key


class TwinRelabeler(Relabeler):
    """The balancer's labels for the twin: each node described with all its GPU resources.

    ``labels.Relabeler`` describes a trace node by its ``nvidia.com/gpu`` alone; a MIG or
    time-sliced node would then look like no GPU node at all (no ``gpu-free``, no ``gpu-load``),
    which the real balancer never writes. Here ``webhook.placement.marks`` sees the node's MIG slices
    and slots, so a MIG node is ``gpu-free: 0`` and loaded by the slices taken, as in a cluster.
    """

    def __init__(self, nodes: tuple[migcluster.SizedNode, ...], *, lag: int, taint_congested: bool) -> None:
        super().__init__(lag=lag, taint_congested=taint_congested)
        by_name = {info.name: info for info in migcluster.node_infos(nodes)}
        self.infos = [by_name.get(node.record.name) for node in nodes]

    def marks_for(self, state: ClusterState, node: int, previous_load: str | None) -> marks.Marks:
        info = self.infos[node]
        if info is None:
            return marks.Marks(free=None, load=None, tainted=False)
        owned = ((names.GPU_LOAD_LABEL, previous_load),) if previous_load else ()
        requested = {names.GPU_RESOURCE: int(state.gpu_count[node] - (state.gpu_left[node] >= MILLI).sum())}
        requested.update(zip(state.extended_names, state.extended_used[node].tolist(), strict=True))
        info = dataclasses.replace(info, owned_labels=owned)
        load = marks.node_load(info, requested, None)
        return marks.desired(info, load, thresholds=self.thresholds, taint_congested=self.taint_congested)


def taken_milli(demand: PodDemand, replicas: int) -> int:
    """Physical GPU thousandths a bound pod takes (whole GPUs, slots, MIG slices)."""
    total = migcluster.physical_milli(names.GPU_RESOURCE, demand.num_gpu) if demand.milli_per_gpu >= MILLI else 0
    return total + sum(migcluster.physical_milli(resource, count, replicas) for resource, count in demand.extended)


def gpu_resource(demand: PodDemand) -> str:
    if demand.num_gpu:
        return names.GPU_RESOURCE
    return ",".join(resource for resource, _ in demand.extended) or "(no GPU)"


def run(trace: Trace, spec: RunSpec) -> RunResult:
    """Replay one right-sizing arm with one seed (loads the policy folder named in ``spec``)."""
    try:
        migcluster.sizing_of(spec.arm)
    except ValueError as err:
        raise InputError(str(err)) from None
    if not spec.policies:
        raise InputError(f"the {spec.arm} arm admits pods through a policy folder: give --policies")
    try:
        mix = migcluster.parse_mix(spec.mig_mix)
    except migcluster.MigMixError as err:
        raise InputError(f"--mig-mix: {err}") from None
    started = time.perf_counter()
    return _replay(trace, spec, Twin(trace, spec, mix), started)


class Twin:
    """The run's H100 twin: its nodes, state and labels, the scheduler, and the webhook that admits
    each pod with the inventory the balancer would publish at that moment."""

    def __init__(self, trace: Trace, spec: RunSpec, mix: tuple[tuple[str, float], ...]) -> None:
        self.spec = spec
        self.nodes = migcluster.sized_nodes(trace.nodes, spec.arm, mix, spec.share_replicas)
        self.state = ClusterState(tuple(node.record for node in self.nodes),
                                  migcluster.extended_allocatable(self.nodes))
        self.cluster = KubeCluster(state=self.state,
                                   labels=NodeLabels(self.state.names, [node.labels for node in self.nodes]))
        self.capacity = sum(node.physical_gpus for node in self.nodes) * MILLI
        self.kube = KubeScheduler((DEFAULT_PROFILE, binpack_profile()), np.random.default_rng((spec.seed, 1)),
                                  ties=spec.ties)
        self.relabeler = TwinRelabeler(self.nodes, lag=spec.label_lag, taint_congested=spec.taint_congested)
        self.relabeler.start(self.cluster)
        self.admission = CachedAdmission(spec.policies)
        self.offers = Offers(self.nodes, self.state)

    def admit(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The stored Pod (None: denied); a memory ask is right-sized against the current offers."""
        if names.GPU_MEMORY_LABEL in pod["metadata"]["labels"]:
            inventory, key = self.offers.current()
            return self.admission.admit(pod, inventory, key)
        return self.admission.admit(pod)

    def place(self, view: PodView) -> int | None:
        """Schedule and bind the pod; the balancer's labels follow. None: no node fits."""
        demand = view.demand
        node = self.kube.schedule(self.cluster, view)
        if node is not None:
            devices = self.kube.devices(self.cluster, node, demand) if demand.num_gpu else ()
            self.state.bind(node, demand, devices)
            self.relabeler.placed(self.cluster, node)
        return node


def _replay(trace: Trace, spec: RunSpec, twin: Twin, started: float) -> RunResult:
    """Submit every pod once in the seed's arrival order; per fractional pod, count the resource it got."""
    records, capacity = trace.pods, twin.capacity
    order = arrival_order(records, capacity, spec.seed, tune=spec.tune)
    slot_milli = MILLI // spec.share_replicas
    arrived, allocated, served = (np.empty(len(order)) for _ in range(3))
    placed = np.zeros(len(order), dtype=bool)
    rungs: dict[str, list[int]] = {}
    total = taken = useful = denied = oversubscribed = 0
    for step, index in enumerate(order):
        record = records[index]
        total += record.gpu_request_milli
        stored = twin.admit(migcluster.pod_for(record, spec.arm))
        node = None
        if stored is None:
            denied += 1
            resource = "(denied)"
        else:
            view = demand_reading.view(stored, shared_slots=True)
            resource = gpu_resource(view.demand)
            node = twin.place(view)
            if node is not None:
                taken += taken_milli(view.demand, spec.share_replicas)
                useful += record.gpu_request_milli
                placed[step] = True
                if record.shares_gpu and units.is_shared(resource) and record.gpu_milli > slot_milli:
                    oversubscribed += 1
        if record.shares_gpu:
            rungs.setdefault(resource, [0, 0])[0 if node is not None else 1] += 1
        arrived[step] = 100.0 * total / capacity
        allocated[step] = 100.0 * taken / capacity
        served[step] = 100.0 * useful / capacity
    return RunResult(arm=spec.arm, seed=spec.seed, workload=trace.workload, arrived=arrived, allocated=allocated,
                     fragment=np.full(len(order), np.nan), placed=placed, failed=int((~placed).sum()),
                     denied=denied, seconds=time.perf_counter() - started, served=served,
                     rungs=tuple((r, c[0], c[1]) for r, c in sorted(rungs.items())), oversubscribed=oversubscribed,
                     world=MIG_TWIN)
