"""The one table of GPU units and GPU names: what one unit of an NVIDIA resource or DRA device is of
a physical GPU, and which resource names ask GPUs at all (the device plugin's, and the DRA
extended-resource names of the DeviceClasses that can hold GPUs: ``GpuNames``). Pure.

Before this module the facts below were written out in each product: "a GPU has 7 compute
slices" in the balancer's marks, the replay's MIG twin and the policy parser; a time-sliced slot's
default size in the placement inputs and the replay; a MIG unit's share of its GPU twice, and the
two disagreed on time-sliced MIG slices (the balancer divided a slice by its own
``nvidia.com/mig-<profile>.replicas``, the replay did not). Every consumer now asks here.

The MIG-replica rule, settled: a MIG slice is ``g/7`` of its GPU; when the device plugin
time-slices MIG slices (``nvidia.com/mig-<profile>.replicas`` R > 1, resource
``nvidia.com/mig-<profile>`` or, renamed, ``nvidia.com/mig-<profile>.shared``), one unit is a slot
of that slice: ``g/7/R``. That is what the balancer counted; the replay never builds time-sliced
MIG nodes, so it reads the same numbers as before.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from webhook import names
from webhook.kube.claims import ClaimAsk
from webhook.kube.quantity import QuantityError, bytes_
from webhook.kube.resources import MIG_PATTERN, MigProfile, mig_profile
from webhook.kube.selectors import DRIVER_TERM, conjuncts, selector_bounds

COMPUTE_SLICES_PER_GPU = 7
"""Compute slices of a MIG-capable GPU (A100, H100, H200, B200; an A30 has 4, so its slices weigh a
little less than they should): a ``<g>g`` profile is g/7 of a GPU's compute."""

MILLI = 1000
"""Thousandths of one physical GPU: the unit the replay and the fragmentation score count in."""

DEFAULT_SLOT_REPLICAS = 4
"""Time-sliced slots per GPU when nothing says otherwise: the ``time-slicing-4`` device-plugin
config of manifests/gpu-operator and the starter notebook policy."""

MIB_BYTES = 2**20
MIG_GB_BYTES = 10**9
"""MIG profile names count decimal gigabytes: ``1g.10gb`` holds ``10G`` (``10Gi`` is more)."""

UnitKind = Literal["whole", "slot", "mig"]


@dataclass(frozen=True, slots=True, eq=False)
class GpuKind:
    """One GPU resource kind: which extended-resource names it covers and what one unit of it is.

    Every module outside ``webhook/kube/`` asks these rows (through the questions below) instead of
    comparing a resource name, so a new kind is one row here. Compared by identity: a row is a
    registration, and the lookup cache keys on the table."""

    name: str
    """What the kind is called in docs and errors."""
    prefix: str
    """Every name of the kind begins with this: a pod's raw JSON that holds none of the kinds'
    prefixes asks no GPU (the balancer's pre-filter)."""
    pattern: str
    """The names of the kind, as a regular expression matched whole."""
    unit: UnitKind
    """What one unit is: a whole GPU, a time-sliced slot of one, or a MIG slice."""
    plugin_gpu: bool = False
    """The device plugin's whole-GPU resource: the one that time-slicing without a rename turns into
    slots and the single MIG strategy into slices, and that the ``gpu-free`` label counts."""
    dra_class: str | None = None
    """The DeviceClass NVIDIA's DRA driver serves the same devices through (a policy that allows the
    resource allows claims of that class)."""


KINDS: tuple[GpuKind, ...] = (
    GpuKind("whole GPU", names.GPU_RESOURCE, re.escape(names.GPU_RESOURCE), "whole", plugin_gpu=True,
            dra_class=names.DRA_GPU_CLASS),
    GpuKind("time-sliced share", names.SHARED_GPU_RESOURCE, re.escape(names.SHARED_GPU_RESOURCE), "slot",
            dra_class=names.DRA_GPU_CLASS),
    GpuKind("MIG slice", names.MIG_RESOURCE_PREFIX, MIG_PATTERN, "mig", dra_class=names.DRA_MIG_CLASS),
)
"""The GPU resource kinds: every resource name that asks a GPU is one of these rows' names."""


@functools.lru_cache(maxsize=4096)
def _kind_in(kinds: tuple[GpuKind, ...], resource: str) -> GpuKind | None:
    return next((k for k in kinds if resource.startswith(k.prefix) and re.fullmatch(k.pattern, resource)), None)


