"""One small slice of the openb trace, placed twice: by the real control plane and by `gpugate replay`'s model.

The real side: fake nodes shaped like N rows of openb_node_list_gpu_node.csv,
M pods (the first ones of the replay's seeded arrival order of one pod list, or an equal share of
each of several lists, interleaved) created one at a time through the real API server, the real
webhook (starter ``policies/``), the real kube-scheduler v1.36.3 and the real balancer (``gpugate
balance``). The model side: ``webhook.replay``'s own pieces (the same Pod objects from
``workload.pod_for``, ``admitting.CachedAdmission``, ``demand.view``, ``kubescheduler.KubeScheduler``,
``labels.Relabeler``) on the same nodes and pods in the same order.

Choices, each so that the two sides are asked the same question:

* **Whole-GPU and CPU-only pods only.** ``workload.pod_for`` turns a sharing pod (gpu_milli < 1000)
  into ``nvidia.com/gpu.shared: 1`` whose size the model reads from a replay-only annotation and
  accounts per GPU in thousandths, out of the same pool as ``nvidia.com/gpu``. No real node can
  advertise that: the device plugin offers either whole GPUs or ``gpu.shared`` slots, and
  kube-scheduler counts slots as integers (framework/plugins/noderesources/fit.go). So the slice
  keeps the pods the two sides count identically; sharing pods are left out of the arrival order.
* **Exact capacities.** A node's allocatable cpu and memory are the trace's ``cpu_milli`` and
  ``memory_mib`` (no kubelet reservation), its ``nvidia.com/gpu`` the trace's GPUs, its product label
  ``workload.product_of``; ``pods`` is raised to 500 because the model has no pod-count limit.
* **One pod at a time, nothing retried.** Each pod is created only when the previous one is bound
  or declared unschedulable; an unschedulable pod is deleted at once (the replay counts it failed
  and never retries it). There is no preemption to fear: every pod has priority 0.
* **Label lag 1.** With the gpugate arm, after each GPU pod is bound the harness waits until the
  balancer has written that node's ``gpugate.io/gpu-free`` and ``gpugate.io/gpu-load`` for the new
  state (its ``write_interval`` is 0), which is what ``--label-lag 1`` models. The scheduler's own
  informer may see the labels a moment after this harness does; the lockstep comparison below
  would show a pod scored on old labels as a disagreement. The balancer's own behaviour is tested
  in test_balancer.py.
* **Isolation.** Every pod gets ``nodeSelector: {e2e.gpugate.io/pool: <tag>}`` and the slice's nodes
  (and the model's) that label, so nodes other tests left in the session cannot take pods. It is
  scoring-neutral (scores are normalized over feasible nodes only).
* **Randomness.** The model breaks ties from its ``rng`` and runs over several seeds; one real run
  is one sample. kube-scheduler v1.36.3 means to break them at random too (schedule_one.go,
  ``nodeScoreHeap`` ordered by TotalScore then ``Randomizer``) but sets the Randomizer only for
  nodes an extender scored, so without one a tie goes to the heap's top of the list the filter
  threads produced (tests/e2e/scheduler_ties.py). With 16 threads that list's order varies, which
  is why the arms' runs still differ; the world slices use a one-thread scheduler
  (:data:`FIDELITY_SCHEDULER`) so their runs do not.

Besides the end-to-end comparison, :func:`lockstep` replays the real decisions through the model:
before each pod, the model's state is the real cluster's (real bindings so far, labels recomputed),
and the question is whether the node the real scheduler chose is among the model's best-scoring
nodes. That isolates scoring differences from the divergence that compounds once two runs differ.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import secrets
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from kubernetes import client as k8s

from tests.e2e import dra_slices
from tests.e2e.placement_env import (
    FREE,
    LOAD,
    POOL_LABEL,
    SKIP_LABEL,
    Watch,
    balancer,
    decision,
    delete_now,
    expected_marks,
    node_watch,
    pod_watch,
    policy_folder,
    webhook,
)
from tests.e2e.webhook_fixture import ROOT, Namespaces, Obj, create_pod
from webhook import names
from webhook.kube import slices
from webhook.localcluster.cluster import Cluster
from webhook.replay import demand as demand_reading
from webhook.replay import workload, worlds
from webhook.replay.admitting import CachedAdmission
from webhook.replay.arrival import arrival_order
from webhook.replay.cluster import ClusterState
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
from webhook.replay.records import MILLI, NodeRecord, Trace, TracePod
from webhook.replay.runner import World
from webhook.replay.runspec import DRA, LIST_TIES, RANDOM_TIES, SHARING, TIMESLICE, RunSpec
from webhook.replay.trace import DEFAULT_POD_FILE, NODE_FILE, load_nodes, load_pods

TRACE = ROOT.parent / "shared" / "data" / "alibaba-gpu-v2023"
NODE_PODS = 500
ARMS = ("gpugate", "stock")


# --- the slice -----------------------------------------------------------------------------------

def every_pod_file(trace: Path = TRACE) -> tuple[str, ...]:
    """Every pod list of the trace (openb_pod_list_*.csv), by name."""
    return tuple(sorted(path.name for path in trace.glob("openb_pod_list_*.csv")))


@dataclass(frozen=True)
class SliceSpec:
    """Which nodes and pods: ``nodes`` rows sampled from the node list with ``seed``, and ``pods``
    whole-GPU or CPU-only pods: from each pod list of ``pod_files`` an equal share (the first ones
    of the replay's arrival order of that list for ``seed``), interleaved one list after the other."""

    nodes: int = 32
    pods: int = 250
    seed: int = 42
    pod_files: tuple[str, ...] = (DEFAULT_POD_FILE,)
    model_seeds: int = 10
    sharing: str | None = None
    """None: whole-GPU and CPU-only pods, the published model. ``timeslice`` or ``dra``:
    the trace's shares too, in that sharing world (:func:`world_fidelity`)."""


@dataclass(frozen=True)
class Slice:
    """The nodes (named as in the cluster) and the pods, in arrival order, with unique names."""

    tag: str
    nodes: tuple[NodeRecord, ...]
    pods: tuple[TracePod, ...]
    arrived_percent: float
    """The slice's GPU request as % of its GPU capacity (above 100: not everything can fit)."""
    sources: tuple[str, ...] = ()
    """The pod list each pod comes from (parallel to ``pods``)."""

    @property
    def capacity(self) -> int:
        return sum(node.gpus for node in self.nodes)

    def pod(self, record: TracePod, namespace: str) -> Obj:
        """The replay's Pod for the row (``workload.pod_for``), kept to this slice's nodes."""
        manifest = workload.pod_for(record, namespace=namespace)
        manifest["spec"]["nodeSelector"] = {POOL_LABEL: self.tag}
        return manifest

    def node_class(self, name: str | None) -> str | None:
        """A node's shape: GPU model, GPUs, cores, GiB (what "the same kind of node" means)."""
        if name is None:
            return None
        node = self.by_name[name]
        return f"{node.model}/{node.gpus}/{node.cpu_milli // MILLI}c/{node.memory_mib // 1024}G"

    @functools.cached_property
    def by_name(self) -> dict[str, NodeRecord]:
        return {node.name: node for node in self.nodes}


def slice_nodes_of(spec: SliceSpec, tag: str, trace: Path = TRACE) -> tuple[tuple[NodeRecord, ...], int]:
    """The slice's nodes (named ``<row>-<tag>``) and the whole trace's GPU capacity in thousandths."""
    every_node = load_nodes(trace / NODE_FILE)
    chosen = sorted(random.Random(spec.seed).sample(range(len(every_node)), spec.nodes))
    nodes = tuple(dataclasses.replace(every_node[i], name=f"{every_node[i].name}-{tag}") for i in chosen)
    return nodes, sum(node.gpus for node in every_node) * MILLI


def load_slice(spec: SliceSpec, *, tag: str | None = None, trace: Path = TRACE) -> Slice:
    """Sample the slice; deterministic for a spec (the ``tag`` only renames nodes)."""
    tag = tag or f"fid-{secrets.token_hex(2)}"
    nodes, capacity = slice_nodes_of(spec, tag, trace)
    share, extra = divmod(spec.pods, len(spec.pod_files))
    queues: list[list[tuple[str, TracePod]]] = []
    for position, pod_file in enumerate(spec.pod_files):
        every_pod = load_pods(trace / pod_file)
        order = [i for i in arrival_order(every_pod, capacity, spec.seed)
                 if spec.sharing is not None or not every_pod[i].shares_gpu]
        wanted = share + (1 if position < extra else 0)
        if len(order) < wanted:
            raise ValueError(f"{pod_file}: the arrival order has only {len(order)} whole-GPU or CPU pods, "
                             f"{wanted} asked")
        queues.append([(pod_file, every_pod[i]) for i in order[:wanted]])
    interleaved = [queue[k] for k in range(share + 1) for queue in queues if k < len(queue)]
    pods = tuple(dataclasses.replace(pod, name=f"{pod.name}-{k:04d}") for k, (_, pod) in enumerate(interleaved))
    requested = sum(pod.gpu_request_milli for pod in pods) / MILLI
    return Slice(tag=tag, nodes=nodes, pods=pods, sources=tuple(source for source, _ in interleaved),
                 arrived_percent=100.0 * requested / max(1, sum(node.gpus for node in nodes)))


def node_fields(node: NodeRecord, tag: str) -> dict[str, Any]:
    """NodeSpec fields for a trace row: allocatable == the trace's numbers, GFD-like labels."""
    cores = math.ceil(node.cpu_milli / MILLI)
    gib = math.ceil(node.memory_mib / 1024)
    return {
        "gpus": node.gpus,
        "product": workload.product_of(node.model),
        "gpu_memory_mib": workload.MEMORY_MIB.get(node.model, 0),  # unknown for G2/G3; no pod reads it
        "family": workload.FAMILIES.get(node.model, "unknown"),
        "cpu": cores, "reserved_cpu_millis": cores * MILLI - node.cpu_milli,
        "memory_gib": gib, "reserved_memory_mib": gib * 1024 - node.memory_mib,
        "pods": NODE_PODS,
        "labels": {POOL_LABEL: tag},
    }


@contextmanager
def slice_nodes(cluster: Cluster, nodes_: Sequence[NodeRecord], tag: str) -> Iterator[list[str]]:
    """Create the slice's nodes (eight at a time, then wait until all are schedulable); removed at the end."""
    made: list[str] = []
    try:
        with ThreadPoolExecutor(8) as pool:
            for name in pool.map(lambda node: cluster.add_gpu_node(node.name, wait=False, **node_fields(node, tag)),
                                 nodes_):
                made.append(name)
        for name in made:
            cluster.kubelet.wait_schedulable(name)
        yield made
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(cluster.remove_node, made))


