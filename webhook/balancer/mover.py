"""The rebalancer at the edge: its watches, its rounds, and the writes one move makes.

Every replica watches pods, nodes and PodDisruptionBudgets (kept warm, as the labeller's caches);
only the replica that may write (the lease holder, ``may_write``) acts, and with ``dry_run`` every
replica only logs. A round every ``interval`` seconds asks the pure decision
(``moveplan.decide``) and carries out each move in this order, so that nothing is half done:

1. mark every node the evicted pods leave: the NoSchedule taint ``gpugate.io/rebalance=<uid of the
   waiting pod>``, written with the node's resourceVersion (a taint someone else added since is not
   dropped: the API server answers 409 and the move waits for the next round);
2. give the waiting pod the toleration of its own mark (pods may gain tolerations, never lose them);
3. ask the Eviction API for every pod with ``dryRun=All``: the API server checks each
   PodDisruptionBudget; one refusal and nothing is evicted, the marks come off, and that pod is not
   planned again for ``refusal_backoff`` seconds (no retry loop);
4. evict them (each with a ``uid`` precondition), and write an Event on each naming the waiting pod.

A mark comes off once its pod is bound (or gone) and ``hold`` seconds have passed, or after
``mark_ttl``: the replacements, which their controllers create at once, are scheduled meanwhile
and cannot tolerate it, so they never land on the node they left. A new leader adopts the marks it
finds and lifts them by the same rule; it also counts the evictions of the last hour from the
Events its predecessors wrote, so a handover never resets the budget.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import kubeclient, names
from webhook.balancer import moveplan
from webhook.balancer.cluster import Informer, NodeWriter
from webhook.balancer.metrics import Metrics
from webhook.balancer.moveplan import Mark, SeenBudget, SeenNode, SeenPod, Snapshot
from webhook.balancer.settings import BalancerSettings
from webhook.errors import GpugateError
from webhook.kube import timestamps
from webhook.placement import moves
from webhook.policy import loading
from webhook.policy.model import PolicySet

log = logging.getLogger("gpugate.balancer.rebalance")
COMPONENT = "gpugate-balancer"
POD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


class Mover:
    """The rebalancer of one replica: ``start`` its threads, ``close`` them."""

    def __init__(self, settings: BalancerSettings, api: Callable[[], client.ApiClient], *, metrics: Metrics,
                 may_write: Callable[[], bool], informer_args: dict[str, Any],
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings.rebalance
        self.dry_run = settings.dry_run or settings.rebalance.dry_run
        self.device_policy = cast(Any, settings.extender.device_policy)
        self.identity = settings.lease.identity or COMPONENT
        self.metrics, self.may_write, self.clock = metrics, may_write, clock
        self.core = client.CoreV1Api(api())
        self.writer = NodeWriter(api())
        self.lock = threading.Lock()
        self.pods: dict[str, SeenPod] = {}
        self.nodes: dict[str, SeenNode] = {}
        self.budgets: dict[str, SeenBudget] = {}
        self.evictions: list[tuple[float, str]] = []
        self.refused: dict[str, float] = {}
        self.marks: dict[tuple[str, str], float] = {}
        self.counted = False
        self.policies = self._load_policies(None)
        pdbs = client.PolicyV1Api(api()).list_pod_disruption_budget_for_all_namespaces
        self.informers = [
            self._informer("rebalance-pods", self.core.list_pod_for_all_namespaces, moveplan.seen_pod, self.pods,
                           informer_args, field_selector=POD_SELECTOR),
            self._informer("rebalance-nodes", self.core.list_node, moveplan.seen_node, self.nodes, informer_args),
            self._informer("rebalance-pdbs", pdbs, moveplan.seen_budget, self.budgets, informer_args)]

    def _informer(self, name: str, list_call: Callable[..., Any], reduce: Callable[[dict[str, Any]], Any],
                  cache: dict[str, Any], informer_args: dict[str, Any], **extra: Any) -> Informer[Any]:
        """A watch whose reduced objects land in ``cache``, keyed ``namespace/name`` (``name`` for nodes)."""
        return Informer[Any](name=name, list_call=list_call, reduce=lambda obj: (_key(obj).lstrip("/"), reduce(obj)),
                             on_replace=self._replace(cache), on_event=self._changed(cache), **informer_args, **extra)

    # --- caches ------------------------------------------------------------------------------
    def _replace(self, cache: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
        def replace(found: dict[str, Any]) -> None:
            with self.lock:
                cache.clear()
                cache.update(found)
        return replace

    def _changed(self, cache: dict[str, Any]) -> Callable[[str, str, Any], None]:
        def event(etype: str, key: str, value: Any) -> None:
            with self.lock:
                if value is None:
                    cache.pop(key, None)
                else:
                    cache[key] = value
        return event

    @property
    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self.informers)

    def snapshot(self) -> Snapshot:
        with self.lock:
            return Snapshot(pods=dict(self.pods), nodes=dict(self.nodes), budgets=dict(self.budgets))

    def _load_policies(self, previous: PolicySet | None) -> PolicySet:
        """The policy folder as it is now; a folder that does not load keeps the last good set."""
        try:
            return loading.load_dir(Path(self.settings.policies))
        except GpugateError as err:
            if previous is None:
                raise
            log.warning("policy folder not reloaded, keeping the last good set", extra={"fields": {"error": str(err)}})
            return previous

    # --- running -----------------------------------------------------------------------------
    def start(self, stop: threading.Event) -> list[threading.Thread]:
        threads = [threading.Thread(target=informer.run, args=(stop,), name=f"informer-{informer.name}", daemon=True)
                   for informer in self.informers]
        threads.append(threading.Thread(target=self.run, args=(stop,), name="rebalance", daemon=True))
        for thread in threads:
            thread.start()
        return threads

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.interval):
            try:
                self.round()
            except Exception:
                log.exception("rebalance round failed")

    def round(self) -> moveplan.Decision | None:
        """One round; None when this replica may not act (a standby) or the caches are not full yet."""
        if not self.synced or not (self.dry_run or self.may_write()):
            return None
        now = self.clock()
        self.policies = self._load_policies(self.policies)
        snapshot = self.snapshot()
        if not self.dry_run:
            self._count_past_evictions(now)
            self._lift(snapshot, now)
        self.refused = {key: until for key, until in self.refused.items() if until > now}
        decision = moveplan.decide(snapshot, self.policies, now=now, settings=self.settings,
                                   evictions=self.evictions, refused=self.refused, device_policy=self.device_policy,
                                   moving=frozenset(uid for _, uid in self.marks))
        self.metrics.rebalance_waiting.set(decision.waiting_gpus)
        self.metrics.rebalance_budget.set(decision.budget)
        for move in decision.plan.moves:
            if not (self.dry_run or self.may_write()):
                break  # the lease was lost during the round
            self._carry_out(move, snapshot, now)
        self.metrics.rebalance_marks.set(len({node for node, _ in self.marks}))
        return decision

    # --- one move ----------------------------------------------------------------------------
    def _carry_out(self, move: moves.Move, snapshot: Snapshot, now: float) -> None:
        pending = snapshot.pods[move.pending]
        evicted = [snapshot.pods[key] for key in move.evict]
        fields = {"waiting": pending.key, "waiting_since": pending.waiting_since, "node": move.node,
                  "evict": list(move.evict), "replacements": dict(move.replacements), "marked": list(move.left)}
        if self.dry_run:
            log.info("rebalance plan (dry run): would evict", extra={"fields": fields})
            self.metrics.rebalance_moves.labels("dry_run").inc(len(evicted))
            return
        marked: list[str] = []
        for node in move.left:
            if not self._set_mark(node, pending.uid, on=True):
                self.metrics.rebalance_refusals.labels("mark").inc()
                self._unmark(marked, pending.uid)
                return
            marked.append(node)
            self.marks[(node, pending.uid)] = now
        self._tolerate(pending)
        for pod in evicted:
            reason = self._evict(pod, dry_run=True)
            if reason:
                self._refused(pod, reason, now, fields)
                self._unmark(marked, pending.uid)
                return
        for pod in evicted:
            reason = self._evict(pod, dry_run=False)
            if reason:
                self._refused(pod, reason, now, fields)
                return
            self.evictions.append((now, pod.namespace))
            self.metrics.rebalance_moves.labels("evicted").inc()
            self._write_event(pod, pending, move, now)
        log.info("rebalanced: evicted", extra={"fields": fields})

    def _refused(self, pod: SeenPod, reason: str, now: float, fields: dict[str, Any]) -> None:
        self.refused[pod.key] = now + self.settings.refusal_backoff
        self.metrics.rebalance_refusals.labels(reason).inc()
        log.info("rebalance move refused", extra={"fields": {**fields, "pod": pod.key, "reason": reason}})

    def _unmark(self, nodes: list[str], uid: str) -> None:
        for node in nodes:
            if self._set_mark(node, uid, on=False):
                self.marks.pop((node, uid), None)

    def _set_mark(self, node: str, uid: str, *, on: bool) -> bool:
        """Add (or take off) the mark for ``uid``, with the node's resourceVersion; False on failure."""
        for _ in range(3):
            try:
                current = self.core.read_node(node, _preload_content=False, _request_timeout=(10, 30))
                body = kubeclient.raw_json(current)
                taints = [t for t in (body.get("spec") or {}).get("taints") or ()
                          if not (t.get("key") == names.REBALANCE_TAINT_KEY and t.get("value") == uid)]
                if on:
                    taints.append({"key": names.REBALANCE_TAINT_KEY, "value": uid, "effect": "NoSchedule"})
                self.writer.patch(node, {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                                         "spec": {"taints": taints}})
                return True
            except ApiException as err:
                if err.status == 404 or err.status != 409:
                    log.warning("rebalance mark not written", extra={"fields": {
                        "node": node, "on": on, "error": kubeclient.failure(err)}})
                    return err.status == 404 and not on
        return False

    def _tolerate(self, pending: SeenPod) -> None:
        toleration = moveplan.mark_toleration(pending.uid)
        if toleration in pending.tolerations:
            return
        namespace, _, name = pending.key.partition("/")
        path = "/spec/tolerations/-" if pending.tolerations else "/spec/tolerations"
        value: Any = toleration.as_k8s() if pending.tolerations else [toleration.as_k8s()]
        body = [{"op": "test", "path": "/metadata/uid", "value": pending.uid},
                {"op": "add", "path": path, "value": value}]
        try:
            self.core.patch_namespaced_pod(name, namespace, cast(Any, body), _request_timeout=(10, 30))
        except ApiException as err:
            log.warning("waiting pod not given the mark's toleration", extra={"fields": {
                "pod": pending.key, "error": kubeclient.failure(err)}})

    def _evict(self, pod: SeenPod, *, dry_run: bool) -> str:
        """The Eviction API's answer: "" when allowed, else why not (pdb, gone, error)."""
        namespace, _, name = pod.key.partition("/")
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": pod.uid}}}
        try:
            self.core.create_namespaced_pod_eviction(name, namespace, cast(Any, body),
                                                     dry_run="All" if dry_run else None, _request_timeout=(10, 30))
        except ApiException as err:
            log.info("eviction refused", extra={"fields": {"pod": pod.key, "dry_run": dry_run,
                                                           "error": kubeclient.failure(err)}})
            return {429: "pdb", 404: "gone", 409: "gone"}.get(err.status or 0, "error")
        return ""

    def _write_event(self, pod: SeenPod, pending: SeenPod, move: moves.Move, now: float) -> None:
        namespace, _, name = pod.key.partition("/")
        at = timestamps.rfc3339(now)
        gpus = pending.demand.gpu_request_milli / 1000 if pending.demand else 0
        home = dict(move.replacements).get(pod.key, "")
        body = {"metadata": {"generateName": f"{name}.", "namespace": namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name,
                                   "uid": pod.uid},
                "reason": names.REBALANCED_REASON, "type": "Normal", "count": 1,
                "message": f"Evicted to make room on {move.node} for the waiting pod {pending.key} ({gpus:g} GPUs); "
                           f"its replacement fits {home}, and {', '.join(move.left)} is marked against it",
                "firstTimestamp": at, "lastTimestamp": at, "source": {"component": COMPONENT},
                "reportingComponent": COMPONENT, "reportingInstance": self.identity}
        try:
            self.core.create_namespaced_event(namespace, cast(Any, body), _request_timeout=(10, 30))
        except ApiException as err:
            log.warning("rebalance event not written", extra={"fields": {"pod": pod.key,
                                                                         "error": kubeclient.failure(err)}})

    # --- marks and the budget across handovers -------------------------------------------------
    def _lift(self, snapshot: Snapshot, now: float) -> None:
        for node, uid in moveplan.marks_on(snapshot):
            self.marks.setdefault((node, uid), now)  # a mark this replica did not write: adopted now
        current = [Mark(node=node, uid=uid, since=since) for (node, uid), since in self.marks.items()]
        for mark in moveplan.to_lift(current, snapshot, now=now, settings=self.settings):
            if self._set_mark(mark.node, mark.uid, on=False):
                self.marks.pop((mark.node, mark.uid), None)

    def _count_past_evictions(self, now: float) -> None:
        """Once per leadership: the last hour's evictions, from the Events any replica wrote."""
        if self.counted:
            return
        try:
            response = self.core.list_event_for_all_namespaces(
                field_selector=f"reason={names.REBALANCED_REASON}", _preload_content=False, _request_timeout=(10, 60))
        except ApiException as err:
            log.warning("past evictions not counted", extra={"fields": {"error": kubeclient.failure(err)}})
            return
        for item in kubeclient.raw_json(response).get("items") or ():
            at = timestamps.seconds(item.get("lastTimestamp") or item.get("eventTime"))
            if at is not None and now - at < moveplan.HOUR and (item.get("source") or {}).get("component") == COMPONENT:
                self.evictions.append((at, str((item.get("metadata") or {}).get("namespace", ""))))
        self.counted = True


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
