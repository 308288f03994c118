"""The GPUInventory the balancer publishes for the webhook's right-sizing (pure: no I/O, no clock).

The webhook has no API access; what the cluster offers now reaches it as a document the balancer
computes from the caches it already keeps (nodes and the GPU requests of bound, unfinished pods)
and writes into the ``gpugate-inventory`` ConfigMap. The format is ``webhook.kube.inventory``'s
(``build`` writes it, ``parse`` reads it): one offer per (GPU resource, GPU product), summed over the
nodes offering it, the PriorityClass marked ``globalDefault``, and when it was computed.

Rules (each decides what the webhook may conclude, so each errs towards "not offered"):

- only GPU resources (``webhook.kube.units.is_gpu_resource``): an SR-IOV function is no GPU;
- a cordoned node offers nothing free (its allocatable still counts, so an offer does not vanish
  from the document while a node drains);
- ``free`` per node is allocatable minus requested, never below 0 (a node whose allocatable
  shrank under running pods);
- ``memoryMiB`` is the smallest unit memory among the offer's nodes: an offer promises at least
  that much per unit; unknown (no GFD label on some node) makes it unknown, so the webhook does not
  rule a whole GPU in or out by memory it cannot vouch for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from webhook.kube import inventory
from webhook.kube.gpunode import NodeInfo
from webhook.kube.inventory import DraOffer, Inventory, Offer
from webhook.kube.nodedevices import NodeDevices
from webhook.kube.units import is_gpu_resource, is_plugin_gpu
from webhook.names import DRA_GPU_CLASS
from webhook.placement import dracount

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Content:
    """Everything the document says except when: two equal contents need no new write."""

    offers: tuple[Offer, ...]
    default_priority_class: str | None
    type_pressure: tuple[tuple[str, float], ...] = ()
    """Per GPU product, as ``webhook.kube.inventory.Inventory.type_pressure`` (from the extender's mix)."""
    dra_offers: tuple[DraOffer, ...] = ()


def offers(nodes: Iterable[NodeInfo], requested: Mapping[str, Mapping[str, int]],
           dra: Mapping[str, NodeDevices] | None = None) -> tuple[Offer, ...]:
    """Offers per (resource, product), sorted, from the nodes and the requests bound to each node.

    On a node that also has NVIDIA DRA devices, ``nvidia.com/gpu`` free is at most the node's whole
    free GPUs with claims counted in (the same GPUs, counted once: ``placement.dracount``)."""
    sums: dict[tuple[str, str], list[int]] = {}
    memory: dict[tuple[str, str], int | None] = {}
    for node in nodes:
        used = requested.get(node.name, {})
        devices = (dra or {}).get(node.name)
        whole = None if devices is None else dracount.node_load(node, dict(used), None, devices).free_gpus
        unit_memory = dict(node.unit_memory_mib)
        for resource, allocatable in node.allocatable:
            if not is_gpu_resource(resource) or allocatable <= 0:
                continue
            key = (resource, node.product)
            free = 0 if node.unschedulable else max(0, allocatable - used.get(resource, 0))
            if whole is not None and is_plugin_gpu(resource):
                free = min(free, whole)
            total = sums.setdefault(key, [0, 0, 0])
            total[0] += allocatable
            total[1] += free
            total[2] += 1
            mib = unit_memory.get(resource)
            if key not in memory:
                memory[key] = mib
            else:
                known = memory[key]
                memory[key] = None if known is None or mib is None else min(known, mib)
    return tuple(Offer(resource=resource, product=product, memory_mib=memory[(resource, product)],
                       allocatable=total[0], free=total[1], nodes=total[2])
                 for (resource, product), total in sorted(sums.items()))


def dra_offers(nodes: Iterable[NodeInfo], requested: Mapping[str, Mapping[str, int]],
               dra: Mapping[str, NodeDevices]) -> tuple[DraOffer, ...]:
    """DRA offers per (DeviceClass, productName), sorted, over the known nodes with NVIDIA DRA devices.

    A cordoned node's devices count, none of them free. ``gpu.nvidia.com`` free on a node is its
    whole free GPUs with device-plugin pods counted in (``dracount.node_load``), so on a node both
    stacks serve the two views agree on what is left."""
    sums: dict[tuple[str, str], list[int]] = {}
    memory: dict[tuple[str, str], int | None] = {}
    seen: dict[tuple[str, str], set[str]] = {}
    for node in nodes:
        devices = dra.get(node.name)
        if devices is None or not devices.devices:
            continue
        whole = dracount.node_load(node, dict(requested.get(node.name, {})), None, devices).free_gpus
        free_by_class: dict[str, int] = {}
        for device in devices.devices:
            key = (device.device_class, device.product)
            total = sums.setdefault(key, [0, 0])
            total[0] += 1
            if device.free and not node.unschedulable:
                free_by_class[device.device_class] = free_by_class.get(device.device_class, 0) + 1
                total[1] += 1
            seen.setdefault(key, set()).add(node.name)
            mib = None if device.memory_bytes is None else device.memory_bytes // MIB
            if key not in memory:
                memory[key] = mib
            else:
                known = memory[key]
                memory[key] = None if known is None or mib is None else min(known, mib)
        # Whole GPUs that device-plugin pods take on this node are not free for claims either.
        gpu_free = free_by_class.get(DRA_GPU_CLASS, 0)
        if gpu_free > whole:
            sums[(DRA_GPU_CLASS, devices.product)][1] -= gpu_free - whole
    return tuple(DraOffer(device_class=cls, product=product, memory_mib=memory[(cls, product)], devices=total[0],
                          free=total[1], nodes=len(seen[(cls, product)]))
                 for (cls, product), total in sorted(sums.items()))


def default_priority_class(global_defaults: Mapping[str, bool]) -> str | None:
    """The PriorityClass marked ``globalDefault`` (the API server admits one; if a race let two in,
    the first by name, which is stable across replicas)."""
    marked = sorted(name for name, is_default in global_defaults.items() if is_default)
    return marked[0] if marked else None


def content(nodes: Iterable[NodeInfo], requested: Mapping[str, Mapping[str, int]],
            global_defaults: Mapping[str, bool], type_pressure: Mapping[str, float] | None = None,
            dra: Mapping[str, NodeDevices] | None = None) -> Content:
    nodes = list(nodes)
    return Content(offers=offers(nodes, requested, dra), default_priority_class=default_priority_class(global_defaults),
                   type_pressure=tuple(sorted((type_pressure or {}).items())),
                   dra_offers=dra_offers(nodes, requested, dra or {}))


def document(found: Content, *, generated_at: datetime) -> inventory.InventoryDocument:
    """The GPUInventory for ``found``, stamped ``generated_at`` (the format: ``kube.inventory.build``)."""
    return inventory.build(Inventory(default_priority_class=found.default_priority_class, generated_at=generated_at,
                                     offers=found.offers, dra_offers=found.dra_offers,
                                     type_pressure=found.type_pressure))


serialize = inventory.serialize
"""Stable text of a document (``kube.inventory.serialize``), kept here for the publisher's callers."""
