"""The right-sizing replay's cluster and pods: the trace re-imagined on MIG-capable GPUs. Pure.

The openb trace's GPUs (T4, P100, V100, the undisclosed G2/G3) cannot be partitioned, so the arms
``whole-gpu``, ``shares-only`` and ``rightsized`` replay the trace on a documented twin:

* **GPUs.** Every GPU node keeps its cpu, memory and GPU count; each GPU becomes an
  H100 80GB (``nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3``, ``nvidia.com/gpu.memory=81559``
  MiB, family ``hopper``: GFD's labels on a real H100 node, shared/reference/gpu-operator.md 4.1).
* **Layouts.** A fixed share of the GPU nodes is partitioned (``--mig-mix``, default
  ``all-balanced=0.15``), picked by one permutation of the nodes (seed 0, the same for every
  arm and replay seed). Partitioned nodes use one layout for all their GPUs, as the MIG manager
  applies ``nvidia.com/mig.config`` per node. The layouts are mig-parted's
  (NVIDIA/mig-parted deployments/systemd/config-default.yaml, H100-80GB entries):
  ``all-1g.10gb`` 7 x 1g.10gb, ``all-2g.20gb`` 3 x 2g.20gb, ``all-3g.40gb`` 2 x 3g.40gb,
  ``all-balanced`` 2 x 1g.10gb + 1 x 2g.20gb + 1 x 3g.40gb. Under the GPU Operator's ``mixed``
  strategy such a node advertises ``nvidia.com/mig-<profile>: <slices x GPUs>`` and no
  ``nvidia.com/gpu`` (gpu-operator.md 4.3).
* **Arms** (each row's ``arms.Sizing`` says which of these it is). ``whole-gpu``: no node is
  partitioned. ``shares-only``: the partitioned nodes are
  time-sliced instead (``nvidia.com/gpu.shared: replicas x GPUs``, renameByDefault, 4 replicas as
  the starter policy's ``time-slicing-4``). ``rightsized``: the partitioned nodes carry the MIG mix.
  The other nodes offer whole GPUs in every arm.
* **Pods.** Whole-GPU pods (``gpu_milli`` 1000) stay ``nvidia.com/gpu: N`` (profile ``training``).
  A fractional pod (``gpu_milli`` < 1000) is a memory ask in disguise: it carries profile
  ``inference`` and asks, per arm, ``nvidia.com/gpu: 1`` (whole-gpu), ``nvidia.com/gpu.shared: 1``
  (shares-only) or nothing but the label ``gpugate.io/gpu-memory: <gpu_milli x 80 MB>`` (rightsized:
  gpu_milli/1000 of the H100's 80 GB, decimal as MIG profile names count, so 125 milli is ``10000M``,
  exactly a 1g.10gb slice). The trace's ``gpu_spec`` (a T4 or V100 pin) has no meaning on this
  cluster and is dropped in all three arms.
* **Allocation** counts physical GPU capacity taken: a whole GPU 1000 milli, a time-sliced slot
  1000/replicas, a MIG slice g/7 of a GPU (its compute slices: 1g 143, 2g 286, 3g 429).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from webhook import names
from webhook.kube import units
from webhook.kube.gpunode import NodeInfo
from webhook.replay import arms as arm_table
from webhook.replay import workload
from webhook.replay.records import MILLI, NodeRecord, TracePod
from webhook.replay.runspec import DEFAULT_MIG_MIX

ARMS = arm_table.SIZING_ARMS
PRODUCT = "NVIDIA-H100-80GB-HBM3"
MEMORY_MIB = 81559
"""``nvidia.com/gpu.memory`` of an H100 80GB node (gpu-operator.md 4.1, a real node's labels)."""
MEMORY_MB = 80_000
"""What a fraction of the GPU is worth in the pod's memory ask: 80 GB, counted as MIG names count."""
MIG_1G_MEMORY_MIB = 9984
"""``nvidia.com/mig-1g.10gb.memory`` on that node (gpu-operator.md 4.1); other profiles: not given."""
FRACTIONAL_PROFILE = "inference"
DEFAULT_REPLICAS = units.DEFAULT_SLOT_REPLICAS
DEFAULT_MIX = DEFAULT_MIG_MIX

# mig-parted config-default.yaml, the H100-80GB / A100-80GB device filter: slices per GPU.
LAYOUTS: dict[str, tuple[tuple[str, int], ...]] = {
    "all-1g.10gb": (("1g.10gb", 7),),
    "all-2g.20gb": (("2g.20gb", 3),),
    "all-3g.40gb": (("3g.40gb", 2),),
    "all-balanced": (("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)),
}
TIME_SLICED = "time-sliced"
WHOLE = "whole"


class MigMixError(ValueError):
    """A ``--mig-mix`` that is not ``LAYOUT=SHARE,...`` with known layouts and shares summing to at most 1."""


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``all-1g.10gb=0.1,all-balanced=0.2`` -> ((layout, share of GPU nodes), ...), in the order given."""
    out: list[tuple[str, float]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        layout, _, share_text = part.partition("=")
        layout = layout.strip()
        if layout not in LAYOUTS:
            raise MigMixError(f"unknown MIG layout {layout!r}; choose from {', '.join(LAYOUTS)}")
        try:
            share = float(share_text)
        except ValueError:
            raise MigMixError(f"{part!r}: expected LAYOUT=SHARE with SHARE a number such as 0.25") from None
        if not 0 <= share <= 1 or any(layout == seen for seen, _ in out):
            raise MigMixError(f"{part!r}: a share is between 0 and 1 and each layout is named once")
        out.append((layout, share))
    if sum(share for _, share in out) > 1 + 1e-9:
        raise MigMixError(f"{text!r}: the shares add up to more than 1")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class SizedNode:
    """One node of the twin: its record (``gpus`` = whole GPUs advertised), layout and allocatable."""

    record: NodeRecord
    physical_gpus: int
    layout: str
    allocatable: tuple[tuple[str, int], ...]
    """GPU extended resources other than ``nvidia.com/gpu`` (MIG slices, time-sliced slots)."""
    labels: dict[str, str] = field(default_factory=dict)


def layouts(nodes: tuple[NodeRecord, ...], mix: tuple[tuple[str, float], ...]) -> list[str]:
    """The layout of each node: shares of the GPU nodes, by a fixed permutation (seed 0)."""
    gpu_nodes = [i for i, node in enumerate(nodes) if node.gpus]
    order = [gpu_nodes[i] for i in np.random.default_rng(0).permutation(len(gpu_nodes))]
    out = [WHOLE] * len(nodes)
    start = 0
    for layout, share in mix:
        count = round(share * len(gpu_nodes))
        for index in order[start:start + count]:
            out[index] = layout
        start += count
    return out


def sizing_of(arm: str) -> arm_table.Sizing:
    """What the right-sizing arm ``arm`` changes on the twin (its row in ``replay.arms``)."""
    found = arm_table.BY_NAME.get(arm)
    if found is None or found.sizing is None:
        raise ValueError(f"not a right-sizing arm: {arm!r}")
    return found.sizing


def sized_nodes(nodes: tuple[NodeRecord, ...], arm: str, mix: tuple[tuple[str, float], ...],
                replicas: int = DEFAULT_REPLICAS) -> tuple[SizedNode, ...]:
    """The arm's twin of the trace's nodes (see the module docstring)."""
    partitioned = sizing_of(arm).partitioned
    planned = layouts(nodes, mix) if partitioned != "none" else [WHOLE] * len(nodes)
    out = []
    for node, layout in zip(nodes, planned, strict=True):
        if not node.gpus:
            out.append(SizedNode(node, 0, WHOLE, (), {"kubernetes.io/hostname": node.name}))
            continue
        labels = {"kubernetes.io/hostname": node.name, names.NVIDIA_PRODUCT_LABEL: PRODUCT,
                  names.NVIDIA_MEMORY_LABEL: str(MEMORY_MIB), names.NVIDIA_FAMILY_LABEL: "hopper",
                  names.NVIDIA_COUNT_LABEL: str(node.gpus)}
        allocatable: dict[str, int] = {}
        whole = node.gpus
        if layout != WHOLE and partitioned == "time-sliced":
            layout, whole = TIME_SLICED, 0
            allocatable[names.SHARED_GPU_RESOURCE] = replicas * node.gpus
            labels[names.NVIDIA_SHARING_LABEL] = "time-slicing"
            labels[names.NVIDIA_REPLICAS_LABEL] = str(replicas)
        elif layout != WHOLE:
            whole = 0
            for profile, per_gpu in LAYOUTS[layout]:
                allocatable[f"{names.MIG_RESOURCE_PREFIX}{profile}"] = per_gpu * node.gpus
            labels[names.NVIDIA_MIG_STRATEGY_LABEL] = "mixed"
            labels[names.NVIDIA_MIG_CONFIG_LABEL] = layout
        record = NodeRecord(node.name, node.cpu_milli, node.memory_mib, whole, "H100-80GB" if whole else "")
        out.append(SizedNode(record, node.gpus, layout, tuple(sorted(allocatable.items())), labels))
    return tuple(out)


def extended_allocatable(nodes: tuple[SizedNode, ...]) -> dict[str, list[int]]:
    """Allocatable per extended resource, one entry per node: what ``ClusterState`` accounts."""
    resources = sorted({resource for node in nodes for resource, _ in node.allocatable})
    return {resource: [dict(node.allocatable).get(resource, 0) for node in nodes] for resource in resources}


def physical_milli(resource: str, count: int, replicas: int = DEFAULT_REPLICAS, *, mig_replicas: int = 1,
                   gpu_time_sliced: bool = False) -> int:
    """Thousandths of physical GPUs that ``count`` units of ``resource`` take (``units.share_milli``:
    the balancer's share, each unit rounded to a thousandth; a time-sliced MIG slice divided by its replicas).
    The twin never time-slices ``nvidia.com/gpu`` itself (its slots are renamed ``.shared``)."""
    return units.share_milli(resource, count, replicas=replicas, mig_replicas=mig_replicas,
                             gpu_time_sliced=gpu_time_sliced)


def memory_ask(gpu_milli: int) -> str:
    """The ``gpugate.io/gpu-memory`` a fractional trace pod writes: its share of the GPU's 80 GB."""
    return f"{gpu_milli * MEMORY_MB // MILLI}M"


def pod_for(record: TracePod, arm: str) -> dict[str, Any]:
    """The trace row as the pod's author writes it in this arm (see the module docstring)."""
    shares = record.shares_gpu
    pod = workload.pod_for(TracePod(record.name, record.cpu_milli, record.memory_mib, 0 if shares else record.num_gpu,
                                     0 if shares else record.gpu_milli, (), record.qos))
    if not record.shares_gpu:
        return pod
    pod["metadata"]["labels"][names.PROFILE_LABEL] = FRACTIONAL_PROFILE
    resources = pod["spec"]["containers"][0]["resources"]
    ask = sizing_of(arm).fractional_ask
    if ask == "memory":
        pod["metadata"]["labels"][names.GPU_MEMORY_LABEL] = memory_ask(record.gpu_milli)
        return pod
    resource = names.GPU_RESOURCE if ask == "gpu" else names.SHARED_GPU_RESOURCE
    resources["requests"][resource] = "1"
    resources.setdefault("limits", {})[resource] = "1"
    return pod


def node_infos(nodes: tuple[SizedNode, ...]) -> list[NodeInfo]:
    """The twin's GPU nodes as the balancer reads them, for ``webhook.placement.gpuinventory.offers``."""
    out = []
    for node in nodes:
        allocatable = dict(node.allocatable)
        if node.record.gpus:
            allocatable[names.GPU_RESOURCE] = node.record.gpus
        if not allocatable:
            continue
        memory = {resource: MEMORY_MIB for resource in (names.GPU_RESOURCE, names.SHARED_GPU_RESOURCE)}
        memory[f"{names.MIG_RESOURCE_PREFIX}1g.10gb"] = MIG_1G_MEMORY_MIB
        out.append(NodeInfo(name=node.record.name, resource_version="", allocatable=tuple(sorted(allocatable.items())),
                            owned_labels=(), taints=(), replicas=int(node.labels.get(names.NVIDIA_REPLICAS_LABEL, 1)),
                            hostnames=(node.record.name,), mig_single=False, product=PRODUCT,
                            unit_memory_mib=tuple(sorted((r, m) for r, m in memory.items() if r in allocatable)),
                            cpu_milli=node.record.cpu_milli, memory_bytes=node.record.memory_mib * 2**20))
    return out


def requested(nodes: tuple[SizedNode, ...], whole_used: Mapping[int, int],
              extended_used: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    """Per node name, the GPU requests of bound pods: the balancer's ``requested`` argument."""
    out: dict[str, dict[str, int]] = {}
    for index, count in whole_used.items():
        if count:
            out.setdefault(nodes[index].record.name, {})[names.GPU_RESOURCE] = count
    for resource, per_node in extended_used.items():
        for index, count in per_node.items():
            if count:
                out.setdefault(nodes[index].record.name, {})[resource] = count
    return out
