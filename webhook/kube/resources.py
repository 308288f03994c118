"""How a MIG resource name spells its profile. Which extended resources are GPUs at all is
``kube.units.KINDS``, the one table of GPU resource kinds.

The NVIDIA device plugin advertises whole GPUs (``nvidia.com/gpu``), time-sliced or MPS shares
(``nvidia.com/gpu.shared`` when ``renameByDefault`` is on) and MIG slices
(``nvidia.com/mig-<g>g.<mem>gb``, the ``mixed`` strategy). Other NVIDIA software advertises
``nvidia.com/*`` too (the network operator's SR-IOV virtual functions, e.g.
``nvidia.com/cx7_sriov_rdma``), so "starts with nvidia.com/" is not a GPU test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MIG_TAIL = r"mig-([1-9][0-9]*)g\.([1-9][0-9]*)gb(?:\.[a-z0-9+.-]+)?"
MIG_PATTERN = rf"nvidia\.com/{_MIG_TAIL}"
"""Every MIG resource name (``kube.units.KINDS`` holds it as the ``mig`` row)."""
_MIG = re.compile(rf"^{MIG_PATTERN}$")


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
