"""The leader's look for idle GPU allocations, every ``usage.idle_interval``: measure, decide, act.

Each look: the pods that hold GPUs now (``usagesource``), the idle rule of each (the policies'
``spec.idle``, else report only), one set of activity subqueries per distinct window
(``usage.promql.idle_query``), the findings and decisions (``usage.idle``), then the writes
(``podactions``). Nothing is written unless all of this holds, and
``gpugate_balancer_idle_paused{reason}`` says which did not:

- ``standby``: this replica does not hold the Lease (it does not even query);
- ``not_synced``: a cache does not hold a full list yet;
- ``no_prometheus``: no ``--prometheus``: nothing can be measured;
- ``prometheus``: a query failed (unreachable, an error answer): no finding stands, nothing is
  reclaimed, and the last look's findings are withdrawn rather than kept stale;
- ``dry_run``: findings and decisions are made, exported and logged, nothing is written.

An Event is written once per pod and action (a new leader writes it again once); evictions spend
the budget (``usage.budget``), and one a PodDisruptionBudget refused is given back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from webhook.balancer.podactions import PodActions
from webhook.balancer.prometheus import PrometheusClient, PrometheusError
from webhook.balancer.settings import UsageSettings
from webhook.balancer.usagesource import UsageSource
from webhook.policy.store import PolicyStore
from webhook.usage import idle, promql
from webhook.usage.budget import EvictionBudget
from webhook.usage.idle import Decision, Measurement, Rule
from webhook.usage.workloads import PodRecord

log = logging.getLogger("gpugate.balancer.idle")

PAUSE_REASONS = ("standby", "not_synced", "no_prometheus", "prometheus", "dry_run")
REASON_FOUND, REASON_EVICTED, REASON_BLOCKED = "GPUIdle", "GPUIdleEvicted", "GPUIdleEvictionRefused"


class IdleMetrics:
    """The reclaimer's own series, on the balancer's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.paused = Gauge("gpugate_balancer_idle_paused", "1 for the reason the last look for idle pods wrote "
                            "nothing (standby, not_synced, no_prometheus, prometheus, dry_run), 0 for the others.",
                            ["reason"], registry=registry)
        self.actions = Counter("gpugate_balancer_idle_actions", "Writes for idle pods by action (event, annotate, "
                               "clear, evict) and result (ok, dry_run, pdb, gone, error).", ["action", "result"],
                               registry=registry)
        self.last_look = Gauge("gpugate_balancer_idle_last_look_timestamp_seconds",
                               "Unix time of the last look that measured every pod (0 before the first).",
                               registry=registry)
        self.pause(None)

    def pause(self, reason: str | None) -> None:
        for known in PAUSE_REASONS:
            self.paused.labels(known).set(1 if known == reason else 0)


