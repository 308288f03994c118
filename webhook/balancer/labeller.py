"""The node-labels consumer of the watches: GPU accounting, tiers, and which node to write when.

It keeps what the labels are computed from (``state.NodeLedger``, the DRA counts, DCGM
utilization) under one lock of its own, turns dirty nodes into wanted marks in :meth:`reconcile`
and hands the nodes whose write is due to ``labelwrites.LabelWriters``. Hysteresis needs the
previous tier: that is the node's own ``gpugate.io/gpu-load`` label, so a new leader continues
exactly where the old one stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from webhook.balancer.backoff import WriteSchedule
from webhook.balancer.metrics import Metrics
from webhook.balancer.settings import BalancerSettings
from webhook.balancer.state import NodeLedger, PodUsage
from webhook.kube.gpunode import NodeInfo
from webhook.kube.nodedevices import NodeDevices
from webhook.names import LOAD_TIERS
from webhook.placement import dracount
from webhook.placement import marks as marks_mod

log = logging.getLogger("gpugate.balancer")


class Labeller:
    """What the node labels are computed from, and the decisions; every method is thread-safe."""

    def __init__(self, settings: BalancerSettings, metrics: Metrics, *, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.metrics = metrics
        self.ledger = NodeLedger()
        self.dra_cache = dracount.DraCache()
        self.schedule: WriteSchedule[marks_mod.Marks] = WriteSchedule(settings.write_interval)
        self.lock = threading.Lock()
        """Guards the ledger, the DRA counts, the schedule, the tiers and the utilization."""
        self.wake = threading.Event()
        """Set when something may need a pass or a write: the loop waits on it."""
        self._clock = clock
        self._tiers: dict[str, str] = {}
        self._tier_counts: Counter[str] = Counter()
        self._util: dict[str, float] = {}
        self._util_at: float | None = None
        self._util_usable = False
        self._dry_logged: dict[str, str] = {}
        self._held_back: dict[str, int] = {}
        """GPUs of a node the health quarantine keeps out of ``gpu-free`` (``quarantineplan.Plan.held_back``)."""
        # Children of labelled series, looked up once: labels() costs more than the event it counts.
        self._tier_gauges = {tier: metrics.nodes.labels(tier) for tier in LOAD_TIERS}

    # ---- the watches' changes (informer threads) -------------------------------------------------
    def replace_nodes(self, infos: dict[str, NodeInfo]) -> None:
        with self.lock:
            self.ledger.replace_nodes(infos)
            for name in [k for k in self._tiers if k not in infos]:
                self._set_tier(name, None)
            for name in list(self.schedule.wanted):
                if name not in infos:
                    self.schedule.forget(name)
        self.wake.set()

    def node(self, name: str, info: NodeInfo | None) -> None:
        with self.lock:
            if info is None:
                self.ledger.delete_node(name)
                self._set_tier(name, None)
                self._dry_logged.pop(name, None)
                self.schedule.forget(name)
            else:
                self.ledger.set_node(info)
        self.wake.set()

    def replace_pods(self, held: dict[str, PodUsage]) -> None:
        with self.lock:
            self.ledger.replace_pods(held)
        self.wake.set()

    def pod(self, key: str, usage: PodUsage | None) -> bool:
        """Record one pod; True when a node's labels may change (then the loop is woken)."""
        with self.lock:
            self.ledger.set_pod(key, usage)
            changed = bool(self.ledger.dirty)
        if changed:
            self.wake.set()
        return changed

    def dra(self, change: Callable[[dracount.DraCache], set[str]]) -> dict[str, NodeDevices | None]:
        """Apply one slice or claim change; returns the devices of the nodes it changed."""
        with self.lock:
            changed = change(self.dra_cache)
            self.ledger.dirty |= changed & set(self.ledger.nodes)
            devices = {name: self.dra_cache.node(name) for name in changed}
        if changed:
            self.wake.set()
        return devices

    def utilization(self, by_host: dict[str, float] | None, now: float) -> bool:
        """A DCGM poll's result (None: it failed); returns whether utilization is usable now."""
        stale_after = self.settings.prometheus.stale_after
        with self.lock:
            changed = False
            if by_host is not None:
                changed = by_host != self._util
                self._util, self._util_at = by_host, now
            usable = self._util_at is not None and now - self._util_at <= stale_after
            changed = changed or usable != self._util_usable
            self._util_usable = usable
            if changed:
                self.ledger.mark_all()
        if changed:
            self.wake.set()
        return usable

    def hold_back(self, counts: dict[str, int]) -> None:
        """Quarantined GPUs per node that ``gpu-free`` must not offer; nodes whose count changed get a pass."""
        with self.lock:
            changed = {n for n in set(counts) | set(self._held_back) if counts.get(n) != self._held_back.get(n)}
            self._held_back = dict(counts)
            self.ledger.dirty |= changed & set(self.ledger.nodes)
        if changed:
            self.wake.set()

    # ---- reading ---------------------------------------------------------------------------------
    def snapshot(self) -> tuple[list[NodeInfo], dict[str, dict[str, int]], dict[str, NodeDevices]]:
        """Nodes, per-node requested sums and DRA devices, copied under the lock (for the inventory)."""
        with self.lock:
            nodes = list(self.ledger.nodes.values())
            requested = {name: dict(sums) for name, sums in self.ledger.requested.items()}
            dra = dict(self.dra_cache.nodes)
        return nodes, requested, dra

    def tiers(self) -> dict[str, str]:
        with self.lock:
            return dict(self._tiers)

    def pending(self) -> int:
        with self.lock:
            return self.schedule.pending()

    def allocation_only(self) -> bool:
        return not self._util_usable

    def next_write_at(self) -> float | None:
        with self.lock:
            return self.schedule.next_at()

    # ---- deciding (the loop) --------------------------------------------------------------------
    def reconcile(self, *, full: bool) -> None:
        """Decide the marks of the dirty nodes (all nodes if ``full``) and schedule what must change."""
        s = self.settings
        logged: list[tuple[NodeInfo, marks_mod.Marks, dict[str, Any]]] = []
        with self.lock:
            if full:
                self.ledger.mark_all()
            for name in self.ledger.take_dirty():
                node = self.ledger.nodes.get(name)
                if node is None:
                    continue
                want = marks_mod.desired(node, self._load(node), thresholds=s.tiers, taint_congested=s.taint_congested)
                self._set_tier(name, want.load)
                patch = marks_mod.node_patch(node, want)
                if patch is None:
                    self.schedule.drop(name)
                elif s.dry_run:
                    logged.append((node, want, patch))
                else:
                    self.schedule.want(name, want, urgent=marks_mod.urgent(node, want))
            counts = dict(self._tier_counts)
            pending, coalesced = self.schedule.pending(), self.schedule.coalesced
        for tier, gauge in self._tier_gauges.items():
            gauge.set(counts.get(tier, 0))
        self.metrics.pending_writes.set(pending)
        self.metrics.set_coalesced(coalesced)
        for node, want, patch in logged:
            self._log_dry_run(node, want, patch)

    def _load(self, node: NodeInfo) -> marks_mod.NodeLoad | None:
        """The node's GPU load (lock held); None for a node with no GPUs, plugin- or DRA-served."""
        devices = self.dra_cache.node(node.name)
        if not dracount.is_gpu_node(node, devices):
            return None
        load = dracount.node_load(node, self.ledger.requested.get(node.name, {}), self._utilization(node), devices)
        held_back = self._held_back.get(node.name, 0)
        return dataclasses.replace(load, free_gpus=max(load.free_gpus - held_back, 0)) if held_back else load

    def _log_dry_run(self, node: NodeInfo, want: marks_mod.Marks, patch: dict[str, Any]) -> None:
        text = json.dumps(patch, sort_keys=True)
        if self._dry_logged.get(node.name) != text:
            self._dry_logged[node.name] = text
            self.metrics.label_writes.labels("dry_run").inc()
            log.info("dry run: would patch node", extra={"fields": {
                "node": node.name, "changes": marks_mod.describe(node, want), "patch": patch}})

    def _set_tier(self, name: str, tier: str | None) -> None:
        """Record a node's tier (None: not a GPU node) and keep the per-tier counts (lock held)."""
        old = self._tiers.pop(name, None) if tier is None else self._tiers.get(name)
        if old == tier:
            return
        if old is not None:
            self._tier_counts[old] -= 1
        if tier is not None:
            self._tiers[name] = tier
            self._tier_counts[tier] += 1

    def _utilization(self, node: NodeInfo) -> float | None:
        if not self._util_usable:
            return None
        for host in node.hostnames:
            if host in self._util:
                return self._util[host]
        return None
