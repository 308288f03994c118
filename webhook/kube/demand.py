"""What a pod demands, read once: the one value admission, balancer, extender and replay read. Pure.

Before this module a pod's demand had five shapes, each read from the pod by its own code: the
extender's ``PodDemand`` (cpu and memory in bytes, GPUs, a slot's share, MIG slices), the
replay's ``Demand`` (memory in MiB, ``num_gpu`` x per-GPU thousandths, scoring's non-zero
requests), the balancer's ``PodUsage`` (GPU counts less those a DRA claim serves), right-sizing's
``Ask`` (the gpu-memory / gpu-fraction labels) and the claims a pod references, walked by the DRA
core. :class:`PodDemand` holds all of it, in Kubernetes' units, and :func:`of_pod` is the only
reader; ``tests/test_layers.py`` holds that no other module reads a pod's requests for these.

What a pod asks, by kind:

- whole GPUs (``nvidia.com/gpu``): ``gpus``;
- time-sliced slots (``nvidia.com/gpu.shared``): ``slots``, and ``share_milli``, the share of one
  GPU they stand for (``units.slot_milli`` of the replicas the reader assumes, at most one GPU);
- MIG slices and any other GPU resource counted as an integer (``nvidia.com/mig-<profile>``,
  ``...gb.shared``): ``extended``;
- DRA device requests: ``claims``, the pod's ``spec.resourceClaims`` (what each claim asks is in
  the ResourceClaim or template, ``kube.claims.ClaimAsk``: :meth:`PodDemand.claim_asks` pairs
  them), and ``dra_backed``, the extended resources kube-scheduler served through a claim it made
  (extended-resource mapping), which a device plugin does not hold;
- a size to be right-sized to (``gpugate.io/gpu-memory``, ``gpugate.io/gpu-fraction``): ``size``.

Requests follow Kubernetes' own rule (``kube.pods.effective_requests``); scoring's non-zero
requests (100m / 200MB for a container that asks none) are kube-scheduler's
``pkg/scheduler/util/pod_resources.go``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from webhook import names
from webhook.kube import affinity as node_affinity
from webhook.kube import claims, pods, units
from webhook.kube.allocations import dra_backed_resources
from webhook.kube.claims import ClaimAsk, PodClaimRef
from webhook.kube.quantity import QuantityError, bytes_, millicores, quantity_problem, whole_count
from webhook.kube.units import is_gpu_resource

Counts = tuple[tuple[str, int], ...]
"""(resource, count) pairs sorted by resource."""

MIB = 2**20
DEFAULT_CPU_MILLI = 100
"""kube-scheduler's non-zero cpu request for a container that asks none (``pod_resources.go``)."""
DEFAULT_MEMORY_BYTES = 200 * 10**6
"""kube-scheduler's non-zero memory request for a container that asks none."""
DEFAULT_SLOT_MILLI = units.slot_milli(units.DEFAULT_SLOT_REPLICAS)
"""A time-sliced slot's share of its GPU when nothing says otherwise (``units.DEFAULT_SLOT_REPLICAS``)."""

Resolved = Mapping[tuple[str, str], ClaimAsk]
"""(kind, name) -> what that claim or template asks, for the references the caller could read."""


class SizeError(ValueError):
    """A right-sizing label that is not a usable ask; str() says which label and why."""


@dataclass(frozen=True, slots=True)
class Size:
    """How much GPU a pod says it needs, to be right-sized: memory in bytes and/or a share of compute."""

    memory_bytes: int | None = None
    fraction: float | None = None

    def describe(self) -> str:
        parts = []
        if self.memory_bytes is not None:
            parts.append(f"{names.GPU_MEMORY_LABEL}={human_bytes(self.memory_bytes)}")
        if self.fraction is not None:
            parts.append(f"{names.GPU_FRACTION_LABEL}={self.fraction:g}")
        return " and ".join(parts)


