"""Per-node GPU accounting kept from the node and pod watches (pure: no I/O, no clock).

Only what the balancer needs survives parsing: for a node its NVIDIA allocatable counts, the
labels and taints it may have to rewrite; for a pod the node it is bound to and its NVIDIA
requests. 150,000 pods therefore cost a few small tuples each, not their whole JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from webhook.names import (
    CONGESTED_TAINT_KEY,
    GPU_FREE_LABEL,
    GPU_LOAD_LABEL,
    NVIDIA_REPLICAS_LABEL,
    NVIDIA_RESOURCE_PREFIX,
)

Obj = dict[str, Any]
Counts = tuple[tuple[str, int], ...]  # (resource, count) sorted by resource

HOSTNAME_LABEL = "kubernetes.io/hostname"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
OWNED_LABELS = (GPU_FREE_LABEL, GPU_LOAD_LABEL)

_SUFFIX = {"m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def parse_count(value: Any) -> int:
    """An extended-resource quantity as an integer count (``"8"``, ``8``, ``"1k"``); 0 if unreadable.

    Device-plugin resources are whole numbers; a quantity we cannot read counts as none rather
    than stopping the whole node's accounting.
    """
    if isinstance(value, int):
        return max(value, 0)
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return 0
    number, suffix = match.groups()
    try:
        amount = Decimal(number) * _SUFFIX.get(suffix, 1 if not suffix else 0)
    except InvalidOperation:
        return 0
    return max(int(amount), 0)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the balancer reads from (and may rewrite on) one node."""

    name: str
    resource_version: str
    allocatable: Counts
    """NVIDIA resources only; empty for a node that is not (or no longer) a GPU node."""
    owned_labels: tuple[tuple[str, str], ...]
    """The balancer's own labels as they are on the node now."""
    taints: tuple[Obj, ...]
    """All taints, since a patch of ``spec.taints`` replaces the whole list."""
    replicas: int
    """``nvidia.com/gpu.replicas`` (time-slicing): slots per physical GPU."""
    hostnames: tuple[str, ...]
    """Names DCGM exporter may report this node under (node name, ``kubernetes.io/hostname``)."""

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
    nvidia = tuple(sorted((k, parse_count(v)) for k, v in allocatable.items()
                          if k.startswith(NVIDIA_RESOURCE_PREFIX)))
    name = meta.get("name", "")
    hostnames = tuple(dict.fromkeys(h for h in (name, labels.get(HOSTNAME_LABEL)) if h))
    return NodeInfo(
        name=name,
        resource_version=str(meta.get("resourceVersion", "")),
        allocatable=nvidia,
        owned_labels=tuple(sorted((k, str(labels[k])) for k in OWNED_LABELS if k in labels)),
        taints=tuple((node.get("spec") or {}).get("taints") or ()),
        replicas=max(parse_count(labels.get(NVIDIA_REPLICAS_LABEL, 1)), 1),
        hostnames=hostnames,
    )


@dataclass(frozen=True, slots=True)
class PodUsage:
    """The NVIDIA devices one bound, non-terminal pod holds on its node."""

    node: str
    requests: Counts


def _container_requests(container: Obj) -> dict[str, int]:
    resources = container.get("resources") or {}
    # Extended resources may be given as limits only; the request then defaults to the limit.
    merged = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    return {k: parse_count(v) for k, v in merged.items() if k.startswith(NVIDIA_RESOURCE_PREFIX)}


def _add(into: dict[str, int], more: dict[str, int]) -> None:
    for key, value in more.items():
        into[key] = into.get(key, 0) + value


def pod_requests(pod: Obj) -> dict[str, int]:
    """The pod's effective NVIDIA requests, as the scheduler computes them.

    Regular containers and sidecars (init containers with ``restartPolicy: Always``) run
    together and add up; each plain init container runs alone (after the sidecars before it),
    so the pod needs the larger of the two.
    """
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for container in spec.get("containers") or ():
        _add(total, _container_requests(container))
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for container in spec.get("initContainers") or ():
        own = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, own)
            continue
        for key in set(own) | set(sidecars):
            peak[key] = max(peak.get(key, 0), own.get(key, 0) + sidecars.get(key, 0))
    _add(total, sidecars)
    for key, value in peak.items():
        total[key] = max(total.get(key, 0), value)
    return {k: v for k, v in total.items() if v > 0}


def pod_usage(pod: Obj) -> PodUsage | None:
    """What the pod holds, or None when it holds nothing (unbound, finished, or no NVIDIA request)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return None
    requests = pod_requests(pod)
    if not requests:
        return None
    return PodUsage(node=node, requests=tuple(sorted(requests.items())))


def pod_key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


@dataclass
class ClusterState:
    """Nodes, the pods that hold NVIDIA devices, per-node sums, and which nodes need a look.

    Not thread-safe by itself: the controller holds one lock around every call.
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
    return (old.allocatable, old.owned_labels, old.taints, old.replicas, old.hostnames) != \
        (new.allocatable, new.owned_labels, new.taints, new.replicas, new.hostnames)
