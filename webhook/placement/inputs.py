"""What the extender knows: a pod's demand and each node as the API shows it (typed, frozen).

A node is its allocatable (cpu, memory, physical GPUs, MIG slices), its GPU product label, and the
pods bound to it in bind order. Which GPU each pod holds is not in the API; ``devices`` replays
the device plugin's rule over that order, so ``left`` (thousandths left per physical GPU) is a
model, exact when the modelled policy is the one the device plugin runs.

Units are Kubernetes' own, read once at the boundary: cpu in millicores, memory in bytes, GPUs
as device counts; a time-sliced share as the thousandths of one GPU it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from webhook import names
from webhook.kube import affinity as node_affinity
from webhook.kube import pods, units
from webhook.kube.quantity import bytes_, millicores
from webhook.kube.resources import is_gpu_resource, is_mig_resource
from webhook.placement import devices
from webhook.placement.devices import MILLI, DevicePolicy

Counts = tuple[tuple[str, int], ...]
"""(resource, count) pairs sorted by resource: MIG slices."""

DEFAULT_SLOT_MILLI = units.slot_milli(units.DEFAULT_SLOT_REPLICAS)
"""A time-sliced slot's share of its GPU when nothing says otherwise (``units.DEFAULT_SLOT_REPLICAS``)."""


def request_amount(resource: str, value: Any) -> int:
    """A request as the scheduler counts it: millicores, bytes, or whole devices. Raises QuantityError."""
    if resource == "cpu":
        return millicores(value)
    if resource == "memory":
        return bytes_(value)
    return pods.gpu_amount(resource, value)


@dataclass(frozen=True, slots=True)
class PodDemand:
    """What one pod asks of a node, in the units the score compares.

    ``gpus`` whole GPUs (``nvidia.com/gpu``), or one time-sliced share of ``share_milli``
    thousandths (``nvidia.com/gpu.shared``), or MIG slices; ``products`` the GPU products its
    required node affinity allows (empty: any), which decides which nodes its shape can use.
    """

    cpu: int = 0
    memory: int = 0
    gpus: int = 0
    share_milli: int = 0
    mig: Counts = ()
    products: frozenset[str] = frozenset()

    @property
    def gpu_milli(self) -> int:
        """GPU thousandths the pod takes (whole GPUs or its share)."""
        return self.gpus * MILLI + self.share_milli

    @property
    def uses_devices(self) -> bool:
        return bool(self.gpus or self.share_milli)


def _products(pod: pods.Pod) -> frozenset[str]:
    """GPU products the pod's nodeSelector and required node affinity allow (empty: any).

    Terms are ORed: the pod is limited only if every term limits ``nvidia.com/gpu.product`` with
    ``In`` (the union of their values). Other operators leave it unlimited: the set only weighs
    which nodes a pod shape can use in the fragment measure; the scheduler's filter decides fit.
    """
    selection = node_affinity.parse(pods.spec(pod))
    selected = dict(selection.node_selector).get(names.NVIDIA_PRODUCT_LABEL)
    if selected is not None:
        return frozenset({selected})
    if not selection.required:
        return frozenset()
    allowed: set[str] = set()
    for term in selection.required:
        values = [r.values for r in term.expressions if r.key == names.NVIDIA_PRODUCT_LABEL and r.operator == "In"]
        if not values:
            return frozenset()
        allowed.update(values[0])
    return frozenset(allowed)


def demand_from_pod(pod: pods.Pod, *, slot_milli: int = DEFAULT_SLOT_MILLI) -> PodDemand:
    """Read a Pod (the ExtenderArgs' pod, or one from the watch) into its demand.

    Requests by Kubernetes' own rule (``pods.effective_requests``). A pod asking for several
    time-sliced slots is modelled as one share of their sum on one GPU (gpugate's notebooks
    policy allows one slot). Raises QuantityError for a quantity that is not valid.
    """
    amounts = pods.effective_requests(pod, include=lambda r: r in ("cpu", "memory") or is_gpu_resource(r),
                                      amount=request_amount)
    slots = amounts.get(names.SHARED_GPU_RESOURCE, 0)
    return PodDemand(cpu=amounts.get("cpu", 0), memory=amounts.get("memory", 0),
                     gpus=amounts.get(names.GPU_RESOURCE, 0), share_milli=min(MILLI, slots * slot_milli),
                     mig=tuple(sorted((r, n) for r, n in amounts.items() if is_mig_resource(r))),
                     products=_products(pod))


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
              mig: Counts = (), ordered: bool = False) -> NodeView:
        """A node with nothing bound."""
        return cls(name=name, cpu=cpu, memory=memory, product=product, gpus=gpus, mig=tuple(sorted(mig)),
                   left=(MILLI,) * gpus, ordered=ordered)

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
        if demand.mig:
            merged = dict(mig)
            for resource, count in demand.mig:
                merged[resource] = merged.get(resource, 0) + count
            mig = tuple(sorted(merged.items()))
        return replace(self, cpu_requested=self.cpu_requested + demand.cpu,
                       memory_requested=self.memory_requested + demand.memory, mig_requested=mig,
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
        for resource, count in demand.mig:
            mig[resource] = mig.get(resource, 0) - count
        return replace(self, cpu_requested=self.cpu_requested - demand.cpu,
                       memory_requested=self.memory_requested - demand.memory,
                       mig_requested=tuple(sorted((r, n) for r, n in mig.items() if n > 0)),
                       left=tuple(left), pods=tuple(bound for bound in self.pods if bound.key != key))

    def resized(self, *, cpu: int, memory: int, product: str, gpus: int, mig: Counts = (),
                policy: DevicePolicy = "distributed", ordered: bool = False) -> NodeView:
        """The node with a new allocatable, its pods bound again in their order (the device model replayed)."""
        node = NodeView.empty(self.name, cpu=cpu, memory=memory, product=product, gpus=gpus, mig=mig, ordered=ordered)
        for bound in self.pods:
            node = node.hold(bound.key, bound.taken) if bound.taken else node.bind(bound.key, bound.demand, policy)
        return node
