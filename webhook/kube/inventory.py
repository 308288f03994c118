"""What the cluster offers, as the balancer publishes it for the webhook (which has no API access). Pure.

The balancer writes a ``GPUInventory`` document (JSON) into the ``gpugate-inventory`` ConfigMap; the
webhook reads it as a mounted file. Missing, unreadable or stale, it is simply absent (``EMPTY``) and
every rule that uses it falls back to what the policy alone says: an inventory can refine an
answer, never be the reason for a denial.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypedDict

API_VERSION = "gpugate.io/v1alpha1"
KIND = "GPUInventory"
MAX_AGE_SECONDS = 300
"""How old an inventory may be and still steer (the balancer rewrites it every 60 s): the right-sizing
ladder's default ``maxInventoryAgeSeconds`` and the pack strategy's product relief."""


class InventoryError(ValueError):
    """The document is not a GPUInventory this version understands."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Summed:
    """What both kinds of offer count for one GPU product, summed over the nodes offering it."""

    product: str = ""
    """``nvidia.com/gpu.product`` of the nodes (with ``-MIG-<profile>`` under the single MIG strategy), or
    the DRA devices' ``productName`` attribute."""
    memory_mib: int | None = None
    """The smallest memory of one unit or device (MiB: ``nvidia.com/gpu.memory``,
    ``nvidia.com/mig-<profile>.memory``, a device's ``memory`` capacity); None when some node does not say."""
    free: int = 0
    """Units no bound, unfinished pod requests; devices no claim holds and that are allocatable now
    (a MIG partition of a GPU in use is not)."""
    nodes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer(Summed):
    """What the cluster's nodes offer of one GPU resource for one GPU product."""

    resource: str
    allocatable: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DraOffer(Summed):
    """What the nodes' NVIDIA DRA driver offers of one DeviceClass for one GPU product.

    The same GPUs as a device-plugin ``Offer`` on a node that runs both stacks: two views, each
    ``free`` net of what the other stack's pods or claims hold (``placement.dracount``)."""

    device_class: str
    """``gpu.nvidia.com`` or ``mig.nvidia.com``."""
    devices: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Inventory:
    default_priority_class: str | None = None
    """The PriorityClass marked ``globalDefault``: the API server's Priority plugin writes its name
    into every pod that names none, before any webhook runs, so a pod carrying it did not choose it."""
    generated_at: datetime | None = None
    offers: tuple[Offer, ...] = ()
    dra_offers: tuple[DraOffer, ...] = ()
    type_pressure: tuple[tuple[str, float], ...] = ()
    """(GPU product, pressure) sorted by product: how much the pods pinned to GPU products need each,
    relative to its GPUs (``webhook.placement.scoring.pressures``; 1.0: pinned pods alone would take
    all of it). Learned by the balancer from the pods it sees bind; absent without its extender."""

    def pressured(self, at_least: float) -> tuple[str, ...]:
        """The GPU products whose type pressure is ``at_least`` or more, sorted."""
        return tuple(product for product, value in self.type_pressure if value >= at_least)

    def fresh(self, now: datetime | None, max_age_seconds: float) -> bool:
        """Recent enough to steer by: written, and (when the caller has a clock) not older than the bound."""
        if self.generated_at is None:
            return False
        return now is None or (now - self.generated_at).total_seconds() <= max_age_seconds


EMPTY = Inventory()


class SummedDocument(TypedDict):
    """What ``offers`` and ``draOffers`` entries both hold (:class:`Summed`)."""

    product: str
    memoryMiB: int | None
    free: int
    nodes: int


class OfferDocument(SummedDocument):
    """One entry of ``offers``."""

    resource: str
    allocatable: int


class DraOfferDocument(SummedDocument):
    """One entry of ``draOffers``."""

    deviceClass: str
    devices: int


class InventoryDocument(TypedDict):
    """A GPUInventory (``gpugate.io/v1alpha1``)."""

    apiVersion: str
    kind: str
    generatedAt: str | None
    defaultPriorityClass: str | None
    offers: list[OfferDocument]
    draOffers: list[DraOfferDocument]
    typePressure: dict[str, float]


