"""Per-node GPU accounting kept from the node and pod watches (pure: no I/O, no clock).

Only what the balancer needs survives parsing: for a node its NVIDIA allocatable counts, the
labels and taints it may have to rewrite; for a pod the node it is bound to and its NVIDIA
requests. 150,000 pods therefore cost a few small tuples each, not their whole JSON.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from webhook.kube import demand as kube_demand
from webhook.kube import pods, units
from webhook.kube.demand import Counts, PodDemand
from webhook.kube.gpunode import NodeInfo
from webhook.kube.quantity import QuantityError

Obj = dict[str, Any]

TERMINAL_PHASES = pods.TERMINAL_PHASES


@functools.lru_cache(maxsize=8)
def name_markers(kinds: tuple[units.GpuKind, ...]) -> tuple[bytes, ...]:
    """Every GPU resource name begins with one of ``units.name_prefixes()``. The API server writes
    JSON with ``/`` unescaped and resource names lower-case, so an object whose bytes contain none of
    these (a quote, then a prefix) cannot request a GPU. Kept per table of kinds (``kinds`` is the
    key), since it is read on every pod event."""
    return tuple(b'"' + prefix.encode() for prefix in units.name_prefixes())


def may_hold_gpus(raw: bytes) -> bool:
    """False when a pod's raw JSON cannot request a GPU, so it need not be decoded at all.

    A pod's container resources cannot change to or from a GPU after creation (in-place resize
    covers cpu and memory only), so a pod skipped here never matters to the balancer, in any of
    its events. True is only "maybe": the pod is then decoded and read by the real rule.
    """
    return any(marker in raw for marker in name_markers(units.KINDS))

@dataclass(frozen=True, slots=True)
class PodUsage:
    """A bound, non-terminal pod that holds NVIDIA devices: its node and what it asks (the vocabulary's
    ``kube.demand.PodDemand``)."""

    node: str
    demand: PodDemand

    @property
    def requests(self) -> Counts:
        """The devices a device plugin holds for it: its GPU requests less those a DRA claim serves
        (extended-resource mapping), which the claim counts (``PodDemand.device_plugin_counts``)."""
        return self.demand.device_plugin_counts()


def pod_usage(pod: Obj, demand: PodDemand | None = None) -> PodUsage | None:
    """What the pod holds, or None when it holds nothing (unbound, finished, or no NVIDIA request).

    ``demand``: the pod's demand when the caller has read it already. A quantity the API server
    would have refused (it cannot be stored) counts as nothing.
    """
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return None
    if demand is None:
        if not pods.requested_gpu_resources(pod):
            return None  # most pods: no quantity to read
        try:
            demand = kube_demand.of_pod(pod)
        except QuantityError:
            return None
    if not demand.device_plugin_counts():
        return None
    return PodUsage(node=node, demand=demand)


def pod_key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


@dataclass
class NodeLedger:
    """Nodes, the pods that hold NVIDIA devices, per-node sums, and which nodes need a look.

    (Named apart from the replay's ``ClusterState``, a simulated cluster.) Not thread-safe by
    itself: ``labeller.Labeller`` holds its lock around every call.
    """

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    pods: dict[str, PodUsage] = field(default_factory=dict)
    requested: dict[str, dict[str, int]] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)

    # ---- nodes ----------------------------------------------------------------------------
    def set_node(self, info: NodeInfo) -> None:
        old = self.nodes.get(info.name)
        self.nodes[info.name] = info
        if old is None or _differs(old, info):
            self.dirty.add(info.name)

    def delete_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.dirty.discard(name)

    def replace_nodes(self, infos: dict[str, NodeInfo]) -> None:
        self.nodes = dict(infos)
        self.dirty = set(self.nodes)

    # ---- pods -----------------------------------------------------------------------------
    def set_pod(self, key: str, usage: PodUsage | None) -> None:
        old = self.pods.get(key)
        if old == usage:
            return
        if old is not None:
            self._account(old, -1)
            del self.pods[key]
        if usage is not None:
            self._account(usage, +1)
            self.pods[key] = usage

    def replace_pods(self, usages: dict[str, PodUsage]) -> None:
        before = set(self.requested)
        self.pods = dict(usages)
        self.requested = {}
        for usage in self.pods.values():
            self._account(usage, +1, mark=False)
        self.dirty |= before | set(self.requested)

    def _account(self, usage: PodUsage, sign: int, *, mark: bool = True) -> None:
        sums = self.requested.setdefault(usage.node, {})
        for resource, count in usage.requests:
            left = sums.get(resource, 0) + sign * count
            if left:
                sums[resource] = left
            else:
                sums.pop(resource, None)
        if not sums:
            del self.requested[usage.node]
        if mark:
            self.dirty.add(usage.node)

    # ---- work list ------------------------------------------------------------------------
    def take_dirty(self) -> list[str]:
        names = sorted(self.dirty)
        self.dirty = set()
        return names

    def mark_all(self) -> None:
        self.dirty = set(self.nodes)


def _differs(old: NodeInfo, new: NodeInfo) -> bool:
    return (old.allocatable, old.owned_labels, old.taints, old.replicas, old.hostnames, old.mig_single,
            old.mig_replicas) != (new.allocatable, new.owned_labels, new.taints, new.replicas, new.hostnames,
                                  new.mig_single, new.mig_replicas)
