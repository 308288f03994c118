"""Read a Pod (a plain dict, as admitted) into the ``PodView`` the scheduler model evaluates.

What the pod asks is the vocabulary's ``webhook.kube.demand.PodDemand`` (Kubernetes' request
rules, scoring's 100m / 200MB defaults); this module adds only what the replay decides about it.
``nvidia.com/gpu.shared`` takes part of one GPU, its size read from the replay annotation
(default: a quarter of a GPU per slot, i.e. time-slicing with 4 replicas), unless ``shared_slots``
asks for kube-scheduler's own accounting: then a slot is an integer extended resource like any
other. MIG slices (``nvidia.com/mig-<profile>``) are integer extended resources
(``PodDemand.extended``): a node fits when it has enough of them left.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from webhook import names
from webhook.kube import affinity as node_affinity
from webhook.kube import demand as kube_demand
from webhook.kube import pods, tolerations
from webhook.kube.demand import PodDemand
from webhook.kube.quantity import QuantityError, whole_count
from webhook.replay.kubescheduler import PodView
from webhook.replay.workload import GPU_MILLI_ANNOTATION

MIB = kube_demand.MIB
DEFAULT_CPU_MILLI = kube_demand.DEFAULT_CPU_MILLI
DEFAULT_MEMORY_BYTES = kube_demand.DEFAULT_MEMORY_BYTES
DEFAULT_SLOT_MILLI = kube_demand.DEFAULT_SLOT_MILLI


def _read(pod: dict[str, Any], shared_slots: bool,
          slot_milli: int | None = None) -> tuple[PodDemand, frozenset[str], str | None]:
    """The pod's demand as the model places it, the resources it asks, and what the model cannot
    place (None: nothing). ``products`` stays empty: the model evaluates the pod's node affinity
    itself, and a demand's products are the trace's GPU model names, which only a trace row has."""
    per_slot = slot_milli or whole_count(pods.annotations_of(pod).get(GPU_MILLI_ANNOTATION, "")) or DEFAULT_SLOT_MILLI
    try:
        demand = kube_demand.of_pod(pod, slot_milli=per_slot)
    except QuantityError:
        return PodDemand(cpu_score=DEFAULT_CPU_MILLI, memory_score_bytes=DEFAULT_MEMORY_BYTES), frozenset(), \
            "a resource quantity is not valid"
    resources = frozenset(r for r, _ in demand.gpu_counts()) \
        | {r for r, v in (("cpu", demand.cpu), ("memory", demand.memory_bytes)) if v}
    demand = replace(demand, products=frozenset())
    if shared_slots and demand.slots:
        extended = tuple(sorted({**dict(demand.extended), names.SHARED_GPU_RESOURCE: demand.slots}.items()))
        demand = replace(demand, share_milli=0, extended=extended)
    if demand.gpus and demand.share_milli:
        return replace(demand, gpus=0, share_milli=0), resources, "asks for whole and shared GPUs at once"
    return demand, resources, None


def view(pod: dict[str, Any], *, shared_slots: bool = False, slot_milli: int | None = None) -> PodView:
    """The scheduling-relevant reading of a Pod (``shared_slots``: count ``nvidia.com/gpu.shared`` as
    integers; ``slot_milli``: a slot is that many thousandths, whatever the replay annotation says)."""
    spec = pods.spec(pod)
    demand, resources, unsupported = _read(pod, shared_slots, slot_milli)
    selection = node_affinity.parse(spec)
    return PodView(demand=demand, resources=resources,
                   node_selector=selection.node_selector, required=selection.required,
                   preferred=selection.preferred, tolerations=tolerations.of_pod_spec(spec),
                   scheduler_name=str(spec.get("schedulerName") or "default-scheduler"), unsupported=unsupported)