# --- the real side -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    pod: str
    node: str | None
    gpus: int
    why: str = ""
    devices: tuple[int, ...] | None = None
    """In the dra world: the GPUs (``gpu-<minor>``) kube-scheduler allocated, read from the pod's claims."""


def gpus_of(pod: Obj) -> int:
    """Whole GPUs the stored pod requests (the webhook may have set them)."""
    total = 0
    for container in pod["spec"].get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        total += int(requests.get(names.GPU_RESOURCE, 0))
    return total


def labels_are(watch: Watch, wanted: dict[str, tuple[str, str]]) -> Callable[[dict[str, Obj]], bool]:
    def probe(objects: dict[str, Obj]) -> bool:
        for node, (free, load) in wanted.items():
            labels = (objects.get(node) or {}).get("metadata", {}).get("labels") or {}
            if labels.get(FREE) != free or labels.get(LOAD) != load:
                return False
        return True
    return probe


def run_real(cluster: Cluster, slice_: Slice, namespace: str, *, follow_labels: bool,
             explain: Callable[[], str] | None = None) -> list[Outcome]:
    """Create the slice's pods one at a time; return where each landed (None: unschedulable)."""
    core = cluster.core()
    capacity = {node.name: node.gpus for node in slice_.nodes}
    used = dict.fromkeys(capacity, 0)
    outcomes: list[Outcome] = []
    with pod_watch(cluster, namespace) as pods, node_watch(cluster, slice_.tag) as nodes:
        if follow_labels:
            nodes.wait(labels_are(nodes, {n: expected_marks(c, 0) for n, c in capacity.items()}), timeout=60,
                       what="the balancer's first labels on every slice node", explain=explain)
        for record in slice_.pods:
            stored = create_pod(core, namespace, slice_.pod(record, namespace))
            gpus = gpus_of(stored)
            verdict: str = pods.wait(lambda objects, name=record.name: decision(objects.get(name)), timeout=60,
                                     what=f"a scheduling decision for {record.name}", explain=explain)
            if verdict.startswith("unschedulable:"):
                delete_now(core, namespace, record.name)  # never retried, as in the replay
                outcomes.append(Outcome(record.name, None, gpus, verdict.split(":", 1)[1]))
                continue
            node = verdict.split(":", 1)[1]
            outcomes.append(Outcome(record.name, node, gpus))
            used[node] += gpus
            if follow_labels and gpus:
                want = {node: expected_marks(capacity[node], used[node])}
                nodes.wait(labels_are(nodes, want), timeout=30, what=f"labels {want} after {record.name}",
                           explain=explain)
    return outcomes


