"""Which extended resources are GPUs: one answer for the webhook, the balancer and the replay.

The NVIDIA device plugin advertises whole GPUs (``nvidia.com/gpu``), time-sliced or MPS shares
(``nvidia.com/gpu.shared`` when ``renameByDefault`` is on) and MIG slices
(``nvidia.com/mig-<g>g.<mem>gb``, the ``mixed`` strategy). Other NVIDIA software advertises
``nvidia.com/*`` too (the network operator's SR-IOV virtual functions, e.g.
``nvidia.com/cx7_sriov_rdma``), so "starts with nvidia.com/" is not a GPU test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from webhook import names

_MIG_TAIL = r"mig-([1-9][0-9]*)g\.([1-9][0-9]*)gb(?:\.[a-z0-9+.-]+)?"
_MIG = re.compile(rf"^nvidia\.com/{_MIG_TAIL}$")
GPU_RESOURCE_PATTERN = rf"^nvidia\.com/(?:gpu|gpu\.shared|{_MIG_TAIL})$"
"""Every GPU resource name, as one regular expression: ``webhook/policy/schema.json``'s ``resource``
pattern is this string (a test holds them equal), so a policy can name exactly what is a GPU here."""


def is_gpu_resource(name: str) -> bool:
    """True for whole GPUs, shared GPUs and MIG slices; false for every other extended resource."""
    return name == names.GPU_RESOURCE or name == names.SHARED_GPU_RESOURCE or is_mig_resource(name)


def is_mig_resource(name: str) -> bool:
    return name.startswith(names.MIG_RESOURCE_PREFIX) and _MIG.match(name) is not None


@dataclass(frozen=True, slots=True, order=True)
class MigProfile:
    """A MIG slice as its resource name spells it: compute slices (of 7) and memory in GB."""

    compute: int
    memory_gb: int
    resource: str


def mig_profile(name: str) -> MigProfile | None:
    """``nvidia.com/mig-3g.40gb`` -> MigProfile(3, 40, ...); None for anything else."""
    match = _MIG.match(name)
    if match is None:
        return None
    return MigProfile(int(match.group(1)), int(match.group(2)), name)
