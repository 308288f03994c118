"""Who holds how much of which node's GPUs now, in physical GPUs, and how many GPUs each node has. Pure.

Every share is ``webhook.kube.units``' (through ``placement.marks.gpu_weight`` for the node's
replicas and ``placement.dracount.unit_weight`` for DRA devices), so a GPU-hour here is the
GPU-hour the balancer's tiers and the replay count:

- a whole GPU (``nvidia.com/gpu``, or a DRA ``gpu.nvidia.com`` device) is 1;
- a MIG slice (``nvidia.com/mig-<g>g.<mem>gb``, a DRA ``mig.nvidia.com`` device, or
  ``nvidia.com/gpu`` under GFD's single MIG strategy) is its share of compute slices, divided by
  its replicas when the slices are time-sliced;
- a time-sliced slot (``nvidia.com/gpu.shared``, or ``nvidia.com/gpu`` on a node that time-slices
  without renaming) is ``1 / replicas``;
- a share of a DRA device that allows multiple allocations is the part of the device's
  ``memory`` capacity its claim consumed, times the device's own weight. A claim several pods use
  is split between them evenly, so the shares on a device never add up to more than the device.

Physical GPUs of a node: the DRA driver's count where it publishes devices there (it names each
GPU by UUID, and a node served by both stacks is counted once, as in ``placement.dracount``),
else GPU Feature Discovery's ``nvidia.com/gpu.count`` (a GPU whose MIG layout leaves compute
slices unused is still one GPU: eight H100s in ``all-2g.20gb`` offer 24 slices, 48/7 GPUs),
and never fewer than the node's allocatable weighed the same way, rounded up. So on every node
the shares held add up to at most its physical GPUs, and allocated plus unallocated GPU-hours
are the physical ones. A node that offers no GPU resource (a GPU node the device plugin left)
has none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from webhook import names
from webhook.kube import allocations, nodedevices, units
from webhook.kube.allocations import DeviceKey
from webhook.kube.gpunode import MIG_SINGLE_PRODUCT_MARK, NodeInfo
from webhook.kube.nodedevices import DeviceState, NodeDevices
from webhook.placement import dracount, marks
from webhook.usage.workloads import Owner, PodRecord

Kind = Literal["whole", "mig", "slot", "share"]
KINDS: tuple[Kind, ...] = ("whole", "mig", "slot", "share")
"""What a holding is a unit of: a whole GPU, a MIG slice, a time-sliced slot, a DRA share."""
ROUNDING = 1e-6
"""Below this a sum of float shares is a whole number of GPUs (seven 1g slices are one GPU)."""


@dataclass(frozen=True, slots=True)
class Holding:
    """GPUs (physical, fractional) one pod holds through one kind of unit on one node."""

    namespace: str
    pod: str
    owner: Owner
    node: str
    kind: Kind
    gpus: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster's GPU holdings and physical GPUs at one instant."""

    holdings: tuple[Holding, ...]
    physical: tuple[tuple[str, int], ...]
    """(node, physical GPUs), sorted by node."""

    def allocated_on(self, node: str) -> float:
        return sum(h.gpus for h in self.holdings if h.node == node)

    def unallocated(self) -> dict[str, float]:
        """Per node: physical GPUs no pod holds (never below 0)."""
        return {node: max(gpus - self.allocated_on(node), 0.0) for node, gpus in self.physical}


def mig_single_share(node: NodeInfo) -> float | None:
    """One ``nvidia.com/gpu`` unit under GFD's single MIG strategy: the share of the profile GFD names
    in the product (``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb``); None when the product names none."""
    profile = node.product.partition(MIG_SINGLE_PRODUCT_MARK)[2]
    unit = units.unit_of(units.mig_resource(profile)) if profile else None
    return None if unit is None else units.gpu_share(unit.resource)


def unit_share(node: NodeInfo | None, resource: str) -> float:
    """Physical GPUs one unit of a device-plugin ``resource`` is on ``node`` (None: an unknown node)."""
    if node is None:
        return units.gpu_share(resource)
    if node.mig_single and units.is_plugin_gpu(resource):
        share = mig_single_share(node)
        if share is not None:
            return share
    return marks.gpu_weight(node, resource)