def human_bytes(size: int) -> str:
    """``20Gi``, ``512Mi``, ``10G``, else GiB to a tenth: a size as an author writes it."""
    for unit, factor in (("Gi", 2**30), ("Mi", MIB)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    if size % 10**9 == 0:
        return f"{size // 10**9}G"
    return f"{size / 2**30:.1f}Gi"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodDemand:
    """What one pod asks of a node, in Kubernetes' units (see the module's docstring for each kind)."""

    cpu: int = 0
    """Millicores."""
    memory_bytes: int = 0
    cpu_score: int = 0
    """Millicores as kube-scheduler's scoring counts them (non-zero defaults); 0 when not read."""
    memory_score_bytes: int = 0
    gpus: int = 0
    slots: int = 0
    share_milli: int = 0
    extended: Counts = ()
    products: frozenset[str] = frozenset()
    """GPU products the pod's nodeSelector and required node affinity allow (empty: any)."""
    claims: tuple[PodClaimRef, ...] = ()
    dra_backed: frozenset[str] = frozenset()
    size: Size | None = None
    """The right-sizing ask; None when the pod has none or its labels are not one (:func:`size_of` says why)."""

    @classmethod
    def of_gpus(cls, num_gpu: int, milli_per_gpu: int, **fields: Any) -> PodDemand:
        """From the trace's form (``num_gpu`` GPUs of ``milli_per_gpu`` thousandths each; a share
        is one GPU below ``units.MILLI``), with any other field. ValueError for a share of several GPUs,
        which neither the trace nor the device plugin has."""
        if num_gpu and 0 < milli_per_gpu < units.MILLI:
            if num_gpu != 1:
                raise ValueError(f"{num_gpu} GPUs of {milli_per_gpu} thousandths: only one GPU can be shared")
            return cls(share_milli=milli_per_gpu, **fields)
        return cls(gpus=num_gpu if milli_per_gpu else 0, **fields)

    # --- the GPU thousandths the scheduler models count -------------------------------------
    @property
    def memory_mib(self) -> int:
        """Memory in MiB, rounded up (the replay's unit)."""
        return -(-self.memory_bytes // MIB)

    @property
    def memory_score_mib(self) -> int:
        return -(-self.memory_score_bytes // MIB)

    @property
    def num_gpu(self) -> int:
        """Physical GPUs the pod takes part of: its whole GPUs, or the one GPU its share is on."""
        return self.gpus or (1 if self.share_milli else 0)

    @property
    def milli_per_gpu(self) -> int:
        """Thousandths of each of those GPUs: ``units.MILLI`` for whole GPUs, else the share."""
        return units.MILLI if self.gpus else self.share_milli

    @property
    def gpu_request_milli(self) -> int:
        """GPU thousandths the pod takes in all (whole GPUs or its share)."""
        return self.gpus * units.MILLI + self.share_milli

    @property
    def shares_gpu(self) -> bool:
        """Takes part of one GPU (a share below a whole GPU)."""
        return not self.gpus and 0 < self.share_milli < units.MILLI

    @property
    def uses_devices(self) -> bool:
        """Takes whole GPUs or a share of one (what the device model places)."""
        return bool(self.gpus or self.share_milli)

    # --- what a device plugin holds, and what claims hold -------------------------------------
    def gpu_counts(self) -> Counts:
        """Every GPU extended resource the pod requests, with its count (whole, slots, MIG)."""
        found = dict(self.extended)
        if self.gpus:
            found[names.GPU_RESOURCE] = self.gpus
        if self.slots:
            found[names.SHARED_GPU_RESOURCE] = self.slots
        return tuple(sorted(found.items()))

    def device_plugin_counts(self) -> Counts:
        """:meth:`gpu_counts` less the resources a DRA claim serves (``dra_backed``): what a device
        plugin holds for the pod on its node; the claim counts the rest."""
        return tuple((r, n) for r, n in self.gpu_counts() if r not in self.dra_backed)

    def without_dra_backed(self) -> PodDemand:
        """The demand a device-plugin node sees: the resources a claim serves taken out."""
        if not self.dra_backed:
            return self
        backed = self.dra_backed
        return replace(self, gpus=0 if names.GPU_RESOURCE in backed else self.gpus,
                       slots=0 if names.SHARED_GPU_RESOURCE in backed else self.slots,
                       share_milli=0 if names.SHARED_GPU_RESOURCE in backed else self.share_milli,
                       extended=tuple((r, n) for r, n in self.extended if r not in backed))

    def claim_asks(self, resolved: Resolved, classes: frozenset[str]) -> tuple[tuple[PodClaimRef, ClaimAsk], ...]:
        """The referenced claims (those ``resolved`` holds) that ask a device of ``classes``."""
        return claim_asks(self.claims, resolved, classes)

    def claim_devices(self, resolved: Resolved, classes: frozenset[str]) -> int:
        """Devices of ``classes`` the pod holds at most through the claims ``resolved`` holds."""
        return sum(ask.most_devices(classes) for _, ask in self.claim_asks(resolved, classes))


def claim_asks(refs: tuple[PodClaimRef, ...], resolved: Resolved,
               classes: frozenset[str]) -> tuple[tuple[PodClaimRef, ClaimAsk], ...]:
    """Of a pod's claim references, those ``resolved`` holds that ask a device of ``classes``, each
    with what it asks (a reference the caller could not read is not among them)."""
    out = []
    for ref in refs:
        key = ref.key
        if key is None or key not in resolved:
            continue
        ask = resolved[key]
        if any(a.device_class in classes for a in ask.asks()):
            out.append((ref, ask))
    return tuple(out)


# --- reading a pod ------------------------------------------------------------------------------

def request_amount(resource: str, value: Any) -> int:
    """A request as the scheduler counts it: millicores, bytes, or whole devices. Raises QuantityError."""
    if resource == "cpu":
        return millicores(value)
    if resource == "memory":
        return bytes_(value)
    return pods.gpu_amount(resource, value)


def _counted(resource: str) -> bool:
    return resource in ("cpu", "memory") or is_gpu_resource(resource)


def products_of(pod: pods.Pod) -> frozenset[str]:
    """GPU products the pod's nodeSelector and required node affinity allow (empty: any).

    Terms are ORed: the pod is limited only if every term limits ``nvidia.com/gpu.product`` with
    ``In`` (the union of their values). Other operators leave it unlimited: the set only weighs
    which nodes a pod can use; the scheduler's filter decides fit.
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


def gpu_requests(pod: pods.Pod) -> dict[str, int]:
    """The GPU half of :func:`of_pod`, read alone: the pod's effective request of each GPU resource.

    For a rule about GPUs only (``max`` per pod, a report) that must not fail on a cpu or memory
    quantity. Raises QuantityError naming a GPU resource whose quantity is not a whole number.
    """
    return pods.effective_requests(pod)


def claim_refs(pod: pods.Pod) -> tuple[PodClaimRef, ...]:
    """The DRA half of :func:`of_pod`, read alone: the claims the pod references (never raises)."""
    return claims.pod_claim_refs(pod)


def size_of(pod: pods.Pod) -> Size | None:
    """The pod's right-sizing ask, or None when it has no such label. SizeError for a label that is not one."""
    pod_labels = pods.labels(pod)
    memory_text = pod_labels.get(names.GPU_MEMORY_LABEL)
    fraction_text = pod_labels.get(names.GPU_FRACTION_LABEL)
    if memory_text is None and fraction_text is None:
        return None
    memory = None
    if memory_text is not None:
        try:
            memory = bytes_(memory_text)
        except QuantityError as err:
            problem = quantity_problem(memory_text)
            why = "is not a quantity such as 20Gi" if problem == "is not a quantity" else \
                f"{problem} (no GPU holds that much)"
            raise SizeError(f"label {names.GPU_MEMORY_LABEL}={memory_text!r} {why}") from err
        if memory <= 0:
            raise SizeError(f"label {names.GPU_MEMORY_LABEL}={memory_text!r} must be more than 0")
    fraction = None
    if fraction_text is not None:
        try:
            value = Decimal(str(fraction_text).strip())
        except InvalidOperation as err:
            raise SizeError(f"label {names.GPU_FRACTION_LABEL}={fraction_text!r} is not a number such as "
                            f"\"0.25\"") from err
        if not value.is_finite() or not 0 < value <= 1:
            raise SizeError(f"label {names.GPU_FRACTION_LABEL}={fraction_text!r} must be more than 0 and at most 1")
        fraction = float(value)
    return Size(memory_bytes=memory, fraction=fraction)


def _readable_size(pod: pods.Pod) -> Size | None:
    try:
        return size_of(pod)
    except SizeError:
        return None


def of_pod(pod: pods.Pod, *, slot_milli: int = DEFAULT_SLOT_MILLI) -> PodDemand:
    """Read a Pod into its demand; ``slot_milli`` is one time-sliced slot's share of its GPU.

    A pod asking for several slots is one share of their sum on one GPU, at most the whole GPU.
    Raises QuantityError naming a resource whose quantity is not valid (the API server refuses
    such a pod, so only a hand-made one has it).
    """
    amounts = pods.effective_requests(pod, include=_counted, amount=request_amount)
    scored = pods.effective_requests(pod, include=lambda r: r in ("cpu", "memory"), amount=request_amount,
                                     defaults={"cpu": DEFAULT_CPU_MILLI, "memory": DEFAULT_MEMORY_BYTES})
    slots = sum(n for r, n in amounts.items() if units.is_shared(r))
    extended = tuple(sorted((r, n) for r, n in amounts.items() if units.by_name(r)))
    return PodDemand(cpu=amounts.get("cpu", 0), memory_bytes=amounts.get("memory", 0),
                     cpu_score=scored.get("cpu", 0), memory_score_bytes=scored.get("memory", 0),
                     gpus=sum(n for r, n in amounts.items() if units.is_plugin_gpu(r)), slots=slots,
                     share_milli=min(units.MILLI, slots * slot_milli), extended=extended,
                     products=products_of(pod), claims=claim_refs(pod),
                     dra_backed=dra_backed_resources(pod), size=_readable_size(pod))


# --- writing one back (tests, the replay's workload) ----------------------------------------------

def render(demand: PodDemand, *, name: str = "pod") -> pods.Pod:
    """A Pod that :func:`of_pod` reads back as ``demand`` (one container holds every request).

    Scoring's fields are not written: they follow from the requests (a 0 request scores as
    Kubernetes' default). ``share_milli`` follows from ``slots`` and the reader's slot size.
    """
    requests: dict[str, str] = {}
    if demand.cpu:
        requests["cpu"] = f"{demand.cpu}m"
    if demand.memory_bytes:
        requests["memory"] = str(demand.memory_bytes)
    for resource, count in demand.gpu_counts():
        requests[resource] = str(count)
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if requests:
        container["resources"] = {"requests": requests}
    if demand.claims:
        container.setdefault("resources", {})["claims"] = [{"name": ref.name} for ref in demand.claims]
    spec: dict[str, Any] = {"containers": [container]}
    if demand.claims:
        spec["resourceClaims"] = [claims.render_pod_claim_ref(ref) for ref in demand.claims]
    if demand.products:
        spec["nodeSelector" if len(demand.products) == 1 else "affinity"] = (
            {names.NVIDIA_PRODUCT_LABEL: next(iter(demand.products))} if len(demand.products) == 1 else
            {"nodeAffinity": {node_affinity.REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": names.NVIDIA_PRODUCT_LABEL, "operator": "In", "values": sorted(demand.products)}]}]}}})
    metadata: dict[str, Any] = {"name": name}
    if demand.size is not None:
        metadata["labels"] = {}
        if demand.size.memory_bytes is not None:
            metadata["labels"][names.GPU_MEMORY_LABEL] = str(demand.size.memory_bytes)
        if demand.size.fraction is not None:
            metadata["labels"][names.GPU_FRACTION_LABEL] = repr(demand.size.fraction)
    pod: pods.Pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    if demand.dra_backed:
        pod["status"] = {"extendedResourceClaimStatus": {
            "resourceClaimName": f"{name}-extended-resources",
            "requestMappings": [{"containerName": "main", "resourceName": r, "requestName": f"container-0-request-{i}"}
                                for i, r in enumerate(sorted(demand.dra_backed))]}}
    return pod


# --- GPU asks in GPU units, every name form (admission's ``max`` and deny rules) ------------------

@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """One GPU resource one container names, with its count and what one unit of it is."""

    kind: str
    """``container`` or ``initContainer``."""
    container: str
    name: units.GpuName
    count: int | None
    """Requests (else limits) as a whole number; None when it is not one."""

    @property
    def resource(self) -> str:
        return self.name.resource

    @property
    def amount(self) -> Fraction:
        """GPU units this container's ask is by itself (0 when its count is not a whole number)."""
        return self.name.share * (self.count or 0)

    def describe(self) -> str:
        held = units.describe(self.amount)
        unit = "" if self.name.share == 1 else f" = {held} GPU"
        return f"{self.kind} '{self.container}' {self.resource}: {self.count}{unit}"


def gpu_asks(pod: pods.Pod, gpus: units.GpuNames = units.NVIDIA_NAMES) -> tuple[ContainerAsk, ...]:
    """Every GPU resource each container (init containers first) names in requests or limits:
    the device plugin's names and the DRA extended-resource names ``gpus`` counts as GPUs."""
    out = []
    for kind, container in pods.all_containers(pod):
        keys = {k for section in ("requests", "limits") for k in pods.resource_section(container, section)}
        for resource in sorted(k for k in keys if isinstance(k, str)):
            name = gpus.of(resource)
            if name is not None:
                out.append(ContainerAsk(kind, str(container.get("name")), name, pods.gpu_count(container, resource)))
    return tuple(out)


def gpu_units(pod: pods.Pod, gpus: units.GpuNames = units.NVIDIA_NAMES) -> Fraction:
    """GPU units the pod holds through its own resources, by Kubernetes' rule (``pods.effective_requests``)
    over the sum of every GPU name per container: sidecars add, a plain init container's peak counts."""

    def amount(resource: str, value: Any) -> Any:
        name = gpus.of(resource)
        count = whole_count(value) if name is not None else None
        return name.share * count if name is not None and count is not None else Fraction(0)

    found = pods.effective_requests(pod, include=lambda r: gpus.of(r) is not None, amount=amount,
                                    bucket=lambda r: "gpu")
    return Fraction(found.get("gpu", 0))


def gpu_resource_names(pod: pods.Pod, gpus: units.GpuNames = units.NVIDIA_NAMES) -> frozenset[str]:
    """The GPU resource names any container of the pod asks for, every form (:func:`gpu_asks`'s
    names, read without their counts, for mutation's steps). A name written as 0 wherever it appears
    asks for none (``nvidia.com/gpu: "0"`` is no GPU pod); a value that is not a count is an ask, for
    validation to judge."""
    found: set[str] = set()
    for _, container in pods.all_containers(pod):
        sections = [pods.resource_section(container, section) for section in ("requests", "limits")]
        for key in {k for section in sections for k in section}:
            if not isinstance(key, str) or key in found or gpus.of(key) is None and not is_gpu_resource(key):
                continue
            if any(whole_count(section.get(key, 0)) != 0 for section in sections):
                found.add(key)
    return frozenset(found)
