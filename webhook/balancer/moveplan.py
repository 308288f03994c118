"""The rebalancer's reading of the cluster and its decision from it (pure: no I/O, no clock).

What the watches deliver is reduced once (``seen_pod``, ``seen_node``, ``seen_budget``) to what
the decision reads; ``decide`` turns a ``Snapshot`` of them, the policies and the recent evictions
into a ``webhook.placement.moves`` plan, the code the timeline replay measures:

* a waiting pod is one kube-scheduler marked ``PodScheduled=False``, reason ``Unschedulable``, for
  lack of an NVIDIA resource (its message says ``Insufficient nvidia.com/...``), since that
  condition's ``lastTransitionTime``; pods asking through DRA claims are left to DRA;
* a running pod may move only when the highest-priority policy that matches it (mode ``enforce``)
  says ``spec.disruption.movable``, a controller recreates it (a ReplicaSet, StatefulSet,
  ReplicationController or Job owns it), it ran ``minRuntimeSeconds``, no eviction of it was
  refused lately, and it does not tolerate the rebalancer's mark (its replacement could land back);
* the pods of one distributed job (``gpugate.io/group``, or the job labels the policies read) move
  together or not at all; each pod counts against the PodDisruptionBudgets that select it;
* the budget: ``budget_percent`` of the running GPU pods per hour, less the evictions of the last
  hour, and each namespace's ``maxMovesPerHour`` (the smallest its movable pods' policies set);
  a pod two PodDisruptionBudgets select is never moved (the Eviction API refuses it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook import names
from webhook.balancer import placementfeed
from webhook.kube import affinity, pods, timestamps, tolerations
from webhook.kube import demand as kube_demand
from webhook.kube.affinity import NodeAffinity
from webhook.kube.demand import PodDemand
from webhook.kube.gpunode import NodeInfo, node_info
from webhook.kube.quantity import QuantityError
from webhook.kube.tolerations import Toleration
from webhook.placement import moves
from webhook.placement.devices import DevicePolicy
from webhook.placement.inputs import NodeView
from webhook.policy import matching
from webhook.policy.model import LabelSelector, PolicySet

Obj = dict[str, Any]
RECREATED_BY = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController", "Job"})
"""Controllers that make a new pod when one of theirs is evicted."""
SHORT_OF_GPUS = "Insufficient nvidia.com/"
HOUR = 3600.0


@dataclass(frozen=True, kw_only=True)
class RebalanceSettings:
    """The balancer's ``rebalance:`` section: off unless ``enabled``."""

    enabled: bool = False
    dry_run: bool = False
    """Log each move (what, where, for whom and why) instead of marking and evicting."""
    policies: str = ""
    """The GPUPolicy folder (the webhook's): whose ``spec.disruption`` says which pods may move."""
    interval: float = 30.0
    """Seconds between two rounds: kube-scheduler retries waiting pods meanwhile."""
    threshold: float = 60.0
    """Seconds a GPU pod must have been unschedulable before a move is sought for it."""
    budget_percent: float = 2.0
    """Evictions per hour, in % of the running GPU pods (rounded down): the cost a cluster accepts."""
    max_pods: int = 8
    """The most pods one move evicts."""
    hold: float = 60.0
    """Seconds the mark stays on the nodes a move emptied, at least (and until the waiting pod binds),
    so the replacements, which kube-scheduler places within seconds, cannot land back."""
    mark_ttl: float = 600.0
    """Seconds after which a mark comes off even if the waiting pod never bound."""
    refusal_backoff: float = 600.0
    """Seconds a pod whose eviction was refused (a PodDisruptionBudget) is not planned again."""

    def problems(self) -> list[str]:
        found = []
        if self.enabled and not self.policies:
            found.append("rebalance.policies: name the GPUPolicy folder whose spec.disruption marks movable pods")
        if min(self.interval, self.hold, self.mark_ttl) <= 0 or self.threshold < 0 or self.refusal_backoff < 0:
            found.append("rebalance: interval, hold and mark_ttl must be > 0, threshold and refusal_backoff >= 0")
        if not 0 <= self.budget_percent <= 100 or self.max_pods < 1:
            found.append("rebalance: budget_percent must be within 0..100 and max_pods at least 1")
        if self.mark_ttl < self.hold:
            found.append("rebalance: mark_ttl must be at least hold")
        return found