def clear_pods(cluster: Cluster, namespace: str) -> None:
    """Delete every pod of the namespace (grace 0, eight at a time) and wait until they are gone.

    Eight in parallel: one by one (as a DeleteCollection does server-side) takes ~20 s for 250
    pods on two busy cores.
    """
    core = cluster.core()
    with pod_watch(cluster, namespace) as pods:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda name: delete_now(core, namespace, name), list(pods.objects)))
        pods.wait(lambda objects: not objects, timeout=60, what=f"pods of {namespace} to go")


# --- the model side --------------------------------------------------------------------------------

def model_cluster(slice_: Slice) -> KubeCluster:
    state = ClusterState(slice_.nodes)
    labels = NodeLabels(state.names, [{**workload.node_labels(node), POOL_LABEL: slice_.tag}
                                      for node in slice_.nodes])
    return KubeCluster(state=state, labels=labels)


def admitted_views(slice_: Slice, namespace: str, arm: str, policies: Path) -> list[PodView | None]:
    """Each pod as the model's scheduler reads it: through admitting.CachedAdmission for gpugate (None: denied)."""
    admission = CachedAdmission(str(policies)) if arm == "gpugate" else None
    views: list[PodView | None] = []
    for record in slice_.pods:
        pod: Obj | None = slice_.pod(record, namespace)
        if admission is not None and pod is not None:
            pod = admission.admit(pod)
        views.append(None if pod is None else demand_reading.view(pod))
    return views


def run_model(slice_: Slice, views: Sequence[PodView | None], seed: int,
              profile: Profile = DEFAULT_PROFILE) -> list[str | None]:
    """The replay's kube arm on the slice: schedule, bind, relabel after each placement (lag 1)."""
    cluster = model_cluster(slice_)
    kube = KubeScheduler((profile, binpack_profile()), np.random.default_rng(seed))
    relabeler = Relabeler(lag=1)
    relabeler.start(cluster)
    placed: list[str | None] = []
    for view in views:
        node = None if view is None else kube.schedule(cluster, view)
        if node is None or view is None:
            placed.append(None)
            continue
        cluster.state.bind(node, view.demand, kube.devices(cluster, node, view.demand))
        relabeler.placed(cluster, node)
        placed.append(cluster.state.names[node])
    return placed




def scores(profile: Profile, cluster: KubeCluster, view: PodView) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Feasible node indices and each weighted plugin score, as KubeScheduler.schedule computes them
    (no node sampling: the slice has fewer than 100 nodes, schedule_one.go numFeasibleNodesToFind)."""
    feasible = np.ones(cluster.state.size, dtype=bool)
    for check in profile.filters:
        feasible &= check(cluster, view)
    nodes = np.flatnonzero(feasible)
    parts = {getattr(plugin, "__name__", repr(plugin)): weight * plugin(cluster, view, nodes)
             for plugin, weight in profile.scores} if len(nodes) > 1 else {}
    return nodes, parts


@dataclass
class Lockstep:
    """How often the real scheduler's choice is one the model would have made from the same state."""

    decisions: int = 0
    agreed: int = 0
    disagreements: list[str] = field(default_factory=list)
    by_source: dict[str, list[int]] = field(default_factory=dict)
    """Per pod list: [agreed, decisions]."""
    device_decisions: int = 0
    """In the dra world: GPU pods whose allocated devices were read back from their claims."""
    device_differences: list[str] = field(default_factory=list)
    """...and those where the model's device rule would have chosen other GPUs."""
    best_shares: list[float] = field(default_factory=list)
    """Per decision with more than one feasible node: the model's best nodes / feasible nodes. The
    smaller, the more a real choice among the best says (a scheduler picking any feasible node
    would agree this often by chance)."""

    @property
    def chance(self) -> float:
        """How often a random feasible node would be among the model's best, in %."""
        return 100.0 * statistics.mean(self.best_shares) if self.best_shares else 100.0

    def count(self, source: str, agreed: bool) -> None:
        self.decisions += 1
        self.agreed += agreed
        tally = self.by_source.setdefault(source, [0, 0])
        tally[0] += agreed
        tally[1] += 1

    def add(self, other: Lockstep) -> None:
        self.decisions += other.decisions
        self.agreed += other.agreed
        self.disagreements += other.disagreements
        self.best_shares += other.best_shares
        self.device_decisions += other.device_decisions
        self.device_differences += other.device_differences
        for source, (agreed, decisions) in other.by_source.items():
            tally = self.by_source.setdefault(source, [0, 0])
            tally[0] += agreed
            tally[1] += decisions

    @property
    def percent(self) -> float:
        return 100.0 * self.agreed / max(1, self.decisions)


