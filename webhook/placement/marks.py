"""What the balancer wants on a node, and the one patch that gets it there (pure).

"Marks" are the two labels and the optional taint the balancer owns. Everything else on the
node (other labels, other taints, their order) is carried through untouched.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from webhook.kube import units
from webhook.kube.gpunode import NodeInfo
from webhook.names import CONGESTED_TAINT_KEY, GPU_FREE_LABEL, GPU_LOAD_LABEL
from webhook.placement import tiers

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


def time_sliced(node: NodeInfo) -> bool:
    """``nvidia.com/gpu`` counts time-slicing (or MPS) replicas, not GPUs: replicas above 1 and no
    renamed ``nvidia.com/gpu.shared`` (with the rename, the replicas label is the shared resource's)."""
    return node.replicas > 1 and node.slots is None


def whole_free_gpus(node: NodeInfo, requested: dict[str, int]) -> int:
    """The ``gpugate.io/gpu-free`` value: whole GPUs a pod asking ``nvidia.com/gpu: N`` could get.

    Per resource:

    - ``nvidia.com/gpu`` on a plain node: allocatable minus requested.
    - ``nvidia.com/gpu`` under time-slicing (replicas R, not renamed): a pod gets shares, and the
      device plugin spreads shares over the least-used GPUs, so every share in use takes one GPU
      out of the whole ones until each has one: GPUs (slots / R) minus shares requested. (Free
      slots // R, the old count, is right only while shares happen to be packed.)
    - ``nvidia.com/gpu`` under the single MIG strategy: slices, not GPUs: 0.
    - ``nvidia.com/gpu.shared`` and ``nvidia.com/mig-*``: a pod asking ``nvidia.com/gpu`` cannot
      get them: 0.
    """
    allocatable = node.plugin_gpus
    if not allocatable or node.mig_single:
        return 0
    used = sum(count for resource, count in requested.items() if units.is_plugin_gpu(resource))
    if time_sliced(node):
        return max(allocatable // node.replicas - used, 0)
    return max(allocatable - used, 0)


def gpu_weight(node: NodeInfo, resource: str) -> float:
    """How much of a physical GPU one unit of ``resource`` is on ``node`` (for the allocation share).

    The table is ``webhook.kube.units.gpu_share`` (a whole GPU 1, a time-sliced share 1/R, a MIG
    ``<g>g`` slice g/7, divided by its own replicas if the slices are time-sliced too); this reads
    the node's replicas for it. Under the single MIG strategy every unit is a slice of one
    profile, so any constant gives the same share.
    """
    return units.gpu_share(resource, replicas=node.replicas, gpu_time_sliced=time_sliced(node),
                           mig_replicas=dict(node.mig_replicas).get(units.mig_base(resource), 1))


def node_load(node: NodeInfo, requested: dict[str, int], utilization: float | None) -> NodeLoad:
    """Whole free GPUs (:func:`whole_free_gpus`) and the requested share of the node's GPUs.

    The share weighs each resource by the physical GPU it stands for (:func:`gpu_weight`), so 4
    whole GPUs taken next to 4 GPUs cut into 28 idle MIG slices is half the node, not 4 units of 32.
    """
    allocatable = dict(node.allocatable)
    total = sum(count * gpu_weight(node, resource) for resource, count in allocatable.items())
    used = sum(min(requested.get(resource, 0), count) * gpu_weight(node, resource)
               for resource, count in allocatable.items())
    allocated = min(used / total, 1.0) if total else 1.0  # a GPU node offering nothing has nothing free
    return NodeLoad(free_gpus=whole_free_gpus(node, requested), allocated=allocated, utilization=utilization)


def desired(node: NodeInfo, load: NodeLoad | None, *, thresholds: tiers.TierThresholds,
            taint_congested: bool) -> Marks:
    """The marks ``node`` should carry; ``load`` None means it is not a GPU node (remove ours).

    The caller decides what a GPU node is: device-plugin GPU resources, or NVIDIA DRA devices
    (``dracount.is_gpu_node``), which a node's allocatable does not show."""
    if load is None:
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


def urgent(node: NodeInfo, marks: Marks) -> bool:
    """True when the change may not wait for the node's write interval: our marks appearing (a new
    GPU node is steered at once) or going away (it is no GPU node any more).

    Everything else waits, a change of tier (``gpu-load``) and of the taint as much as one of
    ``gpu-free``: each Node write goes to every watcher of all nodes (kube-scheduler,
    kube-controller-manager, node agents), so a node is written at most once per
    ``write_interval``. On the real API server the old rule (a tier change at once)
    wrote packed nodes twice within the interval (benchmarks/balancer_cluster.py --code-before).
    The labels are preferences: they lag the node's pods by at most the interval, and the
    scheduler's own resource fit never lets a pod onto a node that is full.
    """
    return (node.label(GPU_FREE_LABEL) is None) != (marks.free is None) or \
        (node.label(GPU_LOAD_LABEL) is None) != (marks.load is None)


def after_patch(node: NodeInfo, marks: Marks) -> NodeInfo:
    """``node`` as it is once a patch to ``marks`` has been stored (same resourceVersion: the watch
    brings the real one). Saves decoding the patched node the API server sends back."""
    owned = {k: v for k, v in node.owned_labels}
    for key, want in ((GPU_FREE_LABEL, marks.free), (GPU_LOAD_LABEL, marks.load)):
        if want is None:
            owned.pop(key, None)
        else:
            owned[key] = want
    taints = node.taints
    if node.has_congested_taint != marks.tainted or _duplicated(node):
        taints = tuple(t for t in node.taints if t.get("key") != CONGESTED_TAINT_KEY) + \
            ((dict(CONGESTED_TAINT),) if marks.tainted else ())
    return dataclasses.replace(node, owned_labels=tuple(sorted(owned.items())), taints=taints)


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
