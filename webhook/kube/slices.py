"""What a node offers through DRA: ResourceSlice devices, typed once (pure).

A DRA driver publishes its devices in ResourceSlices (``resource.k8s.io/v1``). Kubernetes' own
types are in ``k8s.io/api/resource/v1/types.go`` (``ResourceSliceSpec``: ``driver``, ``pool``
``{name, generation, resourceSliceCount}``, ``nodeName``, ``devices``, ``sharedCounters``;
``Device``: ``name``, ``attributes``, ``capacity``, ``consumesCounters``,
``allowMultipleAllocations``). What NVIDIA's driver puts in them, read from
kubernetes-sigs/dra-driver-nvidia-gpu:

- the driver is ``gpu.nvidia.com`` and the pool is named after the node, one pool per node
  (``cmd/gpu-kubelet-plugin/driver.go``, ``GenerateDriverResources``);
- a full GPU is ``gpu-<minor>`` with attributes ``type: gpu``, ``uuid``, ``productName``,
  ``brand``, ``architecture`` (strings) and ``cudaComputeCapability``, ``driverVersion``,
  ``cudaDriverVersion`` (versions), and a ``memory`` capacity in bytes
  (``cmd/gpu-kubelet-plugin/deviceinfo.go``: ``Attributes``, ``GetDevice``;
  ``partitions.go``: ``fullGpuCapacity``);
- a MIG device is ``gpu-<minor>-mig-<profile without dots>-<profile id>-<placement start>``
  with ``type: mig``, ``parentUUID``, ``profile`` (``1g.10gb``) and its parent's product,
  architecture and versions, and capacities ``memory``, ``multiprocessors``, engines
  (``mig.go``: ``ToCanonicalName``, ``CommonAttributesMig``, ``CommonCapacitiesMig``);
- with partitionable devices (dynamic MIG), each MIG-capable GPU has one counter set
  ``gpu-<minor>-counter-set`` in ``sharedCounters`` (its capacities as counters plus one
  ``memory-slice-<i>`` counter per memory slice) and every device of that GPU, the full GPU
  included, ``consumesCounters`` from it (``partitions.go``: ``PartSharedCounterSets``,
  ``PartConsumesCounters``); from Kubernetes 1.35 the counter sets sit in a slice of their own
  (``generateSplitResourceSlices``).

Attribute names in a slice are usually unqualified: they are then in the driver's domain, the
way a CEL selector reads them (``device.attributes['gpu.nvidia.com'].productName``).
:func:`Device.attribute` reads either spelling. Quantities stay the strings the API server
stored (so a slice renders back byte for byte) and are read as integers where counted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from webhook import names
from webhook.kube.devicetaints import DeviceTaint, parse_taints
from webhook.kube.quantity import QuantityError, bytes_

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
AttributeKind = Literal["string", "int", "bool", "version"]
ATTRIBUTE_KINDS: tuple[AttributeKind, ...] = ("string", "int", "bool", "version")
Amounts = tuple[tuple[str, str], ...]
"""(name, quantity as the API server wrote it) sorted by name: capacities, counters."""

GPU_TYPE = "gpu"
MIG_TYPE = "mig"
CLASS_OF_TYPE = {GPU_TYPE: names.DRA_GPU_CLASS, MIG_TYPE: names.DRA_MIG_CLASS}
"""The DeviceClass whose CEL selector picks a device of this ``type`` from ``gpu.nvidia.com``: the
chart's selectors are exactly ``device.driver == 'gpu.nvidia.com' &&
device.attributes['gpu.nvidia.com'].type == '<type>'``, so this lookup is that selector."""


class SliceError(ValueError):
    """A ResourceSlice document this module cannot read; the message names the field."""


# ---- the wire (only the keys read here) ---------------------------------------------------------
class CounterWire(TypedDict):
    value: str


class CounterSetWire(TypedDict):
    name: str
    counters: dict[str, CounterWire]


class CounterConsumptionWire(TypedDict):
    counterSet: str
    counters: dict[str, CounterWire]


class CapacityWire(TypedDict, total=False):
    value: str


class DeviceWire(TypedDict, total=False):
    name: str
    attributes: dict[str, dict[str, Any]]
    capacity: dict[str, CapacityWire]
    consumesCounters: list[CounterConsumptionWire]
    allowMultipleAllocations: bool
    taints: list[dict[str, str]]


class PoolWire(TypedDict):
    name: str
    generation: int
    resourceSliceCount: int


class SliceSpecWire(TypedDict, total=False):
    driver: str
    pool: PoolWire
    nodeName: str
    devices: list[DeviceWire]
    sharedCounters: list[CounterSetWire]


class ResourceSliceWire(TypedDict):
    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    spec: SliceSpecWire


# ---- the domain --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Attribute:
    """One device attribute: its kind (the one key of ``DeviceAttribute`` that is set) and value."""

    kind: AttributeKind
    value: str | int | bool


@dataclass(frozen=True, slots=True)
class CounterUse:
    """What a device takes from one counter set while it is allocated (``DeviceCounterConsumption``)."""

    counter_set: str
    counters: Amounts


@dataclass(frozen=True, slots=True)
class CounterSet:
    """Shared counters of a partitionable device (``CounterSet``): what its partitions draw from."""

    name: str
    counters: Amounts


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a ResourceSlice."""

    name: str
    attributes: tuple[tuple[str, Attribute], ...] = ()
    capacity: Amounts = ()
    consumes: tuple[CounterUse, ...] = ()
    multiple_allocations: bool = False
    """``allowMultipleAllocations`` (consumable capacity): several claims may share the device."""
    taints: tuple[DeviceTaint, ...] = ()
    """What the driver tainted the device with (NVIDIA's: ``gpu.nvidia.com/xid=<n>`` on an XID)."""

    def attribute(self, name: str, driver: str = names.DRA_DRIVER) -> str | int | bool | None:
        """The value of attribute ``name``, spelled bare or qualified by ``driver``'s domain."""
        found = dict(self.attributes)
        attr = found.get(name) or found.get(f"{driver}/{name}")
        return None if attr is None else attr.value

    def text(self, name: str) -> str:
        value = self.attribute(name)
        return value if isinstance(value, str) else ""

    @property
    def type(self) -> str:
        """``gpu`` or ``mig`` for NVIDIA's driver (its ``type`` attribute)."""
        return self.text("type")

    @property
    def product(self) -> str:
        return self.text(names.DRA_PRODUCT_ATTRIBUTE)

    @property
    def uuid(self) -> str:
        return self.text("uuid")

    @property
    def parent_uuid(self) -> str:
        return self.text("parentUUID")

    @property
    def profile(self) -> str:
        """A MIG device's profile as NVIDIA spells it, e.g. ``1g.10gb``; empty for a full GPU."""
        return self.text(names.DRA_PROFILE_ATTRIBUTE)

    @property
    def memory_bytes(self) -> int | None:
        """The ``memory`` capacity, or None when the device announces none."""
        value = dict(self.capacity).get(names.DRA_MEMORY_CAPACITY)
        return None if value is None else amount(value)