def lockstep(slice_: Slice, views: Sequence[PodView | None], real: Sequence[Outcome],
             profile: Profile = DEFAULT_PROFILE) -> Lockstep:
    """Replay the real decisions through the model (see the module docstring)."""
    cluster = model_cluster(slice_)
    relabeler = Relabeler(lag=1)
    relabeler.start(cluster)
    index = {name: i for i, name in enumerate(cluster.state.names)}
    result = Lockstep()
    sources = slice_.sources or (("",) * len(real))
    for view, outcome, source in zip(views, real, sources, strict=True):
        if view is None:
            continue
        chosen, explained = _judge(result, profile, cluster, view, outcome, index, source)
        if explained:
            result.disagreements.append(explained)
        if chosen is not None:
            cluster.state.bind(chosen, view.demand, KubeScheduler.devices(cluster, chosen, view.demand))
            relabeler.placed(cluster, chosen)
    return result


def _judge(result: Lockstep, profile: Profile, cluster: KubeCluster, view: PodView, outcome: Outcome,
           index: dict[str, int], source: str) -> tuple[int | None, str]:
    """Whether the real decision for ``view`` is among the model's best nodes, counted in ``result``:
    the node it chose (None when the real scheduler found none) and, when they disagree, why."""
    nodes, parts = scores(profile, cluster, view)
    total = sum(parts.values(), np.zeros(len(nodes), dtype=np.int64))
    best = set(nodes[total == total.max()].tolist()) if len(nodes) else set()
    chosen = None if outcome.node is None else index[outcome.node]
    agreed = (chosen is None and not best) or (chosen is not None and chosen in best)
    if len(nodes) > 1:
        result.best_shares.append(len(best) / len(nodes))
    result.count(source, agreed)
    return chosen, "" if agreed else _explain(cluster, outcome, chosen, nodes, parts, best)


def _explain(cluster: KubeCluster, outcome: Outcome, chosen: int | None, nodes: np.ndarray,
             parts: dict[str, np.ndarray], best: set[int]) -> str:
    names_ = cluster.state.names
    if chosen is None:
        return f"{outcome.pod}: real unschedulable ({outcome.why[:80]}), model feasible on {len(nodes)} node(s)"
    if chosen not in set(nodes.tolist()):
        return f"{outcome.pod}: real {names_[chosen]}, which the model's filters reject"
    where = {node: i for i, node in enumerate(nodes.tolist())}

    def line(node: int) -> str:
        return ", ".join(f"{name}={int(values[where[node]])}" for name, values in parts.items())

    top = min(best)
    return f"{outcome.pod}: real {names_[chosen]} [{line(chosen)}] vs model best {names_[top]} [{line(top)}]"


# --- the comparison --------------------------------------------------------------------------------

def allocation(slice_: Slice, placements: Sequence[str | None], gpus: Sequence[int]) -> float:
    """Allocated GPUs / the slice's GPUs, in % (what the replay reports as GPU allocation)."""
    return 100.0 * sum(g for node, g in zip(placements, gpus, strict=True) if node) / slice_.capacity


@dataclass
class ArmReport:
    """One arm: the real runs and the model's seeds, both on the slice."""

    arm: str
    real_allocs: list[float]
    real_failed: list[int]
    real_seconds: list[float]
    model_allocs: list[float]
    model_failed: list[int]
    same_node: list[int]
    """Per (model seed, real run): pods placed on the very node the real scheduler chose."""
    same_class: list[int]
    lockstep: Lockstep

    @property
    def real_alloc(self) -> float:
        """The mean over the real runs: each is one draw of how the scheduler's ties fall."""
        return statistics.mean(self.real_allocs)

    @property
    def model_alloc(self) -> float:
        return statistics.median(self.model_allocs)

    @property
    def difference(self) -> float:
        return self.real_alloc - self.model_alloc


def _spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f}%" + (f" (range {min(values):.2f}-{max(values):.2f})"
                                                  if len(values) > 1 else "")


