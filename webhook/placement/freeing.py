"""What it takes to free room for one pod on one node, in the extender's model of the node (pure).

A node is a ``placement.inputs.NodeView``: its allocatable, its bound pods in bind order, and what
each GPU has left under the device plugin's rule (``placement.devices``), the model the extender
scores with. ``fits`` asks whether a pod fits the view as kube-scheduler's NodeResourcesFit
would (cpu, memory, whole GPUs or a share's GPU, MIG slices), plus the pod's GPU products and what
the node's GPUs serve. ``cheapest`` finds the fewest pods to evict so that it does: a pod asks for
whole GPUs, for room on one GPU (a share), or for slices, and only GPUs whose every holder may go
can be emptied, so the choice is per GPU.

Pods move in units (a distributed job's pods all together, or a pod alone): evicting one pod of a
unit evicts all of it, wherever its other pods run, and costs that many pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from webhook.kube.demand import PodDemand
from webhook.placement import devices
from webhook.placement.devices import MILLI, DevicePolicy
from webhook.placement.inputs import Bound, NodeView


def may_host(view: NodeView, demand: PodDemand) -> bool:
    """Whether the node could ever take the pod: its products, what its GPUs serve, how many it has."""
    if demand.gpus or demand.share_milli:
        if not view.gpus or demand.gpus > view.gpus:
            return False
        if demand.products and view.product not in demand.products:
            return False
        if not devices.takes(view.serves, demand.share_milli if not demand.gpus else MILLI):
            return False
    return all(dict(view.mig).get(resource, 0) >= count for resource, count in demand.extended)


def fits(view: NodeView, demand: PodDemand, policy: DevicePolicy = "distributed") -> bool:
    """The pod fits the view now (``may_host`` and what is left)."""
    if view.cpu_left < demand.cpu or view.memory_left < demand.memory_bytes or not may_host(view, demand):
        return False
    if any(view.mig_free(resource) < count for resource, count in demand.extended):
        return False
    if not (demand.gpus or demand.share_milli):
        return True
    return devices.allocate(view.left, demand.gpus, demand.share_milli, "first" if view.ordered else policy) \
        is not None


def held(bound: Bound, gpu: int) -> int:
    """Thousandths ``bound`` holds on GPU ``gpu`` (its share, a whole GPU, or what a DRA claim took)."""
    if bound.taken:
        return bound.taken[gpu] if gpu < len(bound.taken) else 0
    if gpu not in bound.devices:
        return 0
    return MILLI if bound.demand.gpus else bound.demand.share_milli


@dataclass(frozen=True, slots=True)
class Room:
    """What a node offers now, and at most once every pod that may go is gone: a quick bound that
    rules a node out before ``cheapest`` looks at it."""

    whole_now: int
    whole_most: int
    share_now: int
    share_most: int
    cpu_now: int
    cpu_most: int
    memory_now: int
    memory_most: int


def holders(view: NodeView) -> list[list[Bound]]:
    """Per GPU, the pods holding part of it."""
    found: list[list[Bound]] = [[] for _ in view.left]
    for bound in view.pods:
        gpus = [gpu for gpu, amount in enumerate(bound.taken) if amount] if bound.taken else bound.devices
        for gpu in gpus:
            if gpu < len(found):
                found[gpu].append(bound)
    return found


def room(view: NodeView, may_go: Mapping[str, object]) -> Room:
    """The node's ``Room`` when the pods keyed in ``may_go`` may be evicted."""
    whole_now = whole_most = share_now = share_most = 0
    for gpu, on in enumerate(holders(view)):
        left = view.left[gpu]
        freed = left + sum(held(b, gpu) for b in on if b.key in may_go)
        whole_now += left >= MILLI
        whole_most += freed >= MILLI
        share_now, share_most = max(share_now, left), max(share_most, freed)
    going = [b.demand for b in view.pods if b.key in may_go]
    return Room(whole_now=whole_now, whole_most=whole_most, share_now=share_now, share_most=share_most,
                cpu_now=view.cpu_left, cpu_most=view.cpu_left + sum(d.cpu for d in going),
                memory_now=view.memory_left, memory_most=view.memory_left + sum(d.memory_bytes for d in going))


def could_fit(found: Room, demand: PodDemand, *, now: bool) -> bool:
    """``Room``'s bound: False means the pod cannot fit (now, or after any eviction on the node)."""
    if demand.cpu > (found.cpu_now if now else found.cpu_most) or \
            demand.memory_bytes > (found.memory_now if now else found.memory_most):
        return False
    if demand.gpus:
        return (found.whole_now if now else found.whole_most) >= demand.gpus
    if demand.share_milli:
        return (found.share_now if now else found.share_most) >= demand.share_milli
    return True


