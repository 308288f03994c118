"""The balancer's rebalancer in the timeline replay: the same decision, fed from the replayed cluster.

Every ``interval`` seconds the decision (``webhook.placement.moves.plan``, the code the balancer's
leader runs) is given what the balancer would observe: each node as a ``NodeView`` (its bound pods
in bind order, so the device model matches the replayed cluster's GPUs), the GPU pods that wait and
since when, the running pods the replay's policy (``POLICY``: the trace's BE pods) marks movable
once they ran ``minRuntimeSeconds``, and the budget left (``share`` of the running GPU pods per
hour, over the last hour's moves). Every trace pod counts as made by a controller, and no pod is
in a distributed job (the trace has none).

A move then happens as on a cluster: the pods are evicted (a pod that restarts elsewhere loses what
it ran: its replacement runs its whole life again, and the GPU-hours it had run are counted lost),
every node they leave gets the mark (``names.REBALANCE_TAINT_KEY``, NoSchedule, valued with the
waiting pod's name) for ``hold`` seconds, the waiting pod, which tolerates its own mark, is tried
first, and the replacements are submitted, which the mark keeps off the nodes they left.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from webhook import names
from webhook.kube import demand as kube_demand
from webhook.kube.tolerations import Toleration
from webhook.placement import moves
from webhook.placement.inputs import NodeView
from webhook.policy import matching, parsing
from webhook.policy.model import PolicySet
from webhook.replay import workload
from webhook.replay.kubescheduler import Taint
from webhook.replay.records import MILLI

POLICY = f"""apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {{name: replay-best-effort}}
spec:
  match:
    namespaces: [{workload.NAMESPACE}]
    gpuOnly: false
    podSelector: {{matchLabels: {{replay.gpugate.io/qos: BE}}}}
  disruption: {{movable: true, minRuntimeSeconds: 300}}
"""
"""The replay's policy: the trace's best-effort pods may be moved once they ran five minutes."""


@dataclass(frozen=True, slots=True)
class Knobs:
    """The balancer's ``rebalance:`` settings as the replay runs them (the same defaults)."""

    interval: float = 30.0
    threshold: float = 60.0
    share: float = 0.02
    """Budget: moves per hour, as a share of the running GPU pods."""
    hold: float = 60.0
    """Seconds a mark stays on the nodes a move emptied."""
    max_pods: int = 8


def replay_policies() -> PolicySet:
    return parsing.parse([("replay-best-effort.yaml", POLICY)])


def mark(pending: str) -> Taint:
    return Taint(names.REBALANCE_TAINT_KEY, pending, "NoSchedule")