@dataclass
class Report:
    spec: SliceSpec
    slice: Slice
    arms: dict[str, ArmReport]
    seconds: float

    def text(self, examples: int = 5) -> str:
        s = self.slice
        classes = Counter(s.node_class(n.name) for n in s.nodes)
        lines = [
            f"slice: {len(s.nodes)} nodes / {s.capacity} GPUs ({', '.join(f'{v}x {k}' for k, v in classes.items())}); "
            f"{len(s.pods)} pods from {len(self.spec.pod_files)} pod list(s) (seed {self.spec.seed}, "
            f"whole-GPU and CPU-only; "
            f"{sum(1 for p in s.pods if not p.num_gpu)} CPU-only), GPU request {s.arrived_percent:.1f}% of capacity",
        ]
        for arm in self.arms.values():
            m = len(s.pods)
            lines += [
                f"[{arm.arm}] real kube-scheduler ({len(arm.real_allocs)} run(s)): alloc mean {arm.real_alloc:.2f}% "
                f"({', '.join(f'{a:.2f}' for a in arm.real_allocs)})  "
                f"failed {statistics.median(arm.real_failed):.0f}  ({statistics.mean(arm.real_seconds):.0f} s a run)",
                f"[{arm.arm}] replay model ({len(arm.model_allocs)} seeds): alloc {_spread(arm.model_allocs)}  "
                f"failed {statistics.median(arm.model_failed):.0f}",
                f"[{arm.arm}] difference real (mean) - model (median): {arm.difference:+.2f} points",
                f"[{arm.arm}] same node as the real run: median {statistics.median(arm.same_node):.0f}/{m} pods; "
                f"same node class: median {statistics.median(arm.same_class):.0f}/{m}",
                f"[{arm.arm}] lockstep (model scoring the real state before each pod): real choice among the "
                f"model's best in {arm.lockstep.agreed}/{arm.lockstep.decisions} ({arm.lockstep.percent:.1f}%; "
                f"a random feasible node would be among its best {arm.lockstep.chance:.0f}% of the time)",
            ]
            if len(self.spec.pod_files) > 1:
                lines.append(f"[{arm.arm}] lockstep per pod list: " + ", ".join(
                    f"{source.removeprefix('openb_pod_list_').removesuffix('.csv')} {a}/{d}"
                    for source, (a, d) in sorted(arm.lockstep.by_source.items())))
            for example in arm.lockstep.disagreements[:examples]:
                lines.append(f"[{arm.arm}]   e.g. {example}")
        lines.append(f"wall time {self.seconds:.0f} s")
        return "\n".join(lines)


def compare(arm: str, slice_: Slice, views: Sequence[PodView | None], reals: Sequence[Sequence[Outcome]],
            seeds: int, real_seconds: list[float]) -> ArmReport:
    """The model over ``seeds`` seeds against the real run(s) of one arm."""
    gpus = [o.gpus for o in reals[0]]
    real_nodes = [[o.node for o in real] for real in reals]
    allocs, failed, same, same_class = [], [], [], []
    for seed in range(seeds):
        placed = run_model(slice_, views, seed)
        allocs.append(allocation(slice_, placed, gpus))
        failed.append(sum(1 for node in placed if node is None))
        for nodes_ in real_nodes:
            pairs = [(a, b) for a, b in zip(placed, nodes_, strict=True) if a is not None]
            same.append(sum(1 for a, b in pairs if a == b))
            same_class.append(sum(1 for a, b in pairs if slice_.node_class(a) == slice_.node_class(b)))
    steps = Lockstep()
    for real in reals:
        steps.add(lockstep(slice_, views, real))
    return ArmReport(arm=arm, real_allocs=[allocation(slice_, nodes_, gpus) for nodes_ in real_nodes],
                     real_failed=[sum(1 for node in nodes_ if node is None) for nodes_ in real_nodes],
                     real_seconds=real_seconds, model_allocs=allocs, model_failed=failed, same_node=same,
                     same_class=same_class, lockstep=steps)


def fidelity(cluster: Cluster, workdir: Path, spec: SliceSpec, *, arms: Sequence[str] = ARMS, repeats: int = 1,
             log: Callable[[str], None] = lambda _: None) -> Report:
    """Run the slice through the real cluster (each arm, ``repeats`` times) and through the model; compare.

    One run after the other on the same nodes, each in a fresh namespace once the pods of the
    previous one are gone. (Both arms at once, each on its own copy of the nodes, was no faster:
    this process, which creates every pod and follows every watch, is the bottleneck.)
    """
    started = time.monotonic()
    tag = f"fid-{secrets.token_hex(2)}"
    nodes, _ = slice_nodes_of(spec, tag)
    policies = policy_folder(workdir / "policies")
    with ExitStack() as stack, ThreadPoolExecutor(1) as loader:
        loading = loader.submit(load_slice, spec, tag=tag)  # parsing every pod list takes seconds: meanwhile...
        namespaces = Namespaces(cluster)
        stack.callback(namespaces.delete_all)
        stack.enter_context(slice_nodes(cluster, nodes, tag))
        slice_ = loading.result()
        log(f"{len(slice_.nodes)} nodes up and {len(slice_.pods)} pods drawn after {time.monotonic() - started:.0f} s")
        running_balancer = stack.enter_context(balancer(cluster, workdir / "balancer"))
        stack.enter_context(webhook(cluster, workdir / "webhook", policies))

        def explain() -> str:
            return f"--- balancer:\n{running_balancer.tail()}\n{cluster.logs_tail(10)}"

        reports: dict[str, ArmReport] = {}
        for arm in arms:
            reals, seconds, namespace = [], [], ""
            for run in range(repeats):
                # The stock arm's namespace opts out of shaping (the mutating namespaceSelector skips
                # it); validation still runs there and admits the pods as written.
                labels = {SKIP_LABEL: "true"} if arm == "stock" else {}
                namespace = namespaces.make(f"ml-fidelity-{arm}", labels)
                began = time.monotonic()
                reals.append(run_real(cluster, slice_, namespace, follow_labels=arm == "gpugate", explain=explain))
                seconds.append(time.monotonic() - began)
                log(f"[{arm}] real run {run + 1}: {len(reals[-1])} pods in {seconds[-1]:.0f} s")
                clear_pods(cluster, namespace)
            views = admitted_views(slice_, namespace, arm, policies)
            reports[arm] = compare(arm, slice_, views, reals, spec.model_seeds, seconds)
            log(f"[{arm}] model runs done")
    return Report(spec=spec, slice=slice_, arms=reports, seconds=time.monotonic() - started)


