"""Per node: the GPUs a DRA driver offers, which allocated claims hold, and which are free (pure).

The one place that combines ResourceSlices (``kube.slices``) and ResourceClaims (``kube.allocations``);
the balancer's labels, its GPUInventory and the extender's fragmentation score all read the
:class:`NodeDevices` this computes, so they agree on every device.

Rules, each the scheduler's own (``k8s.io/dynamic-resource-allocation/structured``):

- only the newest generation of a pool counts: a driver that republishes bumps
  ``pool.generation`` and the older slices are stale until deleted;
- a device is taken while a claim holds it (``allocations.Claim.held``);
- shared counters: a device that ``consumesCounters`` fits only while every counter it draws on
  has that much left after what the held devices of the same pool drew. For NVIDIA's
  partitionable GPUs that is what makes a whole GPU unavailable once one MIG partition of it is
  allocated, and a partition unavailable once the whole GPU is;
- without counters (static MIG), a MIG device's parent GPU (``parentUUID``) is not whole-free
  while the MIG device is held;
- consumable capacity (``allowMultipleAllocations``, KEP-5075): several claims may hold one device,
  each consuming part of its ``memory`` capacity (``consumedCapacity``); what is left is the
  capacity minus what the holding claims consumed (``DeviceState.memory_left``). A held device is
  never whole-free, whatever is left of it.

Units: a full GPU device is one ``nvidia.com/gpu``; a MIG device of profile ``<g>g.<mem>gb`` is one
``nvidia.com/mig-<g>g.<mem>gb``, the device plugin's name for the same slice, so every rule that
weighs a unit against a physical GPU (``placement.marks.gpu_weight``) reads DRA devices unchanged.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from webhook import names
from webhook.kube import allocations, slices
from webhook.kube.allocations import DeviceKey

Counts = tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class DeviceState:
    """One device of a node's current slices, and whether claims leave it usable."""

    key: DeviceKey
    device_class: str
    """``gpu.nvidia.com`` or ``mig.nvidia.com`` (``slices.device_class``)."""
    unit: str
    """The device plugin's resource name for the same unit: ``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``."""
    product: str
    memory_bytes: int | None
    held: bool
    free: bool
    """Not held and allocatable now (counters left, parent GPU not partly taken)."""
    uuid: str = ""
    parent_uuid: str = ""
    shared: bool = False
    """``allowMultipleAllocations``: claims share the device by its capacity."""
    memory_left: int | None = None
    """Bytes of ``memory`` capacity no holding claim consumed (None: the device announces none)."""


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """What the DRA driver offers on one node, after the claims that hold devices there."""

    node: str
    devices: tuple[DeviceState, ...] = ()

    @property
    def gpus(self) -> int:
        """Physical GPUs: the full-GPU devices, plus MIG parents the driver publishes no full device for
        (a GPU in static MIG mode offers only its MIG devices)."""
        whole = {d.uuid or d.key.device for d in self.devices if d.device_class == names.DRA_GPU_CLASS}
        parents = {d.parent_uuid for d in self.devices if d.device_class == names.DRA_MIG_CLASS and d.parent_uuid}
        return len(whole) + len(parents - whole)

    @property
    def whole_free(self) -> int:
        """Full GPUs a claim for one ``gpu.nvidia.com`` device could get now."""
        return sum(1 for d in self.devices if d.device_class == names.DRA_GPU_CLASS and d.free)

    @property
    def held_units(self) -> Counts:
        """Held devices per unit (device-plugin resource name), sorted."""
        return tuple(sorted(Counter(d.unit for d in self.devices if d.held).items()))

    @property
    def product(self) -> str:
        """The product of the node's GPUs (the first device's; a node carries one GPU model)."""
        return next((d.product for d in self.devices if d.product), "")


def unit_of(device: slices.Device) -> str:
    """The device plugin's resource name for the unit ``device`` is (see the module docstring)."""
    if device.type == slices.MIG_TYPE and device.profile:
        return names.MIG_RESOURCE_PREFIX + device.profile.replace("+", ".")
    return names.GPU_RESOURCE


