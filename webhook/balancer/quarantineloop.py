"""The health loop: every ``health.interval``, the leader observes, decides, stores, then acts.

One pass, in this order (so a crash anywhere repeats work, never skips it):

1. observe: DCGM faults from Prometheus (one query per signal), the DRA driver's device taints and
   the device plugin's unhealthy counts from the balancer's own caches, the ledger, the phases
   of the validation pods;
2. decide: ``quarantine.decide`` (pure);
3. store the new ledger (a conflict, e.g. an operator's release just written, ends the pass: the
   next one starts from what is stored);
4. Events, metrics and log lines for what happened;
5. bring the cluster to the ledger (``quarantineplan.plan``): DeviceTaintRules, node taints,
   validation pods and claims, Eviction API calls, and the ``gpu-free`` hold-back.

A standby does nothing at all: it neither reads the ledger nor queries Prometheus. Under the
balancer's ``--dry-run`` the loop decides on a ledger of its own in memory and only logs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import urllib3.exceptions
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from webhook import kubeclient, names
from webhook.balancer import healthsignals, quarantineplan
from webhook.balancer.healthpolicy import HealthPolicy
from webhook.balancer.labeller import Labeller
from webhook.balancer.prometheus import PrometheusClient, PrometheusError
from webhook.balancer.quarantine import Action, Decision, Observed, decide
from webhook.balancer.quarantineapi import HealthApi, NotLeader
from webhook.balancer.quarantineledger import Ledger
from webhook.balancer.quarantinemetrics import HealthMetrics
from webhook.balancer.settings import BalancerSettings
from webhook.kube import allocations, devicetaints, slices, timestamps
from webhook.kube.gpunode import NodeInfo
from webhook.kube.nodedevices import NodeDevices

log = logging.getLogger("gpugate.balancer.health")

OUTBOX_LIMIT = 1000
EVENT_REASONS = {"quarantined": ("GPUQuarantined", True), "relapsed": ("GPUFaultWhileQuarantined", True),
                 "escalated": ("GPUQuarantineEscalated", True), "validating": ("GPUValidationStarted", False),
                 "validation-failed": ("GPUValidationFailed", True), "blocked": ("GPUValidationBlocked", True),
                 "returned": ("GPUReturned", False)}


@dataclass(frozen=True, slots=True)
class View:
    """The balancer's caches, copied under the labeller's lock."""

    nodes: dict[str, NodeInfo]
    dra: dict[str, NodeDevices]
    slices: tuple[slices.Slice, ...]
    claims: tuple[allocations.Claim, ...]

    @classmethod
    def of(cls, labeller: Labeller) -> View:
        with labeller.lock:
            cache = labeller.dra_cache
            return cls(nodes=dict(labeller.ledger.nodes), dra=dict(cache.nodes),
                       slices=tuple(cache.resource_slices.values()), claims=tuple(cache.resource_claims.values()))

    def hosts(self) -> dict[str, str]:
        """dcgm-exporter's host name -> node name (the node's name and its ``kubernetes.io/hostname``)."""
        return {host: name for name, info in self.nodes.items() for host in info.hostnames}


class QuarantineLoop:
    """The health loop of one replica; :meth:`run` until ``stop``, :meth:`once` for one pass."""

    def __init__(self, policy: HealthPolicy, api: HealthApi, labeller: Labeller, *, metrics: HealthMetrics,
                 may_write: Callable[[], bool], synced: Callable[[], bool], prometheus: PrometheusClient | None,
                 dry_run: bool, on_error: Callable[[str, BaseException], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.api = api
        self.labeller = labeller
        self.metrics = metrics
        self._may_write = may_write
        self._synced = synced
        self._prometheus = prometheus
        self._dry_run = dry_run
        self._on_error = on_error
        self._clock = clock
        self._dry_ledger = Ledger()
        self._signals_down = False
        self._rules_missing = False
        self._outbox: list[tuple[str, str, str, bool, float]] = []
        """Events decided but not sent yet (see :meth:`_send_events`)."""

    def run(self, stop: threading.Event) -> None:
        """A pass every ``policy.interval`` seconds; never raises (errors are counted and retried)."""
        while not stop.wait(self.policy.interval):
            if not self._synced():
                continue
            try:
                self.once()
            except NotLeader:
                log.info("lease lost during a health pass: stopping it")
            except Exception as err:
                self._on_error("health", err)
                log.warning("health pass failed; retrying next pass",
                            extra={"fields": {"error": kubeclient.failure(err)[:500]}})

    def once(self) -> Decision | None:
        """One pass (see the module docstring); None when this replica is a standby."""
        if not self._dry_run and not self._may_write():
            return None
        now = self._clock()
        if not self._dry_run:
            self._send_events()
        view = View.of(self.labeller)
        observed_faults, signals_ok = self._faults(view)
        if self._dry_run:
            ledger, version, pods = self._dry_ledger, None, {}
        else:
            (ledger, version), pods = self.api.read_ledger(), self.api.pod_phases()
        devices = {q.key: quarantineplan.gpu_devices(view.dra.get(q.node), q.gpu) for q in ledger.quarantines}
        running = [(self.api.namespace, q.validation_pod) for q in ledger.quarantines if q.validation_pod]
        observed = Observed(faults=tuple(observed_faults), signals_ok=signals_ok, pods=pods,
                            busy=quarantineplan.busy(view.claims, devices, running))
        decision = decide(self.policy, ledger, observed, now)
        if self._dry_run:
            self._dry_ledger = decision.ledger
        elif decision.ledger != ledger and not self.api.write_ledger(decision.ledger, version):
            self.metrics.writes.labels("ledger", "conflict").inc()
            return decision
        self._report(decision, view, now)
        if not self._dry_run:
            self._act(decision.ledger, view, pods, now)
        self.metrics.last_pass.set(now)
        return decision

    # ---- observing -----------------------------------------------------------------------------
    def _faults(self, view: View) -> tuple[list[healthsignals.Fault], bool]:
        """Every fault seen, and whether Prometheus answered all of its queries."""
        found = healthsignals.driver_taint_faults(view.slices)
        found += healthsignals.plugin_faults({n: i.unhealthy_gpus for n, i in view.nodes.items()})
        if self._prometheus is None:
            return found, True
        try:
            found += self._dcgm_faults(self._prometheus, view.hosts())
        except PrometheusError as err:
            self.metrics.signals_up.set(0)
            if not self._signals_down:
                log.warning("Prometheus unreachable: no GPU returns to service until its DCGM signals are read "
                            "again", extra={"fields": {"error": str(err)}})
            self._signals_down = True
            return found, False
        if self._signals_down:
            log.info("Prometheus answers again: DCGM health signals are read")
        self._signals_down = False
        self.metrics.signals_up.set(1)
        return found, True

    def _dcgm_faults(self, prometheus: PrometheusClient, hosts: dict[str, str]) -> list[healthsignals.Fault]:
        policy = self.policy
        found = []
        if policy.rules_for("xid"):
            found += healthsignals.xid_faults(
                prometheus.vector(healthsignals.xid_query(policy.lookback, policy.step)), hosts)
        if policy.rules_for("ecc-dbe"):
            counts, lasts = healthsignals.dbe_queries(policy.lookback, policy.step)
            found += healthsignals.dbe_faults(prometheus.vector(counts), prometheus.vector(lasts), hosts)
        if policy.rules_for("row-remap-failure"):
            found += healthsignals.row_remap_faults(prometheus.vector(healthsignals.row_remap_query()), hosts)
        return found

    # ---- reporting -----------------------------------------------------------------------------
    def _report(self, decision: Decision, view: View, now: float) -> None:
        self.metrics.record(decision.actions, dry_run=self._dry_run)
        devices = {q.key: quarantineplan.gpu_devices(view.dra.get(q.node), q.gpu)
                   for q in decision.ledger.quarantines}
        self.metrics.show(decision.ledger, devices)
        for action in decision.actions:
            message = describe(action, quarantineplan.gpu_devices(view.dra.get(action.node), action.gpu))
            fields = {"action": action.kind, "node": action.node, "gpu": action.gpu, "message": message}
            if self._dry_run:
                log.info("dry run: the health loop would act", extra={"fields": fields})
                continue
            log.log(logging.WARNING if action.kind in ("quarantined", "relapsed") else logging.INFO,
                    "health: %s", action.kind, extra={"fields": fields})
            reason = EVENT_REASONS.get(action.kind)
            if reason is not None:
                self._outbox.append((action.node, reason[0], message, reason[1], now))
        self._send_events()

    def _send_events(self) -> None:
        """The Events not sent yet, oldest first. Kept across passes: a pass cut short after its ledger
        was stored (the lease lost for a moment, an API error) still reports what it decided."""
        del self._outbox[:-OUTBOX_LIMIT]  # an API that refuses for hours must not grow it without end
        while self._outbox:
            node, reason, message, warning, at = self._outbox[0]
            try:
                self.api.event(node, reason, message, warning=warning, now=at)
            except ApiException as err:
                self.metrics.writes.labels("event", "error").inc()
                self._on_error("health.event", err)
                log.warning("health Event not written", extra={"fields": {"node": node, "reason": reason,
                                                                           "error": kubeclient.failure(err)}})
                if err.status in (429, 500, 502, 503, 504):
                    return  # the next pass tries again
            except (OSError, urllib3.exceptions.HTTPError) as err:
                self._on_error("health.event", err)
                return
            else:
                self.metrics.writes.labels("event", "ok").inc()
            self._outbox.pop(0)

    def _write(self, what: str, call: Callable[..., object], *args: object, **kwargs: object) -> bool:
        """One write: counted, and an error logged and counted, never raised (the next pass repeats it)."""
        try:
            call(*args, **kwargs)
        except NotLeader:
            raise
        except ApiException as err:
            self.metrics.writes.labels(what, "conflict" if err.status == 409 else "error").inc()
            self._on_error(f"health.{what}", err)
            log.warning("health write failed", extra={"fields": {"object": what, "error": kubeclient.failure(err)}})
            return False
        self.metrics.writes.labels(what, "ok").inc()
        return True

    # ---- acting --------------------------------------------------------------------------------
    def _act(self, ledger: Ledger, view: View, pods: dict[str, str], now: float) -> None:
        plan = quarantineplan.plan(self.policy, ledger, nodes=view.nodes, dra=view.dra, claims=view.claims,
                                   namespace=self.api.namespace, now=now)
        self._rules(plan)
        for name, info in view.nodes.items():
            taints = quarantineplan.node_taints(info, name in plan.tainted_nodes, self.policy.node_taint_effect)
            if taints is not None:
                self._write("node", self.api.set_node_taints, name, taints, info.resource_version)
        self._validations(plan, pods)
        for namespace, pod in plan.evictions:
            self._write("eviction", self._evict, namespace, pod)
        self.labeller.hold_back(plan.held_back)

    def _rules(self, plan: quarantineplan.Plan) -> None:
        try:
            current = self.api.rules()
        except ApiException as err:
            if err.status != 404:
                raise
            if not self._rules_missing:
                log.error("this cluster does not serve DeviceTaintRules (resource.k8s.io/v1, Kubernetes 1.37): GPUs "
                          "of DRA nodes cannot be quarantined; device-plugin nodes still are")
            self._rules_missing = True
            return
        self._rules_missing = False
        for name, wanted in plan.rules.items():
            have = current.get(name)
            if have is None or _differs(wanted, have):
                self._write("devicetaintrule", self.api.apply_rule, wanted, have)
        for name in set(current) - set(plan.rules):
            self._write("devicetaintrule", self.api.delete_rule, name)

    def _validations(self, plan: quarantineplan.Plan, pods: dict[str, str]) -> None:
        for name, wanted in plan.validations.items():
            if name not in pods:
                self._write("validation", self.api.create_validation, wanted.pod, wanted.claim)
        claims = self.api.validation_claims()
        for name in (set(pods) | claims) - set(plan.validations):
            self._write("validation", self.api.delete_validation, name, claim=name in claims)

    def _evict(self, namespace: str, pod: str) -> None:
        result = self.api.evict(namespace, pod)
        log.info("evicting through the Eviction API before NoExecute",
                 extra={"fields": {"pod": f"{namespace}/{pod}", "result": result}})


def _differs(wanted: devicetaints.DeviceTaintRuleWire, have: devicetaints.RuleView) -> bool:
    taint = wanted["spec"]["taint"]
    return (have.taint.effect, have.taint.value) != (taint["effect"], taint.get("value", "")) or \
        not set(wanted["metadata"]["annotations"].items()) <= set(have.annotations)


def describe(action: Action, devices: tuple[allocations.DeviceKey, ...]) -> str:
    """An Event's message: the GPU and its devices, the signal, the rule, the effect, the hold."""
    q = action.quarantine
    where = f"GPU {action.gpu or '(not named by the device plugin)'} on {action.node}"
    if devices:
        where += f" (DRA devices {', '.join(d.device for d in devices)})"
    if q is None:
        return f"{where}: {action.detail}"
    until = timestamps.rfc3339(q.hold_until)
    return (f"{where}: {action.detail}; signal {q.signal}, rule {q.rule}, effect {q.effect}, "
            f"strike {q.strikes}, hold until {until}")


def build(settings: BalancerSettings, api: ApiClient, labeller: Labeller, *, registry: CollectorRegistry,
          may_write: Callable[[], bool], synced: Callable[[], bool],
          on_error: Callable[[str, BaseException], None]) -> QuarantineLoop:
    """The loop a balancer with ``health.enabled`` runs; its namespace is the lease's unless the policy names one."""
    policy = settings.health
    namespace = policy.validation.namespace or settings.lease.namespace or "gpugate-system"
    prometheus = PrometheusClient(settings.prometheus.url, window=settings.prometheus.window,
                                  timeout=settings.prometheus.timeout) if settings.prometheus.url else None
    health_api = HealthApi(api, namespace=namespace, ledger_name=names.HEALTH_LEDGER, may_write=may_write,
                           reporter=settings.lease.identity or "gpugate-balancer")
    return QuarantineLoop(policy, health_api, labeller, metrics=HealthMetrics(registry), may_write=may_write,
                          synced=synced, prometheus=prometheus, dry_run=settings.dry_run, on_error=on_error)
