"""A GPU node as the balancer reads it, and as the replay models it (pure: no I/O, no clock).

Only what is needed survives parsing a Node: its NVIDIA allocatable counts, the labels and taints
the balancer may have to rewrite, GFD's product and memory labels, cpu and memory. The balancer
keeps one per node from its watch; the replay builds them for its modelled nodes, so both decide
labels and offers from the same value (``placement.marks``, ``placement.gpuinventory``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from webhook.kube import units
from webhook.kube.demand import Counts
from webhook.kube.quantity import QuantityError, bytes_, millicores, whole_count
from webhook.kube.units import is_gpu_resource
from webhook.names import (
    CONGESTED_TAINT_KEY,
    GPU_FREE_LABEL,
    GPU_LOAD_LABEL,
    GPU_RESOURCE,
    NVIDIA_COUNT_LABEL,
    NVIDIA_MEMORY_LABEL,
    NVIDIA_PRODUCT_LABEL,
    NVIDIA_REPLICAS_LABEL,
)

Obj = dict[str, Any]

HOSTNAME_LABEL = "kubernetes.io/hostname"
OWNED_LABELS = (GPU_FREE_LABEL, GPU_LOAD_LABEL)
MIG_SINGLE_PRODUCT_MARK = "-MIG-"
"""GFD's single MIG strategy names the product ``<GPU>-MIG-<profile>``: then ``nvidia.com/gpu`` counts
MIG slices, not GPUs (gpu-operator.md, section 4.1)."""


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
    gpu_count: int = 0
    """``nvidia.com/gpu.count`` (GFD): the node's physical GPUs, whatever MIG or time-slicing offers; 0: unknown."""
    cpu_milli: int = 0
    memory_bytes: int = 0
    """Allocatable cpu and memory: the scheduler extender's fragmentation measure weighs them."""
    unhealthy_gpus: int = 0
    """``nvidia.com/gpu`` in capacity but not allocatable: devices the device plugin reports unhealthy
    (the kubelet's device manager keeps them in capacity and leaves them out of allocatable)."""

    @property
    def is_gpu_node(self) -> bool:
        return bool(self.allocatable)

    @property
    def plugin_gpus(self) -> int:
        """Allocatable of the device plugin's whole-GPU resource (``units.GpuKind.plugin_gpu``)."""
        return sum(count for resource, count in self.allocatable if units.is_plugin_gpu(resource))

    @property
    def slots(self) -> int | None:
        """Allocatable time-sliced slots under their renamed resource; None when the node has none."""
        found = [count for resource, count in self.allocatable if units.is_shared(resource)]
        return sum(found) if found else None

    @property
    def by_name(self) -> Counts:
        """The GPU resources counted under their own names (MIG slices): ``units.by_name``."""
        return tuple((resource, count) for resource, count in self.allocatable if units.by_name(resource))

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
        if units.is_mig(resource):
            base = resource.removesuffix(".shared")
            replicas = _replicas(labels.get(base + ".replicas"))
            if replicas > 1:
                mig_replicas.add((base, replicas))
    memory = []
    for resource, _ in nvidia:
        label = (NVIDIA_MEMORY_LABEL if not units.is_mig(resource)
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
        gpu_count=_count(labels.get(NVIDIA_COUNT_LABEL)) or 0,
        cpu_milli=_amount(_cpu, allocatable.get("cpu")),
        memory_bytes=_amount(_memory, allocatable.get("memory")),
        unhealthy_gpus=max((_count(((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE, "0")) or 0)
                           - dict(nvidia).get(GPU_RESOURCE, 0), 0),
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
