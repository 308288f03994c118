"""The accounting consumer of the watches: GPU pods with their owners, and the series that export them.

A pod informer of its own (``usage.enabled`` only): the labels' pod informer keeps a pod's node
and device-plugin requests and skips pods that hold GPUs only through DRA claims; accounting
needs those too, and each pod's owner, labels and start (``usage.workloads.PodRecord``). Its
prefilter admits a pod whose raw JSON names a GPU resource or ``spec.resourceClaims``, so most
CPU pods are never decoded.

The series (a ``prometheus_client`` collector, computed when scraped, never stored):

- ``gpugate_balancer_gpu_allocated``: physical GPUs each pod holds on its node, by unit kind;
- ``gpugate_balancer_gpu_physical``: physical GPUs of each GPU node;
- the idle findings the leader's last look found (``idlereclaim.IdleReclaimer`` sets them).

Nothing is exported until the node, pod, DRA and usage caches hold a full list: a replica that
exported a partial view would lower the cluster's allocated GPU-hours, and the rules take the
``max`` over replicas precisely because every replica exports the same full view.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from webhook import durations
from webhook.balancer.cluster import Informer
from webhook.balancer.labeller import Labeller
from webhook.balancer.state import may_hold_gpus
from webhook.kube.claims import may_reference_claims
from webhook.usage import accounting, idle, promql
from webhook.usage.workloads import PodRecord, record_key, record_of


def may_hold_devices(raw: bytes) -> bool:
    """False when a pod's raw JSON can neither request a GPU nor reference a DRA claim."""
    return may_hold_gpus(raw) or may_reference_claims(raw)


class UsagePods:
    """The GPU pods' records, kept by an informer of their own; every method is thread-safe."""

    def __init__(self, list_call: Callable[..., Any], *, informer_args: dict[str, Any], field_selector: str) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, PodRecord] = {}
        self.informer = Informer[PodRecord | None](
            name="usage-pods", list_call=list_call, reduce=lambda obj: (record_key(obj), record_of(obj)),
            on_replace=self._replace, on_event=self._event, prefilter=may_hold_devices,
            field_selector=field_selector, **informer_args)

    @property
    def synced(self) -> bool:
        return self.informer.synced.is_set()

    def _replace(self, found: dict[str, PodRecord | None]) -> None:
        with self._lock:
            self._records = {k: v for k, v in found.items() if v is not None}

    def _event(self, etype: str, key: str, record: PodRecord | None) -> None:
        with self._lock:
            if record is None:
                self._records.pop(key, None)
            else:
                self._records[key] = record

    def records(self) -> list[PodRecord]:
        with self._lock:
            return list(self._records.values())


class UsageSource(Collector):
    """What accounting reads, and the series it exports (see the module docstring)."""

    def __init__(self, labeller: Labeller, pods: UsagePods, *, ready: Callable[[], bool]) -> None:
        self._labeller = labeller
        self.pods = pods
        self._ready = ready
        self._lock = threading.Lock()
        self._decisions: list[idle.Decision] = []

    def snapshot(self) -> accounting.Snapshot | None:
        """The holdings and physical GPUs now; None until every cache holds a full list."""
        if not (self._ready() and self.pods.synced):
            return None
        records = self.pods.records()
        with self._labeller.lock:
            nodes = dict(self._labeller.ledger.nodes)
            devices = dict(self._labeller.dra_cache.nodes)
            claims = list(self._labeller.dra_cache.resource_claims.values())
        return accounting.snapshot(records, nodes, devices, claims)

    def set_decisions(self, decisions: list[idle.Decision]) -> None:
        """The leader's last look (empty: none, or it could not look)."""
        with self._lock:
            self._decisions = list(decisions)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.snapshot()
        allocated = GaugeMetricFamily(promql.ALLOCATED_METRIC, "Physical GPUs a pod holds on its node, by unit kind "
                                      "(whole, mig, slot, share), from webhook/kube/units.py.",
                                      labels=list(promql.HOLDING_LABELS))
        physical = GaugeMetricFamily(promql.PHYSICAL_METRIC, "Physical GPUs of a GPU node.", labels=["node"])
        if snap is not None:
            for h in snap.holdings:
                allocated.add_metric([h.node, h.namespace, h.pod, h.owner.kind, h.owner.name, h.kind], h.gpus)
            for node, gpus in snap.physical:
                physical.add_metric([node], gpus)
        yield allocated
        yield physical
        yield from self._findings()

    def _findings(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            decisions = list(self._decisions)
        owner_labels = list(promql.OWNER_LABELS)
        pods = GaugeMetricFamily(promql.IDLE_PODS_METRIC, "Pods whose GPUs stayed idle, by namespace and owner "
                                 "(the leader's last look).", labels=owner_labels)
        gpus = GaugeMetricFamily(promql.IDLE_GPUS_METRIC, "Physical GPUs held by idle pods, by namespace and owner.",
                                 labels=owner_labels)
        owners = idle.by_owner(d.finding for d in decisions)
        for namespace, owner in sorted(owners, key=lambda key: (key[0], key[1].kind, key[1].name)):
            count, held = owners[(namespace, owner)]
            pods.add_metric([namespace, owner.kind, owner.name], count)
            gpus.add_metric([namespace, owner.kind, owner.name], held)
        finding = GaugeMetricFamily("gpugate_balancer_idle_finding", "One idle pod: the GPUs it holds, labelled with "
                                    "the rule's window, its policy and the action decided.",
                                    labels=["pod_namespace", "pod_name", "owner_kind", "owner_name", "policy",
                                            "action", "after"])
        activity = GaugeMetricFamily("gpugate_balancer_idle_activity", "An idle pod's DCGM activity over its window "
                                     "(stat=mean|max, 0..1).", labels=["pod_namespace", "pod_name", "stat"])
        for d in decisions:
            f, r = d.finding, d.finding.record
            finding.add_metric([r.namespace, r.name, r.owner.kind, r.owner.name, f.rule.policy, d.action,
                                durations.text(f.rule.rules.after_seconds)], f.gpus)
            activity.add_metric([r.namespace, r.name, "mean"], f.measured.mean)
            activity.add_metric([r.namespace, r.name, "max"], f.measured.highest)
        yield from (pods, gpus, finding, activity)
