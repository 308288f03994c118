"""The GPUInventory the balancer publishes for the webhook's right-sizing (pure: no I/O, no clock).

The webhook has no API access; what the cluster offers now reaches it as a document the balancer
computes from the caches it already keeps (nodes and the GPU requests of bound, unfinished pods)
and writes into the ``gpugate-inventory`` ConfigMap. The format is the one
``webhook.kube.inventory.parse`` reads: one offer per (GPU resource, GPU product), summed over the
nodes offering it, the PriorityClass marked ``globalDefault``, and when it was computed.

Rules (each decides what the webhook may conclude, so each errs towards "not offered"):

- only GPU resources (``webhook.kube.resources.is_gpu_resource``): an SR-IOV function is no GPU;
- a cordoned node offers nothing free (its allocatable still counts, so an offer does not vanish
  from the document while a node drains);
- ``free`` per node is allocatable minus requested, never below 0 (a node whose allocatable
  shrank under running pods);
- ``memoryMiB`` is the smallest unit memory among the offer's nodes: an offer promises at least
  that much per unit; unknown (no GFD label on some node) makes it unknown, so the webhook does not
  rule a whole GPU in or out by memory it cannot vouch for.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypedDict

from webhook.balancer.state import NodeInfo
from webhook.kube import inventory
from webhook.kube.inventory import Offer
from webhook.kube.resources import is_gpu_resource


class OfferDocument(TypedDict):
    """One entry of ``offers``, as ``webhook.kube.inventory.parse`` reads it."""

    resource: str
    product: str
    memoryMiB: int | None
    allocatable: int
    free: int
    nodes: int


class InventoryDocument(TypedDict):
    """A GPUInventory (``gpugate.io/v1alpha1``)."""

    apiVersion: str
    kind: str
    generatedAt: str
    defaultPriorityClass: str | None
    offers: list[OfferDocument]
    typePressure: dict[str, float]


@dataclass(frozen=True, slots=True)
class Content:
    """Everything the document says except when: two equal contents need no new write."""

    offers: tuple[Offer, ...]
    default_priority_class: str | None
    type_pressure: tuple[tuple[str, float], ...] = ()
    """Per GPU product, as ``webhook.kube.inventory.Inventory.type_pressure`` (from the extender's mix)."""


def offers(nodes: Iterable[NodeInfo], requested: Mapping[str, Mapping[str, int]]) -> tuple[Offer, ...]:
    """Offers per (resource, product), sorted, from the nodes and the requests bound to each node."""
    sums: dict[tuple[str, str], list[int]] = {}
    memory: dict[tuple[str, str], int | None] = {}
    for node in nodes:
        used = requested.get(node.name, {})
        unit_memory = dict(node.unit_memory_mib)
        for resource, allocatable in node.allocatable:
            if not is_gpu_resource(resource) or allocatable <= 0:
                continue
            key = (resource, node.product)
            free = 0 if node.unschedulable else max(0, allocatable - used.get(resource, 0))
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


def default_priority_class(global_defaults: Mapping[str, bool]) -> str | None:
    """The PriorityClass marked ``globalDefault`` (the API server admits one; if a race let two in,
    the first by name, which is stable across replicas)."""
    marked = sorted(name for name, is_default in global_defaults.items() if is_default)
    return marked[0] if marked else None


def content(nodes: Iterable[NodeInfo], requested: Mapping[str, Mapping[str, int]],
            global_defaults: Mapping[str, bool], type_pressure: Mapping[str, float] | None = None) -> Content:
    return Content(offers=offers(nodes, requested), default_priority_class=default_priority_class(global_defaults),
                   type_pressure=tuple(sorted((type_pressure or {}).items())))


def document(found: Content, *, generated_at: datetime) -> InventoryDocument:
    """The GPUInventory for ``found``, stamped ``generated_at`` (UTC, milliseconds, ``Z``)."""
    stamp = generated_at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return InventoryDocument(
        apiVersion=inventory.API_VERSION, kind=inventory.KIND, generatedAt=stamp,
        defaultPriorityClass=found.default_priority_class,
        offers=[OfferDocument(resource=o.resource, product=o.product, memoryMiB=o.memory_mib,
                              allocatable=o.allocatable, free=o.free, nodes=o.nodes) for o in found.offers],
        typePressure=dict(found.type_pressure))


def serialize(doc: InventoryDocument) -> str:
    """Stable text (sorted keys, indented), so equal documents are equal bytes and a diff reads well."""
    return json.dumps(doc, sort_keys=True, indent=1) + "\n"