# --- shares in a sharing world ---------------------------------------------------
# The trace's shares go through the real scheduler as the world makes them (webhook.replay.worlds):
# in ``timeslice`` the nodes ``worlds.sliced_nodes`` picks advertise only ``nvidia.com/gpu.shared``
# (4 slots a GPU, the device plugin's renameByDefault) and a share asks one slot; in ``dra`` no node
# advertises ``nvidia.com/gpu``: each publishes the ResourceSlice ``worlds.node_slice`` describes (a
# consumable-capacity device per GPU), the chart's DeviceClass maps ``nvidia.com/gpu: N`` onto it
# (DRAExtendedResource), and a share names the ``gpu-share-<milli>`` ResourceClaimTemplate
# ``worlds.share_template`` writes. The model side is the replay's own ``runner.World`` for that
# world. The arm is the stock one (no webhook, no balancer labels): what is compared is how the
# scheduler counts and fits shares, which the policies' affinity does not change.

FIDELITY_SCHEDULER = "gpugate-fidelity"
"""The world slices' own kube-scheduler: v1.36.3's default plugins under another name, with one
filter thread (``parallelism: 1``). Without an extender v1.36.3 sets no ``Randomizer`` and the host
is the heap's top of the filtered list (tests/e2e/scheduler_ties.py); with 16 threads that list is
in whatever order they finish, with one it is the order the scheduler learned of the nodes, which
``world_nodes`` makes the slice's. So a run is one fixed draw the model can make exactly
(``ties="list"``), not a different draw each session."""
FIDELITY_PROFILE = dataclasses.replace(DEFAULT_PROFILE, name=FIDELITY_SCHEDULER)


@contextmanager
def fidelity_scheduler(cluster: Cluster) -> Iterator[None]:
    """:data:`FIDELITY_SCHEDULER`, running until the block ends (started before the slice's nodes exist,
    so it learns them in the order they are created)."""
    assert cluster.plane is not None, "the fidelity scheduler runs beside a local control plane"
    process = cluster.plane.start_scheduler({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "parallelism": 1, "profiles": [{"schedulerName": FIDELITY_SCHEDULER}],
    }, name=FIDELITY_SCHEDULER, leader_elect=False)
    try:
        yield
    finally:
        process.stop()


def world_of(slice_: Slice, sharing: str) -> World:
    """The replay's world for the slice (its nodes and pods, as ``gpugate replay`` builds it)."""
    trace = Trace(workload="slice", nodes=slice_.nodes, pods=slice_.pods)
    return World(trace, sharing, RunSpec(arm="stock", seed=0, sharing=sharing, device_policy="packed"))


def world_pod(slice_: Slice, world: World, record: TracePod, namespace: str) -> Obj:
    manifest = world.pod_for(record)
    manifest["metadata"]["namespace"] = namespace
    manifest["spec"]["nodeSelector"] = {POOL_LABEL: slice_.tag}
    manifest["spec"]["schedulerName"] = FIDELITY_SCHEDULER
    return manifest


def world_node_fields(node: NodeRecord, tag: str, world: World, sliced: bool) -> dict[str, Any]:
    fields = node_fields(node, tag)
    if world.sharing == TIMESLICE and sliced:
        fields["replicas"] = world.replicas
    if world.sharing == DRA and node.gpus:
        fields["whole_gpus"] = 0  # the GPUs are DRA devices: no device plugin resource
    return fields


@contextmanager
def world_nodes(cluster: Cluster, slice_: Slice, world: World) -> Iterator[list[str]]:
    """The slice's nodes in the world, created one after the other in the slice's order (the order
    :data:`FIDELITY_SCHEDULER` scans them in); in dra each GPU node's ResourceSlice, owned by its Node."""
    sliced = world.sliced or (False,) * len(slice_.nodes)
    made: list[str] = []
    api = cluster.api_client()
    try:
        for node, is_sliced in zip(slice_.nodes, sliced, strict=True):
            made.append(cluster.add_gpu_node(node.name, wait=False,
                                             **world_node_fields(node, slice_.tag, world, is_sliced)))
        for name in made:
            cluster.kubelet.wait_schedulable(name)
        if world.sharing == DRA:
            dra_slices.install_device_classes(api)
            resource = k8s.ResourceV1Api(api)
            core = k8s.CoreV1Api(api)
            for node in slice_.nodes:
                if node.gpus:
                    owner = api.sanitize_for_serialization(core.read_node(node.name))
                    (body,) = dra_slices.owned_by(owner, [dict(slices.render(worlds.node_slice(node)))])
                    resource.create_resource_slice(body)
        yield made
    finally:
        if world.sharing == DRA:
            for name in made:
                dra_slices.unpublish(api, name)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(cluster.remove_node, made))


def share_templates(cluster: Cluster, slice_: Slice, world: World, namespace: str) -> None:
    """In dra, the ``gpu-share-<milli>`` templates the slice's shares name, in ``namespace``."""
    if world.sharing != DRA:
        return
    resource = k8s.ResourceV1Api(cluster.api_client())
    for milli in sorted({p.gpu_milli for p in slice_.pods if p.shares_gpu}):
        resource.create_namespaced_resource_claim_template(namespace, worlds.share_template(milli, world.models,
                                                                                            namespace))


def run_real_world(cluster: Cluster, slice_: Slice, world: World, namespace: str,
                   explain: Callable[[], str] | None = None) -> list[Outcome]:
    """Create the slice's pods one at a time in the world; where each landed (None: unschedulable)."""
    core = cluster.core()
    outcomes: list[Outcome] = []
    with pod_watch(cluster, namespace) as pods:
        for record in slice_.pods:
            create_pod(core, namespace, world_pod(slice_, world, record, namespace))
            verdict: str = pods.wait(lambda objects, name=record.name: decision(objects.get(name)), timeout=60,
                                     what=f"a scheduling decision for {record.name}", explain=explain)
            if verdict.startswith("unschedulable:"):
                delete_now(core, namespace, record.name)  # never retried, as in the replay
                outcomes.append(Outcome(record.name, None, record.num_gpu, verdict.split(":", 1)[1]))
                continue
            devices = allocated_devices(cluster, namespace, record.name) if world.sharing == DRA else None
            outcomes.append(Outcome(record.name, verdict.split(":", 1)[1], record.num_gpu, devices=devices))
    return outcomes