def build(found: Inventory) -> InventoryDocument:
    """The GPUInventory document that :func:`parse` reads back as ``found`` (``generatedAt`` in UTC,
    milliseconds, ``Z``); the one writer of the format."""
    when = found.generated_at
    stamp = None if when is None else when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return InventoryDocument(
        apiVersion=API_VERSION, kind=KIND, generatedAt=stamp, defaultPriorityClass=found.default_priority_class,
        offers=[OfferDocument(resource=o.resource, product=o.product, memoryMiB=o.memory_mib,
                              allocatable=o.allocatable, free=o.free, nodes=o.nodes) for o in found.offers],
        draOffers=[DraOfferDocument(deviceClass=o.device_class, product=o.product, memoryMiB=o.memory_mib,
                                    devices=o.devices, free=o.free, nodes=o.nodes) for o in found.dra_offers],
        typePressure=dict(found.type_pressure))


def serialize(doc: InventoryDocument) -> str:
    """Stable text (sorted keys, indented), so equal documents are equal bytes and a diff reads well."""
    return json.dumps(doc, sort_keys=True, indent=1) + "\n"


def parse(data: bytes | str) -> Inventory:
    """A GPUInventory document; InventoryError naming the problem otherwise."""
    try:
        document: Any = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise InventoryError(f"not JSON: {err}") from err
    if not isinstance(document, dict):
        raise InventoryError("expected a JSON object")
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        raise InventoryError(f"expected apiVersion {API_VERSION} and kind {KIND}, got "
                             f"{document.get('apiVersion')!r} {document.get('kind')!r}")
    default = document.get("defaultPriorityClass")
    if default is not None and not isinstance(default, str):
        raise InventoryError("defaultPriorityClass: expected a string or null")
    generated = document.get("generatedAt")
    try:
        when = datetime.fromisoformat(generated.replace("Z", "+00:00")) if isinstance(generated, str) else None
    except ValueError as err:
        raise InventoryError(f"generatedAt: {err}") from err
    return Inventory(default_priority_class=default or None, generated_at=when, offers=_offers(document),
                     type_pressure=_pressure(document), dra_offers=_dra_offers(document))


def _pressure(document: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    raw = document.get("typePressure") or {}
    if not isinstance(raw, dict):
        raise InventoryError("typePressure: expected an object of GPU product -> number")
    out = []
    for product, value in raw.items():
        if not product or not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise InventoryError(f"typePressure[{product!r}]: expected a number >= 0")
        out.append((product, float(value)))
    return tuple(sorted(out))


def _entries(document: dict[str, Any], field: str, name_key: str,
             number_keys: tuple[str, ...]) -> list[tuple[dict[str, Any], dict[str, int | None]]]:
    """The objects of list ``field``, each with a string ``name_key`` and whole numbers >= 0 (or null)."""
    raw = document.get(field) or []
    if not isinstance(raw, list):
        raise InventoryError(f"{field}: expected a list")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get(name_key), str):
            raise InventoryError(f"{field}[{i}]: expected an object with a {name_key}")
        numbers: dict[str, int | None] = {}
        for key in number_keys:
            value = item.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise InventoryError(f"{field}[{i}].{key}: expected a whole number >= 0")
            numbers[key] = value
        out.append((item, numbers))
    return out


def _offers(document: dict[str, Any]) -> tuple[Offer, ...]:
    return tuple(Offer(resource=item["resource"], product=str(item.get("product") or ""),
                       memory_mib=n["memoryMiB"], allocatable=n["allocatable"] or 0, free=n["free"] or 0,
                       nodes=n["nodes"] or 0)
                 for item, n in _entries(document, "offers", "resource", ("allocatable", "free", "nodes", "memoryMiB")))


def _dra_offers(document: dict[str, Any]) -> tuple[DraOffer, ...]:
    return tuple(DraOffer(device_class=item["deviceClass"], product=str(item.get("product") or ""),
                          memory_mib=n["memoryMiB"], devices=n["devices"] or 0, free=n["free"] or 0,
                          nodes=n["nodes"] or 0)
                 for item, n in _entries(document, "draOffers", "deviceClass",
                                         ("devices", "free", "nodes", "memoryMiB")))