class ReplayRebalancer:
    """Keeps the balancer's view of the replayed cluster and applies the decision's moves."""

    def __init__(self, timeline: Any, knobs: Knobs) -> None:
        self.timeline, self.knobs = timeline, knobs
        self.policies = replay_policies()
        state = timeline.state
        self.views = [NodeView.empty(name, cpu=int(state.cpu_cap[i]), memory=int(state.mem_cap[i]) * kube_demand.MIB,
                                     product=state.nodes[i].model if state.gpu_count[i] else "",
                                     gpus=int(state.gpu_count[i]), serves=timeline.world.serves(i))
                      for i, name in enumerate(state.names)]
        self.settings = moves.Settings(threshold=knobs.threshold, max_pods=knobs.max_pods,
                                       device_policy=timeline.world.device_policy)
        self.movable_index: dict[int, int | None] = {}
        self.movable: dict[int, float] = {}
        """Bound pods the policy marks movable: uid -> when they started."""
        self.recent: deque[float] = deque()
        self.moves = 0
        self.lost_gpu_hours = 0.0
        self.refused: dict[str, int] = {}
        self.version = 0
        self._quiet_at = -1
        self.memo = moves.Memo()
        self.asks: dict[int, Any] = {}
        self.usable: dict[int, frozenset[str] | None] = {}
        self.candidates: dict[int, moves.Candidate] = {}
        self.moved: list[tuple[int, int, int]] = []
        """(evicted pod, the node it left, its replacement), in the order moved."""
        self.landed: dict[int, int] = {}
        """Replacement -> the node it was first bound to."""
        """Per trace pod, what it asks as the decision reads it (its GPU models as products)."""

    # --- the view, kept with every bind and departure ----------------------------------------
    def bound(self, uid: int, pod: Any) -> None:
        policy = self.timeline.world.device_policy
        self.landed.setdefault(uid, pod.node)  # (a replacement is bound once)
        self.views[pod.node] = self.views[pod.node].bind(f"u{uid}", pod.demand, policy)
        minimum = self._min_runtime(pod.index)
        if minimum is not None:
            self.movable[uid] = pod.started + minimum
        self.version += 1

    def left(self, uid: int, pod: Any) -> None:
        self.views[pod.node] = self.views[pod.node].release(f"u{uid}")
        self.movable.pop(uid, None)
        self.candidates.pop(uid, None)
        self.version += 1

    def _min_runtime(self, index: int) -> int | None:
        """The policy's minimum runtime when it marks the trace pod movable, else None."""
        if index not in self.movable_index:
            pod = workload.pod_for(self.timeline.trace.pods[index])
            found = matching.select(self.policies, pod, namespace=workload.NAMESPACE)
            self.movable_index[index] = found.disruption.min_runtime_seconds \
                if found is not None and found.disruption.movable else None
        return self.movable_index[index]

    # --- a round -------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        timeline = self.timeline
        while self.recent and self.recent[0] <= now - 3600.0:
            self.recent.popleft()
        budget = math.floor(self.knobs.share * timeline.running_gpu_pods) - len(self.recent)
        waiting = [uid for uid in timeline.waiting_pods() if now - timeline.live[uid].submitted >= self.knobs.threshold]
        if budget <= 0 or not waiting or self._quiet_at == self.version:
            return
        plan = moves.plan(self.views, self._candidates(now), [self._waiting(uid) for uid in waiting], now=now,
                          settings=self.settings, budget=moves.Budget(cluster=budget), memo=self.memo)
        for skip in plan.skipped:
            self.refused[skip.reason] = self.refused.get(skip.reason, 0) + 1
        if not plan.moves:
            self._quiet_at = self.version  # the same view gives the same answer: wait for a change
        for move in plan.moves:
            self._apply(move, now)

    def _candidates(self, now: float) -> list[moves.Candidate]:
        return [self._candidate(uid) for uid, ready in self.movable.items() if ready <= now]

    def _candidate(self, uid: int) -> moves.Candidate:
        found = self.candidates.get(uid)
        if found is None:
            pod = self.timeline.live[uid]
            found = self.candidates[uid] = moves.Candidate(
                key=f"u{uid}", namespace=workload.NAMESPACE, unit=f"u{uid}", movable=True,
                nodes=self._usable(pod.index), node=self.views[pod.node].name)
        return found

    def _usable(self, index: int) -> frozenset[str] | None:
        """Where a replacement of the trace pod may go: the nodes of the GPU models it names (None: any)."""
        if index not in self.usable:
            models = self.timeline.trace.pods[index].gpu_spec
            state = self.timeline.state
            self.usable[index] = frozenset(name for name, node in zip(state.names, state.nodes, strict=True)
                                           if node.model in models) if models else None
        return self.usable[index]

    def _waiting(self, uid: int) -> moves.Waiting:
        pod = self.timeline.live[uid]
        demand = self.asks.get(pod.index)
        if demand is None:
            view = self.timeline.placer.view_of(pod.index)
            products = frozenset(self.timeline.trace.pods[pod.index].gpu_spec)
            demand = self.asks[pod.index] = dataclasses.replace(view.demand, products=products)
        return moves.Waiting(key=f"u{uid}", demand=demand, since=pod.submitted)

    def _apply(self, move: moves.Move, now: float) -> None:
        timeline = self.timeline
        lives = []
        for key in move.evict:
            uid = int(key[1:])
            pod = timeline.live[uid]
            milli = timeline.trace.pods[pod.index].gpu_request_milli
            self.lost_gpu_hours += milli / MILLI * (now - pod.started) / 3600.0
            lives.append((uid, pod.node, pod.index, pod.life + (now - pod.started)))
            timeline.remove(uid)
            self.recent.append(now)
            self.moves += 1
        marked = [timeline.state.names.index(name) for name in move.left]
        taint = mark(move.pending)
        for node in marked:
            timeline.cluster.taints[node] = timeline.cluster.taints[node] + (taint,)
        timeline.unmark_at(now + self.knobs.hold, marked, taint)
        pending = int(move.pending[1:])
        view = timeline.placer.view_of(timeline.live[pending].index)
        tolerating = dataclasses.replace(view, tolerations=view.tolerations + (
            Toleration(key=names.REBALANCE_TAINT_KEY, operator="Equal", value=move.pending, effect="NoSchedule"),))
        timeline.changed.difference_update(marked)
        timeline.attempt(pending, view=tolerating)
        for uid, left, index, life in lives:
            self.moved.append((uid, left, timeline.submit(index, life)))