def kind_of(resource: str | None) -> GpuKind | None:
    """The row of :data:`KINDS` that ``resource`` is a name of; None for every other resource (and for
    no resource: a policy's MIG rung names a profile, not a resource)."""
    return None if resource is None else _kind_in(KINDS, resource)


def is_gpu_resource(resource: str | None) -> bool:
    """True for every GPU resource kind's names (whole GPUs, shares, MIG slices); false for every
    other extended resource (an SR-IOV function is ``nvidia.com/`` too)."""
    return kind_of(resource) is not None


def is_plugin_gpu(resource: str | None) -> bool:
    """The device plugin's whole-GPU resource (:attr:`GpuKind.plugin_gpu`)."""
    return getattr(kind_of(resource), "plugin_gpu", False)


def is_shared(resource: str | None) -> bool:
    """A time-sliced slot of a GPU (not a MIG slice's slot, which is a MIG unit)."""
    return getattr(kind_of(resource), "unit", None) == "slot"


def is_mig(resource: str | None) -> bool:
    """A MIG slice, time-sliced or not."""
    return getattr(kind_of(resource), "unit", None) == "mig"


def pooled(resource: str | None) -> bool:
    """Drawn from a node's one pool of devices: the device plugin's whole GPU and its time-sliced
    share (a scheduler model weighs both against the node's GPUs)."""
    return is_plugin_gpu(resource) or is_shared(resource)


def by_name(resource: str | None) -> bool:
    """A GPU resource counted under its own name (MIG slices, any kind but the device plugin's whole
    GPU and its share): a pod's ``PodDemand.extended``, a node's per-resource counts for placement."""
    return is_gpu_resource(resource) and not pooled(resource)


def name_prefixes() -> tuple[str, ...]:
    """What every GPU resource name begins with, one per kind."""
    return tuple(dict.fromkeys(kind.prefix for kind in KINDS))


def gpu_resource_pattern() -> str:
    """Every GPU resource name as one regular expression (``webhook/policy/schema.json``'s
    ``resource`` pattern is this string for the built-in kinds; a test holds them equal)."""
    return "^(?:" + "|".join(kind.pattern for kind in KINDS) + ")$"


@dataclass(frozen=True, slots=True)
class Unit:
    """What one unit of a GPU extended resource is: a whole GPU, a time-sliced slot, or a MIG slice."""

    resource: str
    kind: UnitKind
    mig: MigProfile | None = None
    """The profile of a MIG unit (also of a time-sliced MIG slice, ``...gb.shared``)."""

    @property
    def compute(self) -> float:
        """Share of a GPU's compute one unit gives when not time-sliced: 1 whole, g/7 for a MIG slice.
        A slot gives a share that depends on the node's replicas (:func:`gpu_share`)."""
        if self.mig is not None:
            return min(self.mig.compute / COMPUTE_SLICES_PER_GPU, 1.0)
        return 1.0


def unit_of(resource: str) -> Unit | None:
    """The unit of a GPU extended resource; None for every other resource."""
    kind = kind_of(resource)
    if kind is None:
        return None
    return Unit(resource, kind.unit, mig_profile(resource) if kind.unit == "mig" else None)


def mig_base(resource: str) -> str:
    """``nvidia.com/mig-1g.10gb.shared`` -> ``nvidia.com/mig-1g.10gb``: the slice a time-sliced MIG unit
    is a slot of."""
    return resource.removesuffix(".shared")


def gpu_share(resource: str, *, replicas: int = 1, mig_replicas: int = 1, gpu_time_sliced: bool = False) -> float:
    """How much of a physical GPU one unit of ``resource`` is (0 for a resource that is no GPU).

    ``replicas``: ``nvidia.com/gpu.replicas`` of the node (slots per GPU); ``gpu_time_sliced``: the
    node time-slices without renaming, so ``nvidia.com/gpu`` counts slots; ``mig_replicas``:
    ``nvidia.com/mig-<profile>.replicas`` of that profile (the MIG-replica rule of the module docstring).
    """
    unit = unit_of(resource)
    if unit is None:
        return 0.0
    if unit.kind == "whole":
        return 1.0 / max(replicas, 1) if gpu_time_sliced and is_plugin_gpu(resource) else 1.0
    if unit.kind == "slot":
        return 1.0 / max(replicas, 1)
    return unit.compute / max(mig_replicas, 1)