def clear_claims(cluster: Cluster, namespace: str, timeout: float = 60.0) -> int:
    """Wait until the namespace holds no ResourceClaim; return how many there were once its pods were gone.

    Why: a claim outlives its pod until the resourceclaim controller (kube-controller-manager)
    deallocates and deletes it, and for that while kube-scheduler counts its devices as taken. A
    next run started in that window finds GPUs the model (which starts from empty nodes) holds
    free: in one CI run the second dra run put three pods on other GPUs than the model's first fit
    and ended 1.2 points below it.
    """
    resource = k8s.ResourceV1Api(cluster.api_client())
    claims = Watch(lambda **kw: resource.list_namespaced_resource_claim(namespace, **kw),
                   what=f"resource claims in {namespace}")
    with claims:
        left = len(claims.objects)
        claims.wait(lambda objects: not objects, timeout=timeout, what=f"the claims of {namespace} to go",
                    explain=lambda: ", ".join(sorted(claims.objects)))
    return left


def allocated_devices(cluster: Cluster, namespace: str, pod: str) -> tuple[int, ...]:
    """The GPU minors the pod's claims hold: its share claim (``resourceClaimStatuses``) or the claim
    kube-scheduler made for ``nvidia.com/gpu`` (``extendedResourceClaimStatus``)."""
    api = cluster.api_client()
    status = json.loads(k8s.CoreV1Api(api).read_namespaced_pod(pod, namespace, _preload_content=False).data)
    status = status.get("status") or {}
    names_ = [s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []]
    names_.append((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))
    minors: list[int] = []
    resource = k8s.ResourceV1Api(api)
    for claim_name in filter(None, names_):
        claim = json.loads(resource.read_namespaced_resource_claim(claim_name, namespace,
                                                                   _preload_content=False).data)
        for result in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []:
            minors.append(int(str(result["device"]).removeprefix("gpu-")))
    return tuple(sorted(minors))


def world_views(slice_: Slice, world: World, namespace: str) -> list[PodView]:
    """Each pod as the model's scheduler reads it in the world (the stock arm: as written)."""
    return [world.view(world_pod(slice_, world, record, namespace), record) for record in slice_.pods]


def world_cluster(slice_: Slice, world: World) -> KubeCluster:
    cluster = world.cluster(Trace(workload="slice", nodes=slice_.nodes, pods=slice_.pods))
    cluster.labels.set_column(POOL_LABEL, [slice_.tag] * cluster.state.size)
    return cluster


def world_run_model(slice_: Slice, world: World, views: Sequence[PodView], seed: int,
                    ties: str = RANDOM_TIES) -> list[str | None]:
    """The replay's stock arm in the world on the slice (under :data:`FIDELITY_SCHEDULER`'s name)."""
    cluster = world_cluster(slice_, world)
    kube = KubeScheduler((FIDELITY_PROFILE,), np.random.default_rng(seed), ties=ties)
    placed: list[str | None] = []
    for view in views:
        node = kube.schedule(cluster, view)
        if node is None:
            placed.append(None)
            continue
        cluster.state.bind(node, view.demand, kube.devices(cluster, node, view.demand, world.device_policy))
        placed.append(cluster.state.names[node])
    return placed


def world_allocation(slice_: Slice, world: World, views: Sequence[PodView], placements: Sequence[str | None],
                     devices: Sequence[tuple[int, ...] | None] | None = None) -> float:
    """GPU capacity taken after binding ``placements`` in the model's state, in % (whole GPUs, slots
    and claimed memory alike, as the replay reports allocation in the world)."""
    cluster = world_cluster(slice_, world)
    index = {name: i for i, name in enumerate(cluster.state.names)}
    for k, (view, node) in enumerate(zip(views, placements, strict=True)):
        if node is not None:
            chosen = index[node]
            real = devices[k] if devices is not None else None
            cluster.state.bind(chosen, view.demand, real if real is not None else KubeScheduler.devices(
                cluster, chosen, view.demand, world.device_policy))
    return 100.0 * cluster.state.used_milli / cluster.state.capacity_milli


def world_lockstep(slice_: Slice, world: World, views: Sequence[PodView], real: Sequence[Outcome]) -> Lockstep:
    """The real decisions replayed through the model's scoring in the world (see :func:`lockstep`)."""
    cluster = world_cluster(slice_, world)
    index = {name: i for i, name in enumerate(cluster.state.names)}
    result = Lockstep()
    sources = slice_.sources or (("",) * len(real))
    for view, outcome, source in zip(views, real, sources, strict=True):
        chosen, explained = _judge(result, FIDELITY_PROFILE, cluster, view, outcome, index, source)
        kind = "share" if view.demand.shares_gpu else f"{view.demand.num_gpu} GPU(s)"
        if explained:
            result.disagreements.append(f"[{kind}] " + explained)
        if chosen is not None:
            fits_here = bool(cluster.state.fits(view.demand)[chosen])
            modelled = KubeScheduler.devices(cluster, chosen, view.demand, world.device_policy) if fits_here else None
            devices = outcome.devices if outcome.devices is not None else modelled
            if devices and any(cluster.state.gpu_left[chosen, g] < view.demand.milli_per_gpu for g in devices):
                result.device_differences.append(f"[{kind}] {outcome.pod} on {outcome.node}: the model's state "
                                                 f"cannot hold real GPUs {devices} ({view.demand.milli_per_gpu} each)")
                devices = modelled
            if outcome.devices is not None and view.demand.num_gpu:
                result.device_decisions += 1
                if modelled is None or tuple(sorted(modelled)) != outcome.devices:
                    result.device_differences.append(f"[{kind}] {outcome.pod} on {outcome.node}: real GPUs "
                                                     f"{outcome.devices}, model {modelled}")
            if devices is not None:
                cluster.state.bind(chosen, view.demand, devices)
    return result


