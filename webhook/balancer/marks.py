"""What the balancer wants on a node, and the one patch that gets it there (pure).

"Marks" are the two labels and the optional taint the balancer owns. Everything else on the
node (other labels, other taints, their order) is carried through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.balancer import tiers
from webhook.balancer.state import NodeInfo
from webhook.names import CONGESTED_TAINT_KEY, GPU_FREE_LABEL, GPU_LOAD_LABEL, GPU_RESOURCE, SHARED_GPU_RESOURCE

CONGESTED_TAINT: dict[str, str] = {"key": CONGESTED_TAINT_KEY, "effect": "PreferNoSchedule"}


@dataclass(frozen=True, slots=True)
class Marks:
    """The balancer's desired labels (None: absent) and whether its taint should be there."""

    free: str | None
    load: str | None
    tainted: bool


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """A GPU node's numbers: the label value, the allocation share and utilization."""

    free_gpus: int
    allocated: float
    utilization: float | None


def node_load(node: NodeInfo, requested: dict[str, int], utilization: float | None) -> NodeLoad:
    """Whole free GPUs and the requested share of all NVIDIA slots on ``node``.

    ``gpu-free`` counts what a whole-GPU pod can still get: ``nvidia.com/gpu`` (or, under
    time-slicing with renamed resources, ``nvidia.com/gpu.shared``) minus requests, divided by
    the replicas per GPU. MIG slices are not whole GPUs and do not count there, but they do
    count in the allocation share, which sums every NVIDIA resource.
    """
    allocatable = dict(node.allocatable)
    resource = GPU_RESOURCE if GPU_RESOURCE in allocatable else SHARED_GPU_RESOURCE
    free_slots = max(allocatable.get(resource, 0) - requested.get(resource, 0), 0)
    total = sum(allocatable.values())
    used = sum(min(requested.get(r, 0), n) for r, n in allocatable.items())
    allocated = used / total if total else 1.0  # a GPU node offering nothing has nothing free
    return NodeLoad(free_gpus=free_slots // node.replicas, allocated=allocated, utilization=utilization)


def desired(node: NodeInfo, load: NodeLoad | None, *, thresholds: tiers.TierThresholds,
            taint_congested: bool) -> Marks:
    """The marks ``node`` should carry; ``load`` None means it is not a GPU node (remove ours)."""
    if load is None or not node.is_gpu_node:
        return Marks(free=None, load=None, tainted=False)
    tier = tiers.tier(allocated=load.allocated, utilization=load.utilization,
                      previous=node.label(GPU_LOAD_LABEL), thresholds=thresholds)
    return Marks(free=str(load.free_gpus), load=tier, tainted=taint_congested and tier == tiers.CONGESTED)


def node_patch(node: NodeInfo, marks: Marks) -> dict[str, Any] | None:
    """One strategic-merge patch body that brings ``node`` to ``marks``, or None if it is there.

    Labels merge key by key (``null`` deletes). ``spec.taints`` has no merge key, so the patch
    carries the whole list: every taint we do not own, in its order, plus ours if wanted. It
    then also carries the node's ``resourceVersion``, so a taint someone else added since our
    last read makes the apiserver answer 409 instead of being silently dropped.
    """
    labels: dict[str, str | None] = {}
    for key, want in ((GPU_FREE_LABEL, marks.free), (GPU_LOAD_LABEL, marks.load)):
        if node.label(key) != want:
            labels[key] = want
    patch: dict[str, Any] = {}
    if labels:
        patch["metadata"] = {"labels": labels}
    if node.has_congested_taint != marks.tainted or _duplicated(node):
        others = [t for t in node.taints if t.get("key") != CONGESTED_TAINT_KEY]
        patch.setdefault("metadata", {})["resourceVersion"] = node.resource_version
        patch["spec"] = {"taints": others + ([dict(CONGESTED_TAINT)] if marks.tainted else [])}
    return patch or None


def _duplicated(node: NodeInfo) -> bool:
    return sum(1 for t in node.taints if t.get("key") == CONGESTED_TAINT_KEY) > 1


def describe(node: NodeInfo, marks: Marks) -> dict[str, Any]:
    """The change as a log-friendly dict: ``{"gpu-free": ["8", "6"], ...}``."""
    changes: dict[str, Any] = {}
    for key, want in ((GPU_FREE_LABEL, marks.free), (GPU_LOAD_LABEL, marks.load)):
        if node.label(key) != want:
            changes[key] = [node.label(key), want]
    if node.has_congested_taint != marks.tainted:
        changes[CONGESTED_TAINT_KEY] = [node.has_congested_taint, marks.tainted]
    return changes
