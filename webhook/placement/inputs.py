"""What the extender knows: each node as the API shows it, and the pods bound to it (typed, frozen).

What one pod asks is ``webhook.kube.demand.PodDemand`` (read by ``demand.of_pod``), the value the
admission core, the balancer and the replay read too.

A node is its allocatable (cpu, memory, physical GPUs, MIG slices), its GPU product label, and the
pods bound to it in bind order. Which GPU each pod holds is not in the API; ``devices`` replays
the device plugin's rule over that order, so ``left`` (thousandths left per physical GPU) is a
model, exact when the modelled policy is the one the device plugin runs.

Units are Kubernetes' own, read once at the boundary: cpu in millicores, memory in bytes, GPUs
as device counts; a time-sliced share as the thousandths of one GPU it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from webhook.kube.demand import Counts, PodDemand
from webhook.placement import devices
from webhook.placement.devices import MILLI, DevicePolicy, Serves


@dataclass(frozen=True, slots=True)
class Bound:
    """One pod on a node: its key (namespace/name or uid), demand and the GPUs the model gave it."""

    key: str
    demand: PodDemand
    devices: tuple[int, ...] = ()
    taken: tuple[int, ...] = ()
    """Thousandths held per GPU, in device order, when the API says where (DRA claims): ``NodeView.hold``."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node's allocatable and what its bound pods take; ``bind`` and ``release`` return new views.

    ``left`` is thousandths left per physical GPU (the device model). ``ordered``: the node's GPUs
    are DRA devices, which the scheduler allocates first fit in device order (``devices``'s
    ``first``): pods without a claim's answer are modelled so, and the signature keeps that order.
    The derived fields are
    computed once per view, since the extender reads them for every candidate of every call:
    ``signature`` is ``left`` without empty GPUs, sorted high to low (all the fragment measure
    reads of the GPUs, and its memo key), ``gpu_free`` its sum.
    """

    name: str
    cpu: int
    memory: int = 0
    product: str = ""
    gpus: int = 0
    mig: Counts = ()
    cpu_requested: int = 0
    memory_requested: int = 0
    mig_requested: Counts = ()
    left: tuple[int, ...] = ()
    pods: tuple[Bound, ...] = ()
    ordered: bool = False
    serves: Serves = "any"
    """Which pod shapes its GPUs take (``devices.Serves``): whole GPUs, time-sliced shares, or any."""
    cpu_left: int = field(init=False)
    memory_left: int = field(init=False)
    gpu_free: int = field(init=False)
    signature: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cpu_left", self.cpu - self.cpu_requested)
        object.__setattr__(self, "memory_left", self.memory - self.memory_requested)
        object.__setattr__(self, "gpu_free", sum(self.left))
        object.__setattr__(self, "signature", devices.ordered_signature(self.left) if self.ordered
                           else devices.signature(self.left))

    @classmethod
    def empty(cls, name: str, *, cpu: int, memory: int = 0, product: str = "", gpus: int = 0,
              mig: Counts = (), ordered: bool = False, serves: Serves = "any") -> NodeView:
        """A node with nothing bound."""
        return cls(name=name, cpu=cpu, memory=memory, product=product, gpus=gpus, mig=tuple(sorted(mig)),
                   left=(MILLI,) * gpus, ordered=ordered, serves=serves)

    def mig_free(self, resource: str) -> int:
        return dict(self.mig).get(resource, 0) - dict(self.mig_requested).get(resource, 0)

    def bind(self, key: str, demand: PodDemand, policy: DevicePolicy = "distributed") -> NodeView:
        """The node with one more pod, its GPUs chosen as the device plugin would.

        A pod whose GPUs the model cannot place (the view is behind the cluster) is kept with
        none, so its cpu and memory still count and a later release stays exact.
        """
        taken: tuple[int, ...] = ()
        left = self.left
        if demand.uses_devices:
            found = devices.allocate(self.left, demand.gpus, demand.share_milli, "first" if self.ordered else policy)
            if found is not None:
                taken, left = found
        mig = self.mig_requested
        if demand.extended:
            merged = dict(mig)
            for resource, count in demand.extended:
                merged[resource] = merged.get(resource, 0) + count
            mig = tuple(sorted(merged.items()))
        return replace(self, cpu_requested=self.cpu_requested + demand.cpu,
                       memory_requested=self.memory_requested + demand.memory_bytes, mig_requested=mig,
                       left=left, pods=self.pods + (Bound(key, demand, taken),))

    def hold(self, key: str, taken: tuple[int, ...]) -> NodeView:
        """The node with ``taken`` thousandths held per GPU (device order) under ``key``: what DRA
        claims hold, where the API says which device (no model needed). Capped at what is left."""
        held = tuple(min(max(0, amount), free) for amount, free in zip(taken, self.left, strict=False))
        left = tuple(free - amount for free, amount in zip(self.left, held + (0,) * len(self.left), strict=False))
        return replace(self, left=left, pods=self.pods + (Bound(key, PodDemand(), (), held),))

    def release(self, key: str) -> NodeView:
        """The node without the pod ``key`` (unchanged when it is not here): its GPUs are free again."""
        gone = next((bound for bound in self.pods if bound.key == key), None)
        if gone is None:
            return self
        demand = gone.demand
        left = list(self.left)
        for index, amount in enumerate(gone.taken):
            left[index] += amount
        for index in gone.devices:
            left[index] += MILLI if demand.gpus else demand.share_milli
        mig = dict(self.mig_requested)
        for resource, count in demand.extended:
            mig[resource] = mig.get(resource, 0) - count
        return replace(self, cpu_requested=self.cpu_requested - demand.cpu,
                       memory_requested=self.memory_requested - demand.memory_bytes,
                       mig_requested=tuple(sorted((r, n) for r, n in mig.items() if n > 0)),
                       left=tuple(left), pods=tuple(bound for bound in self.pods if bound.key != key))

    def resized(self, *, cpu: int, memory: int, product: str, gpus: int, mig: Counts = (),
                policy: DevicePolicy = "distributed", ordered: bool = False, serves: Serves = "any") -> NodeView:
        """The node with a new allocatable, its pods bound again in their order (the device model replayed)."""
        node = NodeView.empty(self.name, cpu=cpu, memory=memory, product=product, gpus=gpus, mig=mig, ordered=ordered,
                              serves=serves)
        for bound in self.pods:
            node = node.hold(bound.key, bound.taken) if bound.taken else node.bind(bound.key, bound.demand, policy)
        return node
