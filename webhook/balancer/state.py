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
from webhook.kube import pods
from webhook.kube.demand import Counts, PodDemand
from webhook.kube.quantity import QuantityError, bytes_, millicores, whole_count
from webhook.kube.resources import is_gpu_resource
from webhook.names import (
    CONGESTED_TAINT_KEY,
    GPU_FREE_LABEL,
    GPU_LOAD_LABEL,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    NVIDIA_MEMORY_LABEL,
    NVIDIA_PRODUCT_LABEL,
    NVIDIA_REPLICAS_LABEL,
    SHARED_GPU_RESOURCE,
)

Obj = dict[str, Any]

HOSTNAME_LABEL = "kubernetes.io/hostname"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
OWNED_LABELS = (GPU_FREE_LABEL, GPU_LOAD_LABEL)
MIG_SINGLE_PRODUCT_MARK = "-MIG-"
"""GFD's single MIG strategy names the product ``<GPU>-MIG-<profile>``: then ``nvidia.com/gpu`` counts
MIG slices, not GPUs (gpu-operator.md, section 4.1)."""

# Every GPU resource name (``webhook.kube.resources.is_gpu_resource``) begins with one of these.
# The API server writes JSON with ``/`` unescaped and resource names lower-case, so an object
# whose bytes contain neither cannot request a GPU.
GPU_NAME_MARKERS = (b'"' + GPU_RESOURCE.encode(), b'"' + MIG_RESOURCE_PREFIX.encode())


def may_hold_gpus(raw: bytes) -> bool:
    """False when a pod's raw JSON cannot request a GPU, so it need not be decoded at all.

    A pod's container resources cannot change to or from a GPU after creation (in-place resize
    covers cpu and memory only), so a pod skipped here never matters to the balancer, in any of
    its events. True is only "maybe": the pod is then decoded and read by the real rule.
    """
    return any(marker in raw for marker in GPU_NAME_MARKERS)

@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the balancer reads from (and may rewrite on) one node."""

    name: str
    resource_version: str
    allocatable: Counts
    """GPU resources only (whole, shared, MIG); empty for a node that is not (or no longer) a GPU node."""
    owned_labels: tuple[tuple[str, str], ...]
    """The balancer's own labels as they are on the node now."""
    taints: tuple[Obj, ...]
    """All taints, since a patch of ``spec.taints`` replaces the whole list."""
    replicas: int
    """``nvidia.com/gpu.replicas`` (time-slicing): slots per physical GPU."""
    hostnames: tuple[str, ...]
    """Names DCGM exporter may report this node under (node name, ``kubernetes.io/hostname``)."""
    mig_single: bool = False
    """GFD's single MIG strategy is in force: ``nvidia.com/gpu`` counts MIG slices, not GPUs."""
    mig_replicas: tuple[tuple[str, int], ...] = ()
    """``nvidia.com/mig-<profile>.replicas`` per MIG resource (time-sliced MIG slices)."""
    product: str = ""
    """``nvidia.com/gpu.product`` (GPU Feature Discovery), for the published inventory."""
    unit_memory_mib: tuple[tuple[str, int], ...] = ()
    """Memory of one unit per GPU resource, from GFD's labels (absent when GFD does not say):
    ``nvidia.com/gpu.memory`` for whole GPUs and time-sliced shares (a share has no memory of its
    own: it may use the whole GPU's), ``nvidia.com/mig-<profile>.memory`` for a MIG slice."""
    unschedulable: bool = False
    """Cordoned (``spec.unschedulable``): its free GPUs are not offered to new pods."""
    cpu_milli: int = 0
    memory_bytes: int = 0
    """Allocatable cpu and memory: the scheduler extender's fragmentation measure weighs them."""

    @property
    def is_gpu_node(self) -> bool:
        return bool(self.allocatable)

    @property
    def has_congested_taint(self) -> bool:
        return any(t.get("key") == CONGESTED_TAINT_KEY for t in self.taints)

    def label(self, key: str) -> str | None:
        return dict(self.owned_labels).get(key)


def node_info(node: Obj) -> NodeInfo:
    """Parse a Node's JSON into the few fields the balancer uses."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    # The API server validates allocatable quantities, so an unreadable one cannot come from it.
    nvidia = tuple(sorted((k, _count(v) or 0) for k, v in allocatable.items() if is_gpu_resource(k)))
    name = meta.get("name", "")
    hostnames = tuple(dict.fromkeys(h for h in (name, labels.get(HOSTNAME_LABEL)) if h))
    # Looked up by name, never by scanning: a GFD + NFD node carries 100 to 200 labels.
    mig_replicas = set()
    for resource, _ in nvidia:
        if resource.startswith(MIG_RESOURCE_PREFIX):
            base = resource.removesuffix(".shared")
            replicas = _replicas(labels.get(base + ".replicas"))
            if replicas > 1:
                mig_replicas.add((base, replicas))
    memory = []
    for resource, _ in nvidia:
        label = (NVIDIA_MEMORY_LABEL if resource in (GPU_RESOURCE, SHARED_GPU_RESOURCE)
                 else resource.removesuffix(".shared") + ".memory")
        mib = _mebibytes(labels.get(label))
        if mib is not None:
            memory.append((resource, mib))
    return NodeInfo(
        name=name,
        resource_version=str(meta.get("resourceVersion", "")),
        allocatable=nvidia,
        owned_labels=tuple(sorted((k, str(labels[k])) for k in OWNED_LABELS if k in labels)),
        taints=tuple((node.get("spec") or {}).get("taints") or ()),
        replicas=_replicas(labels.get(NVIDIA_REPLICAS_LABEL)),
        hostnames=hostnames,
        mig_single=MIG_SINGLE_PRODUCT_MARK in str(labels.get(NVIDIA_PRODUCT_LABEL, "")),
        mig_replicas=tuple(sorted(mig_replicas)),
        product=str(labels.get(NVIDIA_PRODUCT_LABEL) or ""),
        unit_memory_mib=tuple(memory),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        cpu_milli=_amount(_cpu, allocatable.get("cpu")),
        memory_bytes=_amount(_memory, allocatable.get("memory")),
    )


_cpu = functools.lru_cache(maxsize=256)(millicores)
_memory = functools.lru_cache(maxsize=256)(bytes_)


def _amount(parse: Any, value: Any) -> int:
    """A cpu or memory quantity (0 when absent; the API server validated what it stored)."""
    if value is None:
        return 0
    try:
        return int(parse(value))
    except QuantityError:
        return 0


def _mebibytes(value: Any) -> int | None:
    """A GFD memory label (MiB, a plain integer) or None when absent or not a whole number."""
    if not isinstance(value, str) or not value.isdigit():
        return None
    return int(value)


_count = functools.lru_cache(maxsize=1024)(whole_count)
"""``whole_count`` remembered: every node repeats the same few quantities ("8", "16", "1"), and a
node event (10 to 50 KB) is decoded again each time its status or labels change."""


def _replicas(value: Any) -> int:
    """A replicas label as a count >= 1 (GFD writes 0 where sharing is off, e.g. MIG mixed)."""
    return max(_count(value if value is not None else 1) or 1, 1)


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