@dataclass(frozen=True, slots=True)
class Slice:
    """One ResourceSlice: part of a driver's pool of devices on one node."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node: str
    """``spec.nodeName``; empty for a slice of network-attached devices (``allNodes``, ``nodeSelector``)."""
    devices: tuple[Device, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()


@functools.lru_cache(maxsize=4096)
def amount(text: str) -> int:
    """A capacity or counter quantity as a whole number (bytes for memory), rounded up. Memoized:
    a cluster's slices and claims repeat a few quantities, and every recount reads them again."""
    return bytes_(text)


def device_class(device: Device, driver: str) -> str | None:
    """The NVIDIA DeviceClass (``gpu.nvidia.com`` or ``mig.nvidia.com``) that selects ``device``, if any."""
    if driver != names.DRA_DRIVER:
        return None
    return CLASS_OF_TYPE.get(device.type)


# ---- parse -------------------------------------------------------------------------------------
def parse(obj: Any) -> Slice:
    """A ResourceSlice's JSON as a :class:`Slice`; SliceError naming the field that is wrong."""
    if not isinstance(obj, dict):
        raise SliceError("expected a ResourceSlice object")
    meta = _mapping(obj.get("metadata"), "metadata")
    spec = _mapping(obj.get("spec"), "spec")
    pool = _mapping(spec.get("pool"), "spec.pool")
    devices = tuple(_device(d, f"spec.devices[{i}]") for i, d in enumerate(_list(spec.get("devices"), "spec.devices")))
    counters = tuple(CounterSet(name=_text(c.get("name"), f"spec.sharedCounters[{i}].name"),
                                counters=_counters(c.get("counters"), f"spec.sharedCounters[{i}].counters"))
                     for i, c in enumerate(_mappings(spec.get("sharedCounters"), "spec.sharedCounters")))
    return Slice(name=str(meta.get("name") or ""), driver=_text(spec.get("driver"), "spec.driver"),
                 pool=_text(pool.get("name"), "spec.pool.name"),
                 generation=_whole(pool.get("generation", 0), "spec.pool.generation"),
                 slice_count=_whole(pool.get("resourceSliceCount", 1), "spec.pool.resourceSliceCount"),
                 node=str(spec.get("nodeName") or ""), devices=devices, shared_counters=counters)