def current(found: Iterable[slices.Slice]) -> list[slices.Slice]:
    """The slices of each pool's newest generation (older ones are stale until their driver deletes them)."""
    found = list(found)
    newest: dict[tuple[str, str], int] = {}
    for s in found:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    return [s for s in found if s.generation == newest[(s.driver, s.pool)]]


def held_keys(found: Iterable[allocations.Claim]) -> frozenset[DeviceKey]:
    """Every device some claim holds now."""
    return frozenset(r.key for claim in found for r in claim.held())


def consumed_memory(result: allocations.Allocated) -> int:
    """The ``memory`` one held result consumes of a shared device (0 when it names none)."""
    value = dict(result.consumed).get(names.DRA_MEMORY_CAPACITY)
    return 0 if value is None else slices.amount(value)


def consumed_by_key(found: Iterable[allocations.Claim]) -> dict[DeviceKey, int]:
    """Per device, the ``memory`` the claims holding it consumed (consumable capacity)."""
    out: dict[DeviceKey, int] = {}
    for claim in found:
        for result in claim.held():
            used = consumed_memory(result)
            if used:
                out[result.key] = out.get(result.key, 0) + used
    return out


def by_node(found: Iterable[slices.Slice], held: frozenset[DeviceKey],
            consumed: Mapping[DeviceKey, int] | None = None) -> dict[str, NodeDevices]:
    """NodeDevices for every node that has NVIDIA DRA devices in ``found``'s newest generations;
    ``consumed``: memory bytes the holding claims consumed per shared device (``consumed_by_key``)."""
    live = [s for s in current(found) if s.driver == names.DRA_DRIVER]
    # Counter sets are per pool; from Kubernetes 1.35 they are published in a slice of their own.
    left: dict[tuple[str, str], dict[str, int]] = {}
    for s in live:
        for counter_set in s.shared_counters:
            left[(s.pool, counter_set.name)] = {n: slices.amount(v) for n, v in counter_set.counters}
    placed: list[tuple[slices.Slice, slices.Device, DeviceKey]] = []
    taken_parents: set[str] = set()
    for s in live:
        for device in s.devices:
            key = DeviceKey(s.driver, s.pool, device.name)
            placed.append((s, device, key))
            if key in held:
                for use in device.consumes:
                    counters = left.setdefault((s.pool, use.counter_set), {})
                    for name, value in use.counters:
                        counters[name] = counters.get(name, 0) - slices.amount(value)
                if device.parent_uuid:
                    taken_parents.add(device.parent_uuid)
    devices: dict[str, list[DeviceState]] = defaultdict(list)
    for s, device, key in placed:
        device_class = slices.device_class(device, s.driver)
        if device_class is None or not s.node:
            continue
        is_held = key in held
        fits = all(left.get((s.pool, use.counter_set), {}).get(name, 0) >= slices.amount(value)
                   for use in device.consumes for name, value in use.counters)
        parent_taken = device_class == names.DRA_GPU_CLASS and device.uuid in taken_parents
        memory = device.memory_bytes
        memory_left = memory
        if memory is not None and is_held:
            memory_left = max(0, memory - (consumed or {}).get(key, 0)) if device.multiple_allocations else 0
        devices[s.node].append(DeviceState(
            key=key, device_class=device_class, unit=unit_of(device), product=device.product,
            memory_bytes=memory, held=is_held, free=not is_held and fits and not parent_taken,
            uuid=device.uuid, parent_uuid=device.parent_uuid, shared=device.multiple_allocations,
            memory_left=memory_left))
    return {node: NodeDevices(node=node, devices=tuple(sorted(found, key=lambda d: d.key.device)))
            for node, found in devices.items()}


def nodes_of(found: Iterable[slices.Slice], keys: Iterable[DeviceKey]) -> set[str]:
    """The nodes whose slices publish any of ``keys`` (a claim's change matters to these only)."""
    pools: dict[tuple[str, str], set[str]] = defaultdict(set)
    for s in found:
        if s.node:
            pools[(s.driver, s.pool)].add(s.node)
    out: set[str] = set()
    for key in keys:
        out |= pools.get((key.driver, key.pool), set())
    return out