class IdleReclaimer:
    """One look per interval (see the module docstring); :meth:`look` is one pass, for tests too."""

    def __init__(self, source: UsageSource, actions: PodActions, settings: UsageSettings, *,
                 prometheus: PrometheusClient | None, policies: PolicyStore | None, leading: Callable[[], bool],
                 ready: Callable[[], bool], dry_run: bool, metrics: IdleMetrics,
                 now: Callable[[], float] = time.time) -> None:
        self._source, self._actions, self._settings = source, actions, settings
        self._prometheus, self._policies = prometheus, policies
        self._leading, self._ready, self._dry_run = leading, ready, dry_run
        self.metrics = metrics
        self._now = now
        self.budget = EvictionBudget(settings.evictions_per_hour, settings.eviction_burst)
        self._written: dict[str, str] = {}
        """Pod UID -> the action its Event was written for."""
        self._down_logged = False

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.look()
            except Exception:  # a bug must not end the thread: log it and look again next time
                log.exception("a look for idle pods failed")
            stop.wait(self._settings.idle_interval)

    def look(self) -> list[Decision]:
        """One pass; returns the decisions made (empty when paused)."""
        reason = self._paused()
        if reason is not None:
            self._pause(reason)
            return []
        snap = self._source.snapshot()
        if snap is None:
            self._pause("not_synced")
            return []
        records = self._source.pods.records()
        policies = None
        if self._policies is not None:
            self._policies.check()  # a changed folder is loaded; a bad one keeps the last good set
            policies = self._policies.current()
        rules = {r.key: idle.rule_for(r, policies) for r in records}
        measured = self._measure(list(rules.values()))
        if measured is None:
            self._pause("prometheus")
            return []
        now = self._now()
        findings = idle.find(records, idle.held_gpus(snap.holdings), rules, measured, now)
        decisions = idle.plan(findings, evictions_left=self.budget.available(now))
        self.metrics.last_look.set(now)
        self._source.set_decisions(decisions)
        self.metrics.pause("dry_run" if self._dry_run else None)
        for decision in decisions:
            self._act(decision)
        for record in idle.to_clear(records, findings, rules, measured):
            self._clear(record)
        found = {d.finding.record.uid for d in decisions}
        self._written = {uid: action for uid, action in self._written.items() if uid in found}
        return decisions

    def _paused(self) -> str | None:
        if not self._leading():
            return "standby"
        if not self._ready():
            return "not_synced"
        if self._prometheus is None:
            return "no_prometheus"
        return None

    def _pause(self, reason: str) -> None:
        self.metrics.pause(reason)
        self._source.set_decisions([])

    def _measure(self, rules: list[Rule]) -> dict[int, dict[str, Measurement]] | None:
        """Per window, per pod key; None when any query failed."""
        assert self._prometheus is not None
        out: dict[int, dict[str, Measurement]] = {}
        for window in idle.windows(rules):
            query = promql.idle_query(window, min_step=self._settings.min_step)
            try:
                answers = {name: self._prometheus.query(expr) for name, expr in query.exprs().items()}
                out[window] = promql.measurements(query, answers)
            except (PrometheusError, ValueError) as err:
                if not self._down_logged:
                    log.warning("cannot measure GPU activity: no idle pod is reclaimed until Prometheus answers",
                                extra={"fields": {"error": str(err)}})
                    self._down_logged = True
                return None
        if self._down_logged:
            log.info("Prometheus answers the idle queries again")
            self._down_logged = False
        return out

    def _act(self, decision: Decision) -> None:
        finding, record = decision.finding, decision.finding.record
        text = finding.describe()
        if decision.action == "evict":
            self._evict(decision)
            return
        if decision.action == "annotate" and record.idle_note != text:
            self._write("annotate", record, lambda: self._actions.annotate(record, text))
        if self._written.get(record.uid) != decision.action:
            note = f"{text}; action: {decision.action}" + (f" ({decision.reason})" if decision.reason else "")
            if self._write("event", record, lambda: self._actions.event(record, REASON_FOUND, note)):
                self._written[record.uid] = decision.action

    def _clear(self, record: PodRecord) -> None:
        self._write("clear", record, lambda: self._actions.annotate(record, None))

    def _evict(self, decision: Decision) -> None:
        finding, record = decision.finding, decision.finding.record
        if self._dry_run:  # what it would evict is counted; the budget is not spent
            self._write("evict", record, lambda: True)
            return
        if not self._leading():  # asked again right before the write: a lost Lease stops it here
            return
        now = self._now()
        self.budget.spend(now)
        result = self._actions.evict(record)
        self.metrics.actions.labels("evict", result).inc()
        log.info("idle pod eviction", extra={"fields": {"pod": record.key, "owner": "/".join(record.owner),
                                                        "result": result, "measured": finding.describe()}})
        if result == "ok":
            self._actions.event(record, REASON_EVICTED, f"Evicted: {finding.describe()}; its {record.controller} "
                                f"recreates it", warning=True)
            return
        self.budget.refund(now)
        if result == "pdb" and self._written.get(record.uid) != "refused":
            self._actions.event(record, REASON_BLOCKED, f"{finding.describe()}; not evicted: a PodDisruptionBudget "
                                "allows no disruption now (tried again at the next look)")
            self._written[record.uid] = "refused"

    def _write(self, action: str, record: PodRecord, call: Callable[[], bool]) -> bool:
        """Run one write (or, in a dry run, log it instead); counts the result. True: done (or logged)."""
        if self._dry_run:
            log.info("dry run: would write", extra={"fields": {"action": action, "pod": record.key}})
            self.metrics.actions.labels(action, "dry_run").inc()
            return True
        ok = call()
        self.metrics.actions.labels(action, "ok" if ok else "error").inc()
        return ok
