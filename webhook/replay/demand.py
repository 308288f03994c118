"""Read a Pod (a plain dict, as admitted) into the ``PodView`` the scheduler model evaluates.

Resources follow kube-scheduler's rules: the pod request is the larger of the regular containers'
sum and any single init container; for scoring, a container without a cpu or memory request counts
as 100m / 200MB. GPUs: ``nvidia.com/gpu: N`` takes N whole GPUs on one node; ``nvidia.com/gpu.shared``
takes part of one GPU, its size read from the replay annotation (default: a quarter of a GPU per slot,
i.e. time-slicing with 4 replicas), unless ``shared_slots`` asks for kube-scheduler's own accounting:
then a slot is an integer extended resource like any other. MIG slices (``nvidia.com/mig-<profile>``)
are integer extended resources (``Demand.extended``): a node fits when it has enough of them left.
"""

from __future__ import annotations

from typing import Any

from webhook import names
from webhook.kube import affinity as node_affinity
from webhook.kube import pods, tolerations, units
from webhook.kube.quantity import QuantityError, whole_count
from webhook.kube.resources import is_gpu_resource, is_mig_resource
from webhook.placement.inputs import request_amount
from webhook.replay.cluster import Demand
from webhook.replay.model import PodView
from webhook.replay.records import MILLI
from webhook.replay.workload import GPU_MILLI_ANNOTATION

MIB = 2**20
DEFAULT_CPU_MILLI = 100              # pkg/scheduler/util/pod_resources.go
DEFAULT_MEMORY_BYTES = 200 * 10**6
DEFAULT_SLOT_MILLI = units.slot_milli(units.DEFAULT_SLOT_REPLICAS)


def _scheduled(resource: str) -> bool:
    return resource in ("cpu", "memory") or is_gpu_resource(resource)


def _pod_amounts(pod: dict[str, Any]) -> tuple[dict[str, int], int, int]:
    """The pod's requests (Kubernetes' effective-request rule) and the cpu/memory scoring uses.

    Raises QuantityError for a quantity that is not valid.
    """
    amounts = pods.effective_requests(pod, include=_scheduled, amount=request_amount)
    scored = pods.effective_requests(pod, include=lambda r: r in ("cpu", "memory"), amount=request_amount,
                                     defaults={"cpu": DEFAULT_CPU_MILLI, "memory": DEFAULT_MEMORY_BYTES})
    return amounts, scored.get("cpu", 0), scored.get("memory", 0)




def view(pod: dict[str, Any], *, shared_slots: bool = False, slot_milli: int | None = None) -> PodView:
    """The scheduling-relevant reading of a Pod (``shared_slots``: count ``nvidia.com/gpu.shared`` as
    integers; ``slot_milli``: a slot is that many thousandths, whatever the replay annotation says)."""
    spec = pods.spec(pod)
    unsupported = None
    try:
        amounts, cpu_nz, mem_nz = _pod_amounts(pod)
    except QuantityError:
        amounts, cpu_nz, mem_nz = {}, DEFAULT_CPU_MILLI, DEFAULT_MEMORY_BYTES
        unsupported = "a resource quantity is not valid"
    whole = amounts.get(names.GPU_RESOURCE, 0)
    slots = amounts.get(names.SHARED_GPU_RESOURCE, 0)
    num_gpu, milli = 0, 0
    extended = {r: v for r, v in amounts.items() if is_mig_resource(r) and v > 0}
    if shared_slots and slots:
        extended[names.SHARED_GPU_RESOURCE], slots = slots, 0
    if unsupported:
        pass
    elif whole and slots:
        unsupported = "asks for whole and shared GPUs at once"
    elif whole:
        num_gpu, milli = whole, MILLI
    elif slots:
        per_slot = slot_milli or whole_count(pods.annotations_of(pod).get(GPU_MILLI_ANNOTATION, "")) \
            or DEFAULT_SLOT_MILLI
        num_gpu, milli = 1, min(MILLI, per_slot * slots)
    demand = Demand(cpu=amounts.get("cpu", 0), memory=-(-amounts.get("memory", 0) // MIB), num_gpu=num_gpu,
                    gpu_milli=milli, cpu_score=cpu_nz, memory_score=-(-mem_nz // MIB),
                    extended=tuple(sorted(extended.items())))
    selection = node_affinity.parse(spec)
    return PodView(demand=demand, resources=frozenset(r for r, v in amounts.items() if v > 0),
                   node_selector=selection.node_selector, required=selection.required,
                   preferred=selection.preferred, tolerations=tolerations.of_pod_spec(spec),
                   scheduler_name=str(spec.get("schedulerName") or "default-scheduler"), unsupported=unsupported)
