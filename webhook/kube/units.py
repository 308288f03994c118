"""The one table of GPU units: what one unit of an NVIDIA resource or DRA device is of a physical GPU. Pure.

Before this module the facts below were written out in each product: "a GPU has 7 compute
slices" in the balancer's marks, the replay's MIG twin and the policy parser; a time-sliced slot's
default size in the placement inputs and the replay; a MIG unit's share of its GPU twice, and the
two disagreed on time-sliced MIG slices (the balancer divided a slice by its own
``nvidia.com/mig-<profile>.replicas``, the replay did not). Every consumer now asks here.

The MIG-replica rule, settled: a MIG slice is ``g/7`` of its GPU; when the device plugin
time-slices MIG slices (``nvidia.com/mig-<profile>.replicas`` R > 1, resource
``nvidia.com/mig-<profile>`` or, renamed, ``nvidia.com/mig-<profile>.shared``), one unit is a slot
of that slice: ``g/7/R``. That is what the balancer counted; the replay never builds time-sliced
MIG nodes, so it reads the same numbers as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from webhook import names
from webhook.kube.resources import MigProfile, is_gpu_resource, mig_profile

COMPUTE_SLICES_PER_GPU = 7
"""Compute slices of a MIG-capable GPU (A100, H100, H200, B200; an A30 has 4, so its slices weigh a
little less than they should): a ``<g>g`` profile is g/7 of a GPU's compute."""

MILLI = 1000
"""Thousandths of one physical GPU: the unit the replay and the fragmentation score count in."""

DEFAULT_SLOT_REPLICAS = 4
"""Time-sliced slots per GPU when nothing says otherwise: the ``time-slicing-4`` device-plugin
config of manifests/gpu-operator and the starter notebook policy."""

MIG_GB_BYTES = 10**9
"""MIG profile names count decimal gigabytes: ``1g.10gb`` holds ``10G`` (``10Gi`` is more)."""

UnitKind = Literal["whole", "slot", "mig"]


@dataclass(frozen=True, slots=True)
class Unit:
    """What one unit of a GPU extended resource is: a whole GPU, a time-sliced slot, or a MIG slice."""

    resource: str
    kind: UnitKind
    mig: MigProfile | None = None
    """The profile of a MIG unit (also of a time-sliced MIG slice, ``...gb.shared``)."""

    @property
    def compute(self) -> float:
        """Share of a GPU's compute one unit gives when not time-sliced: 1 whole, g/7 for a MIG slice.
        A slot gives a share that depends on the node's replicas (:func:`gpu_share`)."""
        if self.mig is not None:
            return min(self.mig.compute / COMPUTE_SLICES_PER_GPU, 1.0)
        return 1.0


def unit_of(resource: str) -> Unit | None:
    """The unit of a GPU extended resource; None for every other resource."""
    if resource == names.GPU_RESOURCE:
        return Unit(resource, "whole")
    if resource == names.SHARED_GPU_RESOURCE:
        return Unit(resource, "slot")
    profile = mig_profile(resource)
    if profile is not None:
        return Unit(resource, "mig", profile)
    return None


def mig_base(resource: str) -> str:
    """``nvidia.com/mig-1g.10gb.shared`` -> ``nvidia.com/mig-1g.10gb``: the slice a time-sliced MIG unit
    is a slot of."""
    return resource.removesuffix(".shared")


def gpu_share(resource: str, *, replicas: int = 1, mig_replicas: int = 1, gpu_time_sliced: bool = False) -> float:
    """How much of a physical GPU one unit of ``resource`` is (0 for a resource that is no GPU).

    ``replicas``: ``nvidia.com/gpu.replicas`` of the node (slots per GPU); ``gpu_time_sliced``: the
    node time-slices without renaming, so ``nvidia.com/gpu`` counts slots; ``mig_replicas``:
    ``nvidia.com/mig-<profile>.replicas`` of that profile (the MIG-replica rule of the module docstring).
    """
    unit = unit_of(resource)
    if unit is None or not is_gpu_resource(resource):
        return 0.0
    if unit.kind == "whole":
        return 1.0 / max(replicas, 1) if gpu_time_sliced else 1.0
    if unit.kind == "slot":
        return 1.0 / max(replicas, 1)
    return unit.compute / max(mig_replicas, 1)


def share_milli(resource: str, count: int = 1, *, replicas: int = 1, mig_replicas: int = 1,
                gpu_time_sliced: bool = False) -> int:
    """Thousandths of physical GPUs that ``count`` units take, each unit rounded to a thousandth first
    (a 1g slice is 143, so seven of them are 1001: the replay's accounting, kept)."""
    return count * round(MILLI * gpu_share(resource, replicas=replicas, mig_replicas=mig_replicas,
                                           gpu_time_sliced=gpu_time_sliced))


def slot_milli(replicas: int = DEFAULT_SLOT_REPLICAS) -> int:
    """Thousandths of its GPU one time-sliced slot stands for: :func:`share_milli`'s rounding, so the
    extender's and the replay's slot is the balancer's (it was ``MILLI // replicas``, a thousandth
    short of the balancer's for 6 and 7 replicas)."""
    return share_milli(names.SHARED_GPU_RESOURCE, 1, replicas=replicas)


def mig_memory_bytes(profile: MigProfile) -> int:
    """The memory a MIG profile's name promises (decimal GB): what right-sizing counts a slice as."""
    return profile.memory_gb * MIG_GB_BYTES


def mig_profile_of_name(profile_name: str) -> MigProfile | None:
    """``1g.10gb`` (a policy's ``mig:`` rung, a DRA device's ``profile`` attribute) -> its MigProfile."""
    return mig_profile(f"{names.MIG_RESOURCE_PREFIX}{profile_name}")
