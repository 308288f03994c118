"""What the extender reads of DRA: GPUs held per device from ResourceSlices and claims, and a
share claim's size (pure).

The balancer's ``Feed`` and the replay's DRA world both call these on ``kube.nodedevices`` values
(the one place that combines slices and allocated claims), so the measure sees DRA-held GPUs the
same way in both.

A full GPU device that a claim holds without sharing is taken whole. A shared device
(``allowMultipleAllocations``, consumable capacity) is taken by the ``memory`` its claims
consumed, as thousandths of its capacity rounded up (a claim of exactly a quarter of the memory is
250). A share claim asks ``capacity.requests.memory``; its size is that memory over the memory of
the devices it may get. A claim written for several products (one ``firstAvailable`` sub-request
per product, each asking the same fraction of that product's memory) has one size: the first
sub-request's over its product's memory.
"""

from __future__ import annotations

from collections.abc import Mapping

from webhook import names
from webhook.kube import claims, slices
from webhook.kube.nodedevices import NodeDevices
from webhook.placement.devices import MILLI


def device_index(name: str) -> tuple[int, str]:
    """Sort key of NVIDIA's device names, ``gpu-<minor>``, by minor (others after, by name)."""
    prefix, _, minor = name.rpartition("-")
    return (int(minor), "") if prefix == "gpu" and minor.isdigit() else (1 << 30, name)


def taken_milli(devices: NodeDevices) -> tuple[int, ...]:
    """Per full-GPU device in device order, the thousandths claims hold (0: free, 1000: whole)."""
    full = sorted((d for d in devices.devices if d.device_class == names.DRA_GPU_CLASS),
                  key=lambda d: device_index(d.key.device))
    out = []
    for device in full:
        if not device.held and device.free:
            out.append(0)
        elif device.shared and device.memory_bytes and device.memory_left is not None:
            used = device.memory_bytes - device.memory_left
            out.append(min(MILLI, -(-used * MILLI // device.memory_bytes)))
        else:
            out.append(MILLI)
    return tuple(out)


def share_milli(ask: claims.ClaimAsk, memory_of: Mapping[str, int]) -> int:
    """Thousandths of a GPU a share claim asks (0: not a memory share).

    ``memory_of``: memory bytes per sub-request (or request) name, the memory of the product the
    sub-request selects. Only the claim's first request is read (a share claim has one)."""
    if not ask.requests:
        return 0
    for device_ask in ask.requests[0].alternatives:
        memory = dict(device_ask.capacity).get(names.DRA_MEMORY_CAPACITY)
        total = memory_of.get(device_ask.name.rsplit("/", 1)[-1])
        if memory is None or not total:
            continue
        return min(MILLI, -(-slices.amount(memory) * MILLI // total))
    return 0