def _device(raw: Any, where: str) -> Device:
    item = _mapping(raw, where)
    attributes = []
    for key, value in sorted(_mapping(item.get("attributes"), f"{where}.attributes").items()):
        value = _mapping(value, f"{where}.attributes[{key}]")
        kinds = [k for k in ATTRIBUTE_KINDS if k in value]
        if len(kinds) != 1:
            raise SliceError(f"{where}.attributes[{key}]: expected exactly one of {', '.join(ATTRIBUTE_KINDS)}")
        attributes.append((key, _attribute(kinds[0], value[kinds[0]], f"{where}.attributes[{key}]")))
    capacity = tuple(sorted((key, _quantity(_mapping(c, f"{where}.capacity[{key}]").get("value"),
                                             f"{where}.capacity[{key}].value"))
                            for key, c in _mapping(item.get("capacity"), f"{where}.capacity").items()))
    consumes = tuple(CounterUse(counter_set=_text(c.get("counterSet"), f"{where}.consumesCounters[{i}].counterSet"),
                                counters=_counters(c.get("counters"), f"{where}.consumesCounters[{i}].counters"))
                     for i, c in enumerate(_mappings(item.get("consumesCounters"), f"{where}.consumesCounters")))
    return Device(name=_text(item.get("name"), f"{where}.name"), attributes=tuple(attributes), capacity=capacity,
                  consumes=consumes, multiple_allocations=item.get("allowMultipleAllocations") is True,
                  taints=parse_taints(item.get("taints")))


def _attribute(kind: AttributeKind, value: Any, where: str) -> Attribute:
    wanted: type = {"string": str, "version": str, "int": int, "bool": bool}[kind]
    if not isinstance(value, (str, int, bool)) or not isinstance(value, wanted) or \
            (kind == "int" and isinstance(value, bool)):
        raise SliceError(f"{where}.{kind}: expected a {wanted.__name__}, got {value!r}")
    return Attribute(kind=kind, value=value)


def _counters(raw: Any, where: str) -> Amounts:
    return tuple(sorted((name, _quantity(_mapping(c, f"{where}[{name}]").get("value"), f"{where}[{name}].value"))
                        for name, c in _mapping(raw, where).items()))


def _quantity(value: Any, where: str) -> str:
    text = _text(value, where)
    try:
        amount(text)
    except QuantityError as err:
        raise SliceError(f"{where}: {err}") from err
    return text


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SliceError(f"{where}: expected an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise SliceError(f"{where}: expected a list")
    return value


def _mappings(value: Any, where: str) -> list[dict[str, Any]]:
    return [_mapping(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where))]


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise SliceError(f"{where}: expected a non-empty string")
    return value


def _whole(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SliceError(f"{where}: expected a whole number >= 0")
    return value


# ---- render ------------------------------------------------------------------------------------
def render(found: Slice) -> ResourceSliceWire:
    """The ResourceSlice JSON for ``found`` (what a driver would create; ``parse`` reads it back)."""
    spec = SliceSpecWire(driver=found.driver, pool=PoolWire(name=found.pool, generation=found.generation,
                                                            resourceSliceCount=found.slice_count))
    if found.node:
        spec["nodeName"] = found.node
    if found.devices:
        spec["devices"] = [render_device(d) for d in found.devices]
    if found.shared_counters:
        spec["sharedCounters"] = [CounterSetWire(name=c.name, counters=_render_amounts(c.counters))
                                  for c in found.shared_counters]
    return ResourceSliceWire(apiVersion=API_VERSION, kind=KIND, metadata={"name": found.name}, spec=spec)


def render_device(device: Device) -> DeviceWire:
    out = DeviceWire(name=device.name)
    if device.attributes:
        out["attributes"] = {key: {attr.kind: attr.value} for key, attr in device.attributes}
    if device.capacity:
        out["capacity"] = {key: CapacityWire(value=value) for key, value in device.capacity}
    if device.consumes:
        out["consumesCounters"] = [CounterConsumptionWire(counterSet=c.counter_set,
                                                          counters=_render_amounts(c.counters))
                                   for c in device.consumes]
    if device.multiple_allocations:
        out["allowMultipleAllocations"] = True
    if device.taints:
        out["taints"] = [{k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect),
                                            ("timeAdded", t.time_added)) if v} for t in device.taints]
    return out


def _render_amounts(amounts: Amounts) -> dict[str, CounterWire]:
    return {key: CounterWire(value=value) for key, value in amounts}