def share_milli(resource: str, count: int = 1, *, replicas: int = 1, mig_replicas: int = 1,
                gpu_time_sliced: bool = False) -> int:
    """Thousandths of physical GPUs that ``count`` units take, each unit rounded to a thousandth first
    (a 1g slice is 143, so seven of them are 1001: the replay's accounting, kept)."""
    return count * round(MILLI * gpu_share(resource, replicas=replicas, mig_replicas=mig_replicas,
                                           gpu_time_sliced=gpu_time_sliced))


def slot_milli(replicas: int = DEFAULT_SLOT_REPLICAS) -> int:
    """Thousandths of its GPU one time-sliced slot stands for: :func:`share_milli`'s rounding, so the
    extender's and the replay's slot is the balancer's (it was ``MILLI // replicas``, a thousandth
    short of the balancer's for 6 and 7 replicas)."""
    return share_milli(names.SHARED_GPU_RESOURCE, 1, replicas=replicas)


def mig_memory_bytes(profile: MigProfile) -> int:
    """The memory a MIG profile's name promises (decimal GB): what right-sizing counts a slice as."""
    return profile.memory_gb * MIG_GB_BYTES


def mig_resource(profile_name: str) -> str:
    """``1g.10gb`` -> ``nvidia.com/mig-1g.10gb``: the resource a MIG rung or device profile is."""
    return f"{names.MIG_RESOURCE_PREFIX}{profile_name}"


def mig_profile_of_name(profile_name: str) -> MigProfile | None:
    """``1g.10gb`` (a policy's ``mig:`` rung, a DRA device's ``profile`` attribute) -> its MigProfile."""
    return mig_profile(mig_resource(profile_name))


# --- every GPU resource name, the DRA extended-resource names included ------------------------------
# Kubernetes 1.37 (DRA extended-resource mapping, GA) serves a pod's extended resource through a
# DeviceClass when no device plugin offers it on the node: every class under its implicit name
# ``deviceclass.resource.kubernetes.io/<class>``, and a class that sets ``spec.extendedResourceName``
# under that name too (k8s.io/api/resource/v1 ``ResourceDeviceClassPrefix``; the scheduler's resolver,
# k8s.io/dynamic-resource-allocation deviceclass/extendedresourcecache). A pod asking such a name asks
# devices of the class, so admission counts it as a GPU ask whenever the class can hold GPUs.

DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
"""The implicit extended-resource name of DeviceClass ``<class>`` is this prefix + the class's name."""

@dataclass(frozen=True, slots=True)
class DeviceClass:
    """What admission reads of a ``resource.k8s.io/v1`` DeviceClass."""

    name: str
    extended_resource_name: str | None = None
    selectors: tuple[str, ...] = ()
    """``spec.selectors[].cel.expression``, ANDed."""
    created: str = ""
    """``metadata.creationTimestamp`` (RFC 3339), which decides a clash of extendedResourceNames."""

    def drivers(self) -> frozenset[str]:
        """The drivers a selector restricts the class to (``device.driver == "<d>"`` in a conjunction)."""
        found = set()
        for expression in self.selectors:
            for term in conjuncts(expression):
                match = DRIVER_TERM.match(term)
                if match is not None:
                    found.add(match.group(1))
        return frozenset(found)

    def selects_gpus(self) -> bool:
        """The class may hand out NVIDIA GPUs: unless a selector restricts it to another driver
        (fail closed: a class with no selectors, or with selectors we cannot read, selects any device)."""
        drivers = self.drivers()
        return not drivers or names.DRA_DRIVER in drivers \
            or (self.extended_resource_name is not None and is_gpu_resource(self.extended_resource_name))

    @property
    def share(self) -> Fraction:
        """One device's share of a GPU: a MIG slice when the class pins a profile (a selector, or an
        ``nvidia.com/mig-<profile>`` extendedResourceName), else at most a whole GPU, counted as one."""
        bounds = selector_bounds(self.selectors)
        if bounds.mig is not None:
            return mig_fraction(bounds.mig)
        if self.extended_resource_name is not None and is_mig(self.extended_resource_name):
            return gpu_fraction(self.extended_resource_name)
        return Fraction(1)