def unit_kind(node: NodeInfo | None, resource: str) -> Kind:
    unit = units.unit_of(resource)
    if unit is None or unit.kind == "mig":
        return "mig"
    if unit.kind == "slot":
        return "slot"
    if node is not None and node.mig_single:
        return "mig"
    return "slot" if node is not None and marks.time_sliced(node) else "whole"


def device_plugin_holdings(record: PodRecord, node: NodeInfo | None) -> list[Holding]:
    """What a device plugin holds for the pod (its requests less those a DRA claim serves)."""
    by_kind: dict[Kind, float] = {}
    for resource, count in record.demand.device_plugin_counts():
        kind = unit_kind(node, resource)
        by_kind[kind] = by_kind.get(kind, 0.0) + count * unit_share(node, resource)
    return [Holding(record.namespace, record.name, record.owner, record.node, kind, gpus)
            for kind, gpus in sorted(by_kind.items()) if gpus > 0]


def device_share(state: DeviceState, result: allocations.Allocated) -> tuple[Kind, float]:
    """The kind and physical GPUs one held claim result is of its device."""
    weight = dracount.unit_weight(state.unit)
    if state.shared and state.memory_bytes:
        return "share", weight * min(nodedevices.consumed_memory(result) / state.memory_bytes, 1.0)
    return ("mig" if state.device_class == names.DRA_MIG_CLASS else "whole"), weight


def claim_holdings(claims: Iterable[allocations.Claim], devices: Mapping[DeviceKey, tuple[str, DeviceState]],
                   records: Mapping[str, PodRecord]) -> list[Holding]:
    """What allocated claims hold for the pods they are reserved for, split evenly between those pods.

    A result whose device no current slice publishes is left out: nothing says what it weighs.
    """
    sums: dict[tuple[str, str, str, Kind], float] = {}
    owners: dict[tuple[str, str], Owner] = {}
    for claim in claims:
        users = [c.name for c in claim.reserved_for if c.resource == "pods" and c.name]
        for result in claim.held() if users else ():
            found = devices.get(result.key)
            if found is None:
                continue
            node, state = found
            kind, gpus = device_share(state, result)
            for pod in users:
                record = records.get(f"{claim.namespace}/{pod}")
                owners[(claim.namespace, pod)] = record.owner if record else Owner("Pod", pod)
                key = (claim.namespace, pod, node, kind)
                sums[key] = sums.get(key, 0.0) + gpus / len(users)
    return [Holding(ns, pod, owners[(ns, pod)], node, kind, gpus)
            for (ns, pod, node, kind), gpus in sorted(sums.items()) if gpus > 0]


def physical_gpus(node: NodeInfo | None, devices: NodeDevices | None) -> int:
    """A node's physical GPUs (see the module docstring)."""
    if devices is not None and devices.devices:
        return devices.gpus
    if node is None:
        return 0
    total = sum(count * unit_share(node, resource) for resource, count in node.allocatable)
    offered = math.ceil(total - ROUNDING) if total > 0 else 0
    return max(node.gpu_count, offered) if offered else 0


def snapshot(records: Iterable[PodRecord], nodes: Mapping[str, NodeInfo], node_devices: Mapping[str, NodeDevices],
             claims: Iterable[allocations.Claim]) -> Snapshot:
    """Every holding and every GPU node's physical GPUs, from what the balancer's watches hold."""
    by_key = {r.key: r for r in records}
    holdings = [h for r in by_key.values() for h in device_plugin_holdings(r, nodes.get(r.node))]
    index = {d.key: (name, d) for name, found in node_devices.items() for d in found.devices}
    holdings += claim_holdings(claims, index, by_key)
    physical = {name: physical_gpus(nodes.get(name), node_devices.get(name))
                for name in set(nodes) | set(node_devices)}
    return Snapshot(holdings=tuple(holdings), physical=tuple(sorted((n, g) for n, g in physical.items() if g)))