def cheapest(view: NodeView, demand: PodDemand, unit_of: Mapping[str, str], sizes: Mapping[str, int],
             policy: DevicePolicy = "distributed") -> tuple[str, ...] | None:
    """The units (``unit_of``: pod key -> unit, for the pods that may go; ``sizes``: pods per unit)
    whose eviction lets the pod fit, fewest pods first, or None when no choice does."""
    if not may_host(view, demand):
        return None
    per_gpu = holders(view)
    chosen: set[str] = set()
    if demand.gpus:
        found = _whole(view, per_gpu, demand.gpus, unit_of, sizes)
    elif demand.share_milli:
        found = _share(view, per_gpu, demand.share_milli, unit_of, sizes)
    else:
        found = _slices(view, demand, unit_of, sizes)
    if found is None:
        return None
    chosen |= found
    after = _without(view, chosen, unit_of)
    spare = sorted((b for b in after.pods if b.key in unit_of), key=lambda b: (-b.demand.cpu, b.key))
    for bound in spare:
        if after.cpu_left >= demand.cpu and after.memory_left >= demand.memory_bytes:
            break
        chosen.add(unit_of[bound.key])
        after = _without(view, chosen, unit_of)
    if not fits(after, demand, policy):
        return None
    return tuple(sorted(chosen))


def _without(view: NodeView, units: set[str], unit_of: Mapping[str, str]) -> NodeView:
    for bound in view.pods:
        if unit_of.get(bound.key) in units:
            view = view.release(bound.key)
    return view


def _units(pods: list[Bound], unit_of: Mapping[str, str]) -> set[str] | None:
    """The units holding these pods, or None when one of them may not go."""
    found = set()
    for bound in pods:
        unit = unit_of.get(bound.key)
        if unit is None:
            return None
        found.add(unit)
    return found


def _whole(view: NodeView, per_gpu: list[list[Bound]], count: int, unit_of: Mapping[str, str],
           sizes: Mapping[str, int]) -> set[str] | None:
    """Empty GPUs until ``count`` are free: each step takes the GPU whose emptying adds the fewest
    pods to evict (exact when each pod holds one GPU, as shares and single-GPU pods do)."""
    free = sum(1 for left in view.left if left >= MILLI)
    options = []
    for gpu, on in enumerate(per_gpu):
        if view.left[gpu] >= MILLI:
            continue
        units = _units(on, unit_of)
        if units is not None:
            options.append((gpu, units))
    chosen: set[str] = set()
    while free < count:
        if not options:
            return None
        best = min(options, key=lambda o: (sum(sizes[u] for u in o[1] - chosen), o[0]))
        options.remove(best)
        chosen |= best[1]
        free += 1
    return chosen


def _share(view: NodeView, per_gpu: list[list[Bound]], milli: int, unit_of: Mapping[str, str],
           sizes: Mapping[str, int]) -> set[str] | None:
    """Room for ``milli`` on one GPU: per GPU the largest holders that may go first (the fewest pods
    for that GPU), then the GPU that needs the fewest."""
    best: tuple[int, int, set[str]] | None = None
    for gpu, on in enumerate(per_gpu):
        left = view.left[gpu]
        units: set[str] = set()
        if left < milli:
            movable = sorted((b for b in on if b.key in unit_of), key=lambda b: (-held(b, gpu), b.key))
            for bound in movable:
                units.add(unit_of[bound.key])
                left = view.left[gpu] + sum(held(b, gpu) for b in on if unit_of.get(b.key) in units)
                if left >= milli:
                    break
        if left >= milli:
            cost = sum(sizes[u] for u in units)
            if best is None or (cost, gpu) < best[:2]:
                best = (cost, gpu, units)
    return None if best is None else best[2]


def _slices(view: NodeView, demand: PodDemand, unit_of: Mapping[str, str],
            sizes: Mapping[str, int]) -> set[str] | None:
    """MIG slices: per resource short, the holders of most slices that may go, until enough are free."""
    chosen: set[str] = set()
    for resource, count in demand.extended:
        short = count - view.mig_free(resource)
        holding = sorted(((dict(b.demand.extended).get(resource, 0), b.key) for b in view.pods
                          if b.key in unit_of and dict(b.demand.extended).get(resource, 0)), reverse=True)
        for slices, key in holding:
            if short <= 0:
                break
            if unit_of[key] not in chosen:
                chosen.add(unit_of[key])
                short -= slices
        if short > 0:
            return None
    return chosen
