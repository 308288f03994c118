"""The balancer's Prometheus metrics, on a registry of its own (never the process-global one).

A registry per Balancer keeps two instances in one test process (leader and standby) apart
and keeps library collectors out of the page.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from webhook.names import LOAD_TIERS


class Metrics:
    """Every series ``/metrics`` shows; names start with ``gpugate_balancer_``."""

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._clock = clock
        self._last_full_sync: float | None = None
        self._coalesced_seen = 0
        self._label_series(r)
        self._prometheus_series(r)
        self._inventory_series(r)
        self._extender_series(r)
        self._rebalance_series(r)

    def _label_series(self, r: CollectorRegistry) -> None:
        self.nodes = Gauge("gpugate_balancer_nodes", "GPU nodes per load tier, as last computed.",
                           ["tier"], registry=r)
        for tier in LOAD_TIERS:
            self.nodes.labels(tier)
        self.label_writes = Counter("gpugate_balancer_label_writes",
                                    "Node patches the balancer sent (result=ok|conflict|error|throttled, the "
                                    "last for a 429) or would have sent (result=dry_run).", ["result"], registry=r)
        self.pending_writes = Gauge("gpugate_balancer_pending_writes",
                                    "Nodes whose wanted marks wait for their write interval, a token or a writer.",
                                    registry=r)
        self.coalesced = Counter("gpugate_balancer_coalesced_writes",
                                 "Wanted marks that replaced a node's pending ones instead of costing a patch.",
                                 registry=r)
        self.api_errors = Counter("gpugate_balancer_api_errors",
                                  "Kubernetes API calls that failed, by operation.", ["operation"], registry=r)
        self.watch_events = Counter("gpugate_balancer_watch_events", "Watch events handled.", ["resource"],
                                    registry=r)
        self.relists = Counter("gpugate_balancer_relists", "Relists after an expired watch (410 Gone).",
                               ["resource"], registry=r)
        self.leader = Gauge("gpugate_balancer_leader", "1 while this replica holds the lease and writes.",
                            registry=r)
        self.last_full_sync = Gauge("gpugate_balancer_last_full_sync_timestamp_seconds",
                                    "Unix time of the last pass over every node.", registry=r)
        since = Gauge("gpugate_balancer_seconds_since_last_full_sync",
                      "Seconds since the last pass over every node (-1 before the first).", registry=r)
        since.set_function(self.seconds_since_full_sync)


    def _prometheus_series(self, r: CollectorRegistry) -> None:
        self.prometheus_last_success = Gauge(
            "gpugate_balancer_prometheus_last_success_timestamp_seconds",
            "Unix time of the last DCGM query that succeeded (0 before the first): how fresh the utilization "
            "behind the tiers is.", registry=r)
        self.prometheus_up = Gauge("gpugate_balancer_prometheus_up",
                                   "1 when the last DCGM query succeeded, 0 when it failed, -1 when no "
                                   "Prometheus is configured.", registry=r)
        self.allocation_only = Gauge("gpugate_balancer_allocation_only",
                                     "1 while tiers come from allocation alone (no usable utilization).",
                                     registry=r)
        self.prometheus_up.set(-1)
        self.allocation_only.set(1)

    def _inventory_series(self, r: CollectorRegistry) -> None:
        self.inventory_writes = Counter("gpugate_balancer_inventory_writes",
                                        "Writes of the gpugate-inventory ConfigMap (result=ok|error).", ["result"],
                                        registry=r)
        self.inventory_last_write = Gauge("gpugate_balancer_inventory_last_write_timestamp_seconds",
                                          "Unix time of the last GPUInventory this replica wrote (0 before the "
                                          "first): the webhook ignores one older than maxInventoryAgeSeconds.",
                                          registry=r)

    def _extender_series(self, r: CollectorRegistry) -> None:
        self.extender_requests = Counter(
            "gpugate_balancer_extender_requests",
            "kube-scheduler extender calls answered, by verb and result (ok|bad_request|not_ready|error|not_found). "
            "Any answer but ok costs the pod the extender's score, never its scheduling.", ["verb", "result"],
            registry=r)
        self.extender_requests.labels("prioritize", "ok")
        self.extender_duration = Histogram(
            "gpugate_balancer_extender_request_duration_seconds",
            "Time to answer an extender call that succeeded, from the body read to the answer built.", ["verb"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0), registry=r)
        self.extender_serving = Gauge(
            "gpugate_balancer_extender_serving",
            "1 while this replica serves the scheduler extender, 0 when it cannot (no valid certificate, the "
            "port taken), -1 when not configured. A replica that is gone shows in up{} instead.", registry=r)
        self.extender_serving.set(-1)
        self.extender_assumed = Gauge(
            "gpugate_balancer_extender_assumed_pods",
            "Pods the extender scored and assumed on their best node, not yet seen bound by the watch.",
            registry=r)

    def _rebalance_series(self, r: CollectorRegistry) -> None:
        self.rebalance_moves = Counter(
            "gpugate_balancer_rebalance_evictions",
            "Pods the rebalancer evicted to make room for a waiting GPU pod (result=evicted), or would have "
            "(result=dry_run).", ["result"], registry=r)
        self.rebalance_refusals = Counter(
            "gpugate_balancer_rebalance_refusals",
            "Moves given up, by reason: pdb (an eviction refused by a PodDisruptionBudget), gone (a pod no "
            "longer there), error (any other answer), mark (the node could not be marked).", ["reason"], registry=r)
        self.rebalance_waiting = Gauge(
            "gpugate_balancer_rebalance_waiting_gpus",
            "GPUs asked by the pods kube-scheduler left unschedulable for lack of GPUs (pending GPU demand).",
            registry=r)
        self.rebalance_budget = Gauge(
            "gpugate_balancer_rebalance_budget",
            "Evictions the hourly budget allowed at the last round.", registry=r)
        self.rebalance_marks = Gauge(
            "gpugate_balancer_rebalance_marks",
            "Nodes carrying the rebalancer's NoSchedule mark (the nodes a move emptied).", registry=r)
        for result in ("evicted", "dry_run"):
            self.rebalance_moves.labels(result)
        for reason in ("pdb", "gone", "error", "mark"):
            self.rebalance_refusals.labels(reason)

    def set_coalesced(self, total: int) -> None:
        """Advance the counter to ``total`` (the schedule keeps the running count)."""
        if total > self._coalesced_seen:
            self.coalesced.inc(total - self._coalesced_seen)
            self._coalesced_seen = total

    def prometheus_succeeded(self) -> None:
        self.prometheus_last_success.set(self._clock())

    def full_sync_done(self) -> None:
        self._last_full_sync = self._clock()
        self.last_full_sync.set(self._last_full_sync)

    def seconds_since_full_sync(self) -> float:
        return -1.0 if self._last_full_sync is None else self._clock() - self._last_full_sync