@dataclass
class WorldReport:
    """One sharing world: the real runs and the model's seeds (stock arm), both on the slice."""

    spec: SliceSpec
    slice: Slice
    real_allocs: list[float]
    real_failed: list[int]
    model_allocs: list[float]
    model_failed: list[int]
    lockstep: Lockstep
    seconds: float
    heap_alloc: float = 0.0
    """The model with v1.36.3's tie rule (``ties="list"``), which is deterministic: one run."""
    heap_matches: list[int] = field(default_factory=list)
    """Per real run, the pods that got the node the model with ``ties="list"`` gives them (or, like it, none)."""

    @property
    def world(self) -> str:
        return str(self.spec.sharing)

    @property
    def difference(self) -> float:
        return statistics.mean(self.real_allocs) - statistics.median(self.model_allocs)

    def text(self, examples: int = 5) -> str:
        s = self.slice
        shares = sum(1 for p in s.pods if p.shares_gpu)
        lines = [
            f"[{self.world}] slice: {len(s.nodes)} nodes / {s.capacity} GPUs; {len(s.pods)} pods "
            f"({shares} shares, {sum(1 for p in s.pods if not p.num_gpu)} CPU-only) from "
            f"{len(self.spec.pod_files)} pod list(s), seed {self.spec.seed}; GPU request {s.arrived_percent:.1f}%",
            f"[{self.world}] real kube-scheduler ({len(self.real_allocs)} run(s)): allocation mean "
            f"{statistics.mean(self.real_allocs):.2f}% ({', '.join(f'{a:.2f}' for a in self.real_allocs)}), "
            f"failed {statistics.median(self.real_failed):.0f}",
            f"[{self.world}] replay model ({len(self.model_allocs)} seeds): allocation {_spread(self.model_allocs)}, "
            f"failed {statistics.median(self.model_failed):.0f}",
            f"[{self.world}] difference real (mean) - model (median): {self.difference:+.2f} points",
            f"[{self.world}] lockstep: real choice among the model's best in {self.lockstep.agreed}/"
            f"{self.lockstep.decisions} ({self.lockstep.percent:.1f}%; chance {self.lockstep.chance:.0f}%)",
            f"[{self.world}] the model with v1.36.3's tie rule (ties=list): allocation {self.heap_alloc:.2f}%, the "
            f"real node for {', '.join(f'{m}/{len(s.pods)}' for m in self.heap_matches)} pods",
        ]
        if self.lockstep.device_decisions:
            lines.append(f"[{self.world}] devices: the model's device rule picks the GPUs kube-scheduler allocated "
                         f"for {self.lockstep.device_decisions - len(self.lockstep.device_differences)}/"
                         f"{self.lockstep.device_decisions} GPU pods")
            lines += [f"[{self.world}]   e.g. {d}" for d in self.lockstep.device_differences[:examples]]
        lines += [f"[{self.world}]   e.g. {d}" for d in self.lockstep.disagreements[:examples]]
        lines.append(f"[{self.world}] wall time {self.seconds:.0f} s")
        return "\n".join(lines)


def world_fidelity(cluster: Cluster, spec: SliceSpec, *, repeats: int = 1,
                   log: Callable[[str], None] = lambda _: None) -> WorldReport:
    """The slice, shares included, through the real scheduler in ``spec.sharing``'s world and the model."""
    assert spec.sharing in SHARING, spec.sharing
    started = time.monotonic()
    slice_ = load_slice(spec)
    world = world_of(slice_, spec.sharing)
    reals: list[list[Outcome]] = []
    with ExitStack() as stack:
        namespaces = Namespaces(cluster)
        stack.callback(namespaces.delete_all)
        stack.enter_context(fidelity_scheduler(cluster))
        stack.enter_context(world_nodes(cluster, slice_, world))
        log(f"[{world.sharing}] {len(slice_.nodes)} nodes up after {time.monotonic() - started:.0f} s")
        namespace = ""
        for run in range(repeats):
            namespace = namespaces.make(f"fidelity-{world.sharing}", {SKIP_LABEL: "true"})
            share_templates(cluster, slice_, world, namespace)
            reals.append(run_real_world(cluster, slice_, world, namespace, explain=lambda: cluster.logs_tail(10)))
            log(f"[{world.sharing}] real run {run + 1} done after {time.monotonic() - started:.0f} s")
            clear_pods(cluster, namespace)
            if world.sharing == DRA:
                left = clear_claims(cluster, namespace)
                log(f"[{world.sharing}] {left} claim(s) outlived run {run + 1}'s pods; all gone after "
                    f"{time.monotonic() - started:.0f} s")
    views = world_views(slice_, world, namespace)
    allocs, failed = [], []
    for seed in range(spec.model_seeds):
        placed = world_run_model(slice_, world, views, seed)
        allocs.append(world_allocation(slice_, world, views, placed))
        failed.append(sum(1 for node in placed if node is None))
    steps = Lockstep()
    for real in reals:
        steps.add(world_lockstep(slice_, world, views, real))
    heap = world_run_model(slice_, world, views, 0, ties=LIST_TIES)
    return WorldReport(spec=spec, slice=slice_, heap_alloc=world_allocation(slice_, world, views, heap),
                       heap_matches=[sum(1 for o, m in zip(r, heap, strict=True) if o.node == m) for r in reals],
                       real_allocs=[world_allocation(slice_, world, views, [o.node for o in r],
                                                     [o.devices for o in r]) for r in reals],
                       real_failed=[sum(1 for o in r if o.node is None) for r in reals],
                       model_allocs=allocs, model_failed=failed, lockstep=steps,
                       seconds=time.monotonic() - started)