@dataclass(frozen=True, slots=True)
class SeenPod:
    key: str
    uid: str
    namespace: str
    node: str
    phase: str
    labels: tuple[tuple[str, str], ...]
    controller: str
    created: float
    started: float | None
    demand: PodDemand | None
    waiting_since: float | None
    terminating: bool
    selection: NodeAffinity
    tolerations: tuple[Toleration, ...]


@dataclass(frozen=True, slots=True)
class SeenNode:
    info: NodeInfo
    labels: tuple[tuple[str, str], ...]
    taints: tuple[tuple[str, str, str], ...]
    """(key, value, effect) of every taint."""


@dataclass(frozen=True, slots=True)
class SeenBudget:
    key: str
    namespace: str
    selector: LabelSelector
    allowed: int


@dataclass(frozen=True)
class Snapshot:
    pods: Mapping[str, SeenPod]
    nodes: Mapping[str, SeenNode]
    budgets: Mapping[str, SeenBudget] = field(default_factory=dict)


def _waiting_since(obj: Obj) -> float | None:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                and condition.get("reason") == "Unschedulable" and SHORT_OF_GPUS in str(condition.get("message")):
            return timestamps.seconds(condition.get("lastTransitionTime"))
    return None


def seen_pod(obj: Obj) -> SeenPod:
    meta = obj.get("metadata") or {}
    spec = pods.spec(obj)
    try:
        demand: PodDemand | None = kube_demand.of_pod(obj)
    except QuantityError:
        demand = None
    owner: Obj = next((ref for ref in meta.get("ownerReferences") or () if ref.get("controller")), {})
    raw_tolerations = spec.get("tolerations") or ()
    return SeenPod(key=f"{meta.get('namespace', '')}/{meta.get('name', '')}", uid=str(meta.get("uid", "")),
                   namespace=str(meta.get("namespace", "")), node=str(spec.get("nodeName") or ""),
                   phase=str((obj.get("status") or {}).get("phase") or ""),
                   labels=tuple(sorted(pods.labels(obj).items())), controller=str(owner.get("kind", "")),
                   created=timestamps.seconds(meta.get("creationTimestamp")) or 0.0,
                   started=timestamps.seconds((obj.get("status") or {}).get("startTime")), demand=demand,
                   waiting_since=_waiting_since(obj), terminating=bool(meta.get("deletionTimestamp")),
                   selection=affinity.parse(spec),
                   tolerations=tuple(tolerations.from_k8s(t) for t in raw_tolerations if isinstance(t, dict)))