NVIDIA_CLASSES: tuple[DeviceClass, ...] = (
    DeviceClass(names.DRA_GPU_CLASS, names.GPU_RESOURCE,
                (f"device.driver == '{names.DRA_DRIVER}' && device.attributes['{names.DRA_DRIVER}'].type == 'gpu'",)),
    DeviceClass(names.DRA_MIG_CLASS, None,
                (f"device.driver == '{names.DRA_DRIVER}' && device.attributes['{names.DRA_DRIVER}'].type == 'mig'",)),
)
"""The classes NVIDIA's DRA driver chart installs (deployments/helm/dra-driver-nvidia-gpu/templates/
deviceclass-{gpu,mig}.yaml): what admission assumes until it has read the cluster's."""


class DeviceClassError(ValueError):
    """A DeviceClass document that is not the shape ``resource.k8s.io/v1`` defines; names the field."""


def device_class(document: Any) -> DeviceClass:
    """A DeviceClass object (JSON, as the API server serves it) read into a :class:`DeviceClass`."""
    if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
        raise DeviceClassError("expected a DeviceClass object with metadata")
    meta = document["metadata"]
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise DeviceClassError("metadata.name: expected a non-empty string")
    spec = document.get("spec") or {}
    if not isinstance(spec, dict):
        raise DeviceClassError(f"DeviceClass {name}: spec is not an object")
    extended = spec.get("extendedResourceName")
    if extended is not None and not isinstance(extended, str):
        raise DeviceClassError(f"DeviceClass {name}: spec.extendedResourceName is not a string")
    raw = spec.get("selectors") or []
    if not isinstance(raw, list):
        raise DeviceClassError(f"DeviceClass {name}: spec.selectors is not a list")
    selectors = []
    for i, selector in enumerate(raw):
        cel = selector.get("cel") if isinstance(selector, dict) else None
        expression = cel.get("expression") if isinstance(cel, dict) else None
        if not isinstance(expression, str):
            raise DeviceClassError(f"DeviceClass {name}: spec.selectors[{i}].cel.expression is not a string")
        selectors.append(expression)
    return DeviceClass(name=name, extended_resource_name=extended or None, selectors=tuple(selectors),
                       created=str(meta.get("creationTimestamp") or ""))


@dataclass(frozen=True, slots=True)
class DeviceClasses:
    """The DeviceClasses of a cluster, as admission knows them."""

    classes: tuple[DeviceClass, ...] = NVIDIA_CLASSES
    learned: bool = False
    """Read from the cluster (else the NVIDIA chart's classes, assumed)."""

    @classmethod
    def from_documents(cls, documents: Any) -> DeviceClasses:
        """A list of DeviceClass objects (a LIST's ``items``); DeviceClassError names a bad one."""
        if not isinstance(documents, list):
            raise DeviceClassError("expected a list of DeviceClass objects")
        return cls(classes=tuple(sorted((device_class(d) for d in documents), key=lambda c: c.name)), learned=True)

    def get(self, name: str) -> DeviceClass | None:
        return next((c for c in self.classes if c.name == name), None)

    def serving(self, resource: str) -> tuple[DeviceClass, ...]:
        """Every class kube-scheduler may serve extended resource ``resource`` through: the class
        its implicit name names, or each class that sets it as ``extendedResourceName`` (of two,
        the scheduler picks the newer; admission counts whichever gives more)."""
        if resource.startswith(DEVICE_CLASS_PREFIX):
            found = self.get(resource[len(DEVICE_CLASS_PREFIX):])
            return (found,) if found is not None else ()
        return tuple(c for c in self.classes if c.extended_resource_name == resource)


ASSUMED = DeviceClasses()
"""No class read from a cluster: the NVIDIA chart's two."""


@dataclass(frozen=True, slots=True)
class GpuName:
    """A resource name a container asks that is a GPU ask, and what one unit of it is."""

    resource: str
    share: Fraction
    """One unit's share of a GPU (whole 1, a slot 1/4, a MIG slice g/7)."""
    device_class: str | None = None
    """For a DRA extended-resource name: the DeviceClass it is served through."""
    known: bool = True
    """False for ``deviceclass.resource.kubernetes.io/<class>`` of a class admission does not know:
    judged as a GPU ask (one whole GPU per unit) rather than let through."""


