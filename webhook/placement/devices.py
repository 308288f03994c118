"""Which physical GPU the NVIDIA device plugin hands a pod: the model the extender needs.

The API shows that a pod holds ``nvidia.com/gpu.shared: 1`` on a node, never which GPU the
time-sliced replica is on, yet a share's fragment depends on it. The device plugin decides at
Allocate, pod by pod in the order the kubelet admits them, so the extender replays its rule over
the node's pods in bind order:

* ``distributed`` (the device plugin's default for shared devices): the GPU with the fewest
  replicas taken, here the most left that fits (lowest index on ties); with equal slot sizes the
  two orders agree.
* ``packed`` (``flags.plugin.sharedDevicesAllocationPolicy: packed``, k8s-device-plugin PR
  #1621): the fullest GPU that fits.
* Whole GPUs (``nvidia.com/gpu: N``): the lowest-index fully free GPUs.
* ``first`` (DRA): kube-scheduler's DynamicResources allocator, which walks a node's devices in
  the order of its pool's slices and keeps the first that satisfies the request
  (kubernetes staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/
  allocator_incubating.go, the allocator used with consumable capacity: ``allocateOne`` loops
  over pools, slices and ``slice.Spec.Devices`` in order and returns on the first device
  ``allocateDevice`` accepts, which for a device with ``allowMultipleAllocations`` checks
  ``CmpRequestOverCapacity``; NVIDIA's driver publishes ``gpu-0``, ``gpu-1``, ... in minor
  order). A share is a consumable-capacity claim for its memory: the first device with that
  much left. The order of a node's GPUs then matters, not only their multiset:
  ``ordered_signature``.

The replay's cluster asks this module too, so the extender's model and the replayed device plugin
are one rule, not two copies that could drift.
"""

from __future__ import annotations

from typing import Literal

from webhook.kube import units

MILLI = units.MILLI
"""A GPU in thousandths, as the trace's ``gpu_milli`` counts it."""

DevicePolicy = Literal["distributed", "packed", "first"]
POLICIES: tuple[DevicePolicy, ...] = ("distributed", "packed", "first")

Serves = Literal["any", "whole", "shares"]
"""Which pod shapes a node's GPUs can take, as its allocatable says: a node advertising only
``nvidia.com/gpu`` takes whole GPUs only; one advertising only ``nvidia.com/gpu.shared``
(time-slicing with ``renameByDefault``, what manifests/ ship) takes shares only, one slot each;
``any``: both (a node advertising both, time-slicing without the rename, DRA devices, or the
published model where a share takes its size on any GPU)."""


def serves_of(whole: int, slots: int) -> Serves:
    """What a node takes, from its allocatable ``nvidia.com/gpu`` (``whole``) and
    ``nvidia.com/gpu.shared`` (``slots``): a pod can only land where its resource is advertised."""
    if whole and not slots:
        return "whole"
    if slots and not whole:
        return "shares"
    return "any"


def takes(serves: Serves, milli: int) -> bool:
    """Whether a node that ``serves`` so can take a pod shape of ``milli`` thousandths per GPU."""
    return serves == "any" or (milli < MILLI) == (serves == "shares")


def share_device(left: tuple[int, ...] | list[int], milli: int, policy: DevicePolicy = "distributed") -> int:
    """The GPU index a share of ``milli`` thousandths lands on, or -1 when no GPU has room."""
    chosen, best = -1, -1
    for index, free in enumerate(left):
        if free < milli:
            continue
        if policy == "first":
            return index
        # distributed: the most left (first on ties); packed: the least left (first on ties).
        if chosen < 0 or (free > best if policy == "distributed" else free < best):
            chosen, best = index, free
    return chosen


def whole_devices(left: tuple[int, ...] | list[int], count: int) -> tuple[int, ...]:
    """The lowest-index fully free GPUs (fewer than ``count`` when the node lacks them)."""
    found: list[int] = []
    for index, free in enumerate(left):
        if len(found) == count:
            break
        if free >= MILLI:
            found.append(index)
    return tuple(found)


def allocate(left: tuple[int, ...], gpus: int, share_milli: int,
             policy: DevicePolicy = "distributed") -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(devices taken, GPUs left after) for one pod, or None when it does not fit.

    ``gpus`` whole GPUs, or one share of ``share_milli`` thousandths; a pod with neither takes none.
    """
    if gpus:
        taken = whole_devices(left, gpus)
        if len(taken) < gpus:
            return None
        after = list(left)
        for index in taken:
            after[index] -= MILLI
        return taken, tuple(after)
    if share_milli:
        index = share_device(left, share_milli, policy)
        if index < 0:
            return None
        after = list(left)
        after[index] -= share_milli
        return (index,), tuple(after)
    return (), left


def after_sorted(ordered: tuple[int, ...], gpus: int, share_milli: int,
                 policy: DevicePolicy = "distributed") -> tuple[int, ...] | None:
    """What the GPUs have left after the pod, as a multiset (None: it does not fit).

    ``ordered`` is the node's GPUs with something left, sorted high to low (``signature``).
    Fragmentation depends only on that multiset, and on a multiset both rules are exact: whole
    GPUs take entries of 1000; distributed takes the largest entry, packed the smallest that fits.
    ``first`` needs the device order: ``ordered`` is then ``ordered_signature`` (device order).
    """
    if policy == "first":
        return _after_first(ordered, gpus, share_milli)
    if gpus:
        if len(ordered) < gpus or ordered[gpus - 1] < MILLI:
            return None
        return ordered[gpus:]
    if share_milli:
        if not ordered or ordered[0] < share_milli:
            return None
        if policy == "distributed":
            position = 0
        else:
            position = max(i for i, free in enumerate(ordered) if free >= share_milli)
        rest = list(ordered)
        rest[position] -= share_milli
        rest.sort(reverse=True)
        return tuple(free for free in rest if free > 0)
    return ordered


def _after_first(ordered: tuple[int, ...], gpus: int, share_milli: int) -> tuple[int, ...] | None:
    """``after_sorted`` under ``first``: the multiset left (sorted high to low) after first fit."""
    found = allocate(ordered, gpus, share_milli, "first")
    if found is None:
        return None
    return signature(found[1])


def ordered_signature(left: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The GPUs with something left, in device order: what first fit (DRA) reads of a node."""
    return tuple(free for free in left if free > 0)


def signature(left: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The GPUs with something left, sorted high to low: all the fragment measure reads of a node's GPUs."""
    return tuple(sorted((free for free in left if free > 0), reverse=True))