def seen_node(obj: Obj) -> SeenNode:
    meta = obj.get("metadata") or {}
    taints = tuple((str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
                   for t in (obj.get("spec") or {}).get("taints") or () if isinstance(t, dict))
    return SeenNode(info=node_info(obj), labels=tuple(sorted((meta.get("labels") or {}).items())), taints=taints)


def seen_budget(obj: Obj) -> SeenBudget:
    meta = obj.get("metadata") or {}
    selector = (obj.get("spec") or {}).get("selector")
    return SeenBudget(key=f"{meta.get('namespace', '')}/{meta.get('name', '')}", namespace=str(meta.get("namespace")),
                      selector=_selector(selector) if isinstance(selector, dict) else LabelSelector(
                          match_expressions=(affinity.Requirement("-", "In", ()),)),  # no selector: no pod
                      allowed=int((obj.get("status") or {}).get("disruptionsAllowed") or 0))


def _selector(raw: Obj) -> LabelSelector:
    return LabelSelector(match_labels=tuple(sorted((raw.get("matchLabels") or {}).items())),
                         match_expressions=affinity.requirements(raw.get("matchExpressions")))


def mark_toleration(uid: str) -> Toleration:
    """What the waiting pod is given so that it, alone, may use the nodes marked for it."""
    return Toleration(key=names.REBALANCE_TAINT_KEY, operator="Equal", value=uid, effect="NoSchedule")


def tolerates_any_mark(pod: SeenPod) -> bool:
    """A pod whose tolerations let it past another pod's mark: its replacement could land back."""
    probe = _Taint(names.REBALANCE_TAINT_KEY, "\0another pod", "NoSchedule")
    return any(t.tolerates(probe) for t in pod.tolerations)


@dataclass(frozen=True, slots=True)
class _Taint:
    key: str
    value: str
    effect: str


def usable_nodes(pod: SeenPod, nodes: Mapping[str, SeenNode]) -> frozenset[str]:
    """Nodes the pod's affinity admits and whose NoSchedule and NoExecute taints it tolerates."""
    found = set()
    for name, node in nodes.items():
        if not affinity.admits(pod.selection, name, dict(node.labels)):
            continue
        if all(effect not in ("NoSchedule", "NoExecute") or any(t.tolerates(_Taint(key, value, effect))
                                                                 for t in pod.tolerations)
               for key, value, effect in node.taints):
            found.add(name)
    return frozenset(found)


def uses_gpus(demand: PodDemand | None) -> bool:
    return demand is not None and bool(demand.gpus or demand.share_milli or demand.extended)


def views(snapshot: Snapshot, policy: DevicePolicy) -> list[NodeView]:
    """Each node as the extender models it, its pods bound in the order they were created."""
    found = {}
    for name, node in snapshot.nodes.items():
        shape = placementfeed.node_shape(node.info)
        found[name] = NodeView.empty(name, cpu=shape.cpu, memory=shape.memory, product=shape.product,
                                     gpus=shape.gpus, mig=shape.mig, serves=shape.serves)
    for pod in sorted(snapshot.pods.values(), key=lambda p: (p.created, p.key)):
        if pod.node in found and pod.demand is not None and pod.phase not in ("Succeeded", "Failed"):
            found[pod.node] = found[pod.node].bind(pod.key, pod.demand.without_dra_backed(), policy)
    return list(found.values())


@dataclass(frozen=True, slots=True)
class Decision:
    """A round's plan and what it was made from (for logs and metrics)."""

    plan: moves.Plan
    waiting: tuple[SeenPod, ...]
    """The GPU pods waiting for GPUs."""
    budget: int
    """Evictions the cluster's budget allowed this round."""
    running: int
    """GPU pods running (what the budget is a share of)."""

    @property
    def waiting_gpus(self) -> float:
        """GPUs the waiting pods ask (a share counts its part of a GPU)."""
        return sum(p.demand.gpu_request_milli for p in self.waiting if p.demand is not None) / 1000.0


def decide(snapshot: Snapshot, policies: PolicySet, *, now: float, settings: RebalanceSettings,
           evictions: Sequence[tuple[float, str]] = (), refused: Mapping[str, float] | None = None,
           moving: frozenset[str] = frozenset(), device_policy: DevicePolicy = "distributed") -> Decision:
    """The round's plan. ``evictions``: (when, namespace) of this balancer's recent evictions;
    ``refused``: pod key -> until when it is not planned again (its eviction was refused);
    ``moving``: uids of waiting pods a move was made for, whose marks still stand (kube-scheduler has
    not bound them yet, and the evicted pods may still be terminating: no second move for them)."""
    live = [p for p in snapshot.pods.values() if not p.terminating and p.phase not in ("Succeeded", "Failed")]
    running = [p for p in live if p.node and p.phase == "Running"]
    gpu_running = [p for p in running if uses_gpus(p.demand)]
    waiting = tuple(p for p in live if not p.node and p.waiting_since is not None and uses_gpus(p.demand)
                    and p.demand is not None and not p.demand.claims and p.uid not in moving)
    recent = [(at, namespace) for at, namespace in evictions if now - at < HOUR]
    allowed = max(0, math.floor(settings.budget_percent / 100.0 * len(gpu_running)) - len(recent))
    candidates, limits = _candidates([p for p in running if uses_gpus(p.demand) or pods.group_of(_as_pod(p))],
                                     snapshot, policies, now=now, settings=settings, refused=refused or {})
    budget = moves.Budget(
        cluster=allowed,
        namespaces=tuple(sorted((ns, max(0, limit - sum(1 for _, n in recent if n == ns)))
                                for ns, limit in limits.items())),
        disruptions=tuple(sorted((b.key, b.allowed) for b in snapshot.budgets.values())))
    asks = [moves.Waiting(key=p.key, demand=p.demand, since=p.waiting_since, nodes=usable_nodes(p, snapshot.nodes))
            for p in waiting if p.demand is not None and p.waiting_since is not None]
    plan = moves.plan(views(snapshot, device_policy), candidates, asks, now=now, budget=budget,
                      settings=moves.Settings(threshold=settings.threshold, max_pods=settings.max_pods,
                                              device_policy=device_policy))
    return Decision(plan=plan, waiting=waiting, budget=allowed, running=len(gpu_running))


def _as_pod(pod: SeenPod) -> Obj:
    """The little of a pod that policy matching and group reading look at."""
    return {"metadata": {"labels": dict(pod.labels), "namespace": pod.namespace}}


def _candidates(running: Sequence[SeenPod], snapshot: Snapshot, policies: PolicySet, *, now: float,
                settings: RebalanceSettings,
                refused: Mapping[str, float]) -> tuple[list[moves.Candidate], dict[str, int]]:
    """Each running pod as the decision reads it, and the per-namespace limits its policies set."""
    found: list[moves.Candidate] = []
    limits: dict[str, int] = {}
    for pod in running:
        as_pod = _as_pod(pod)
        policy = matching.select(policies, as_pod, namespace=pod.namespace, asks_for_gpus=uses_gpus(pod.demand))
        marked = policy is not None and policy.mode == "enforce" and policy.disruption.movable
        if marked and policy is not None and policy.disruption.max_moves_per_hour is not None:
            limits[pod.namespace] = min(limits.get(pod.namespace, policy.disruption.max_moves_per_hour),
                                        policy.disruption.max_moves_per_hour)
        labels = dict(pod.labels)
        guards = tuple(b.key for b in snapshot.budgets.values()
                       if b.namespace == pod.namespace and matching.selector_matches(b.selector, labels))
        ran = now - pod.started if pod.started is not None else -1.0
        # The Eviction API refuses a pod that two PodDisruptionBudgets select: never plan one.
        movable = marked and policy is not None and pod.controller in RECREATED_BY and len(guards) <= 1 \
            and ran >= policy.disruption.min_runtime_seconds and refused.get(pod.key, -math.inf) <= now \
            and not tolerates_any_mark(pod)
        group = pods.group_of(as_pod)
        found.append(moves.Candidate(
            key=pod.key, namespace=pod.namespace, unit=f"{pod.namespace}/{group[0]}={group[1]}" if group else pod.key,
            movable=movable, nodes=usable_nodes(pod, snapshot.nodes) if movable else None, node=pod.node,
            disruption_budgets=guards))
    return found, limits


@dataclass(frozen=True, slots=True)
class Mark:
    """The rebalancer's mark on a node: for which waiting pod (its uid), and since when."""

    node: str
    uid: str
    since: float


def marks_on(snapshot: Snapshot) -> list[tuple[str, str]]:
    """(node, waiting pod uid) of every mark the nodes carry."""
    return sorted((name, value) for name, node in snapshot.nodes.items()
                  for key, value, _ in node.taints if key == names.REBALANCE_TAINT_KEY)


def to_lift(marks: Sequence[Mark], snapshot: Snapshot, *, now: float, settings: RebalanceSettings) -> list[Mark]:
    """The marks to take off: their pod is bound or gone and ``hold`` has passed, or ``mark_ttl`` has."""
    by_uid = {pod.uid: pod for pod in snapshot.pods.values()}
    lift = []
    for mark in marks:
        pod = by_uid.get(mark.uid)
        settled = pod is None or bool(pod.node) or pod.terminating
        if (settled and now - mark.since >= settings.hold) or now - mark.since >= settings.mark_ttl:
            lift.append(mark)
    return lift