@dataclass(frozen=True, slots=True)
class GpuNames:
    """Which resource names are GPU asks: the device plugin's, and the DRA extended-resource names
    of every class that can hold GPUs (``governed``), or of a class not known at all."""

    classes: DeviceClasses = ASSUMED
    governed: frozenset[str] = frozenset({names.DRA_GPU_CLASS, names.DRA_MIG_CLASS})

    def of(self, resource: str) -> GpuName | None:
        """The GPU ask ``resource`` is, or None for any other resource (cpu, a NIC's)."""
        if "/" not in resource:
            return None  # cpu, memory, ephemeral-storage, hugepages-*: never a GPU
        if is_gpu_resource(resource):
            return GpuName(resource, gpu_fraction(resource))
        serving = self.classes.serving(resource)
        if resource.startswith(DEVICE_CLASS_PREFIX) and not serving:
            return GpuName(resource, Fraction(1), resource[len(DEVICE_CLASS_PREFIX):], known=False)
        gpus = [c for c in serving if c.name in self.governed]
        if not gpus:
            return None
        widest = max(gpus, key=lambda c: c.share)
        return GpuName(resource, widest.share, widest.name)


NVIDIA_NAMES = GpuNames()
"""The GPU names before any class is read: the device plugin's and the NVIDIA chart's classes'."""


def gpu_names(classes: DeviceClasses = ASSUMED, listed: frozenset[str] = frozenset()) -> GpuNames:
    """The GPU names for ``classes``: governed are the NVIDIA chart's classes, those ``listed`` (a
    policy's ``claims.deviceClasses``) and every known class that can select NVIDIA GPUs."""
    governed = {names.DRA_GPU_CLASS, names.DRA_MIG_CLASS, *listed}
    governed.update(c.name for c in classes.classes if c.selects_gpus())
    return GpuNames(classes=classes, governed=frozenset(governed))


def gpu_fraction(resource: str) -> Fraction:
    """:func:`gpu_share` exactly, for a policy's ``max``: a slot of ``DEFAULT_SLOT_REPLICAS``, a MIG
    slice g/7 (a time-sliced MIG slot counts as its whole slice); 0 for a resource that is no GPU."""
    unit = unit_of(resource)
    if unit is None:
        return Fraction(0)
    if unit.kind == "slot":
        return Fraction(1, DEFAULT_SLOT_REPLICAS)
    if unit.kind == "mig" and unit.mig is not None:
        return mig_fraction(unit.mig)
    return Fraction(1)


def mig_fraction(profile: MigProfile) -> Fraction:
    return min(Fraction(profile.compute, COMPUTE_SLICES_PER_GPU), Fraction(1))


def describe(amount: Fraction) -> str:
    """GPU units as a person reads them: ``2``, ``0.25``, ``0.43``."""
    if amount.denominator == 1:
        return str(amount.numerator)
    return f"{float(amount):.2f}".rstrip("0").rstrip(".")


def device_share(device_class: str, selectors: tuple[str, ...], capacity: tuple[tuple[str, str], ...],
                 classes: DeviceClasses = ASSUMED) -> Fraction:
    """One device's share of a GPU for a DRA ask (an ``exactly`` request or a sub-request).

    The class's share (a class not known: a whole GPU), lowered only by what the ask's own selectors
    prove (:func:`selector_bounds`): a pinned MIG profile, or, on a device that allows several
    allocations, a ``capacity.requests.memory`` as its part of the least memory the selectors allow.
    """
    known = classes.get(device_class)
    share = known.share if known is not None else Fraction(1)
    bounds = selector_bounds(selectors)
    if bounds.mig is not None:
        share = min(share, mig_fraction(bounds.mig))
    memory = dict(capacity).get(names.DRA_MEMORY_CAPACITY)
    if memory is not None and bounds.shareable and bounds.min_memory_mib:
        try:
            asked = bytes_(memory)
        except QuantityError:
            return share
        share = min(share, Fraction(asked, bounds.min_memory_mib * MIB_BYTES))
    return share


def claim_units(ask: ClaimAsk, gpus: GpuNames) -> Fraction:
    """GPU units a claim or template holds at most: its requests add up; of a request's
    ``firstAvailable`` alternatives the largest counts; an ``allocationMode: All`` ask counts 0 (its
    count is unknown before allocation, and policies refuse it unless they allow it)."""
    total = Fraction(0)
    for request in ask.requests:
        total += max((a.count * device_share(a.device_class, a.selectors, a.capacity, gpus.classes)
                      for a in request.alternatives if a.device_class in gpus.governed), default=Fraction(0))
    return total
