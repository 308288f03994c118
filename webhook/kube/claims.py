"""What a pod asks through Dynamic Resource Allocation, as typed values (``resource.k8s.io/v1``). Pure.

A ResourceClaim's ``spec`` (a ResourceClaimTemplate's ``spec.spec``) holds ``devices.requests``;
each request is either ``exactly`` one ExactDeviceRequest (a DeviceClass, ``allocationMode``
ExactCount with ``count``, default 1, or All; CEL ``selectors``; ``capacity.requests``;
``adminAccess``) or a ``firstAvailable`` list of DeviceSubRequests tried in order (the same fields
but ``adminAccess``). A pod names claims in ``spec.resourceClaims`` (``resourceClaimName`` or
``resourceClaimTemplateName``) and its containers use them through ``resources.claims``.
Field names are k8s.io/api/resource/v1/types.go's; the API server validates the shape before any
webhook sees an object, so a wrong type here is a hand-made request and raises ClaimError.

The claim stays a dict (fields Kubernetes adds next year must survive mutation); these values are
what gpugate reads of it, and :func:`render_request` writes one back in the same shape.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from webhook import names
from webhook.errors import InputError

Claim = dict[str, Any]
"""A ResourceClaim or ResourceClaimTemplate document, kept whole."""

CLAIM_KIND = "ResourceClaim"
TEMPLATE_KIND = "ResourceClaimTemplate"
API_GROUP = "resource.k8s.io"
API_VERSION = "resource.k8s.io/v1"
AllocationMode = Literal["ExactCount", "All"]
EXACT_COUNT: AllocationMode = "ExactCount"
ALL: AllocationMode = "All"

EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
"""Set to "true" on the claim kube-scheduler makes for a pod's extended resources that a DRA
DeviceClass serves (``extendedResourceName``): k8s.io/api/resource/v1 ``ExtendedResourceClaimAnnotation``."""
_SCHEDULER_REQUEST = re.compile(r"^container-[0-9]+-request-[0-9]+$")

NVIDIA_DEVICE_CLASSES: tuple[str, ...] = (names.DRA_GPU_CLASS, names.DRA_MIG_CLASS)
"""The DeviceClasses the NVIDIA DRA driver's chart installs (deployments/helm/dra-driver-nvidia-gpu/
templates/deviceclass-{gpu,mig}.yaml): every claim asking one of them asks for GPUs."""


class ClaimError(InputError):
    """A claim whose devices section is not the shape ``resource.k8s.io/v1`` defines."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceAsk:
    """One way to satisfy a request: an ``exactly`` request or one ``firstAvailable`` sub-request."""

    name: str
    """As the scheduler names it: ``<request>`` or ``<request>/<subrequest>``."""
    device_class: str
    allocation_mode: AllocationMode = EXACT_COUNT
    count: int = 1
    """Devices asked with ExactCount; 0 with All (as many as match, not known at admission)."""
    selectors: tuple[str, ...] = ()
    """CEL expressions, ANDed."""
    capacity: tuple[tuple[str, str], ...] = ()
    """``capacity.requests``: (capacity name, quantity as written), sorted."""
    admin_access: bool = False
    """Only on ``exactly`` (a sub-request has no such field)."""
    sub_request: bool = False

    @property
    def is_nvidia(self) -> bool:
        return self.device_class in NVIDIA_DEVICE_CLASSES


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    """One entry of ``devices.requests``: exactly one ask, or alternatives tried in order."""

    name: str
    exactly: DeviceAsk | None = None
    first_available: tuple[DeviceAsk, ...] = ()

    @property
    def alternatives(self) -> tuple[DeviceAsk, ...]:
        """Every ask the scheduler may allocate for this request (one of them is)."""
        return (self.exactly,) if self.exactly is not None else self.first_available

    def most_devices(self, classes: frozenset[str]) -> int:
        """The most devices of ``classes`` any alternative takes (an All alternative counts 0 here:
        its count is unknown, and policies refuse it on its own)."""
        return max((a.count for a in self.alternatives if a.device_class in classes), default=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimAsk:
    """What one ResourceClaim or ResourceClaimTemplate asks."""

    kind: str
    name: str
    """``metadata.name`` (or ``generateName``), for messages."""
    requests: tuple[ClaimRequest, ...] = ()
    scheduler_made: bool = False
    """kube-scheduler made it for a pod's extended resources (:func:`is_scheduler_made`)."""

    def asks(self) -> tuple[DeviceAsk, ...]:
        return tuple(a for r in self.requests for a in r.alternatives)

    def most_devices(self, classes: frozenset[str]) -> int:
        """Devices of ``classes`` the claim holds at most (requests add up; alternatives do not)."""
        return sum(r.most_devices(classes) for r in self.requests)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodClaimRef:
    """One entry of a pod's ``spec.resourceClaims``."""

    name: str
    claim_name: str | None = None
    template_name: str | None = None
    containers: tuple[str, ...] = ()
    """Containers (init containers too) that list it in ``resources.claims``."""

    @property
    def key(self) -> tuple[str, str] | None:
        """(kind, object name) of what it points to, to look it up; None when it names nothing."""
        if self.claim_name:
            return CLAIM_KIND, self.claim_name
        if self.template_name:
            return TEMPLATE_KIND, self.template_name
        return None


def is_claim_document(document: Mapping[str, Any]) -> bool:
    """A ResourceClaim or ResourceClaimTemplate of ``resource.k8s.io`` (any version)."""
    return document.get("kind") in (CLAIM_KIND, TEMPLATE_KIND) \
        and str(document.get("apiVersion", "")).startswith(API_GROUP + "/")


def display_name(document: Mapping[str, Any]) -> str:
    meta = document.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return str(meta.get("name") or meta.get("generateName") or "<unnamed>")


def claim_spec(document: Claim) -> dict[str, Any]:
    """The ResourceClaimSpec of a claim (``spec``) or of a template (``spec.spec``); {} when absent."""
    spec = document.get("spec")
    if document.get("kind") == TEMPLATE_KIND:
        spec = spec.get("spec") if isinstance(spec, dict) else None
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise ClaimError(f"{document.get('kind')} '{display_name(document)}': spec is not an object")
    return spec


def requests_list(spec: Mapping[str, Any]) -> list[Any]:
    """``devices.requests`` as the raw list (empty when absent)."""
    devices = spec.get("devices")
    if devices is None:
        return []
    if not isinstance(devices, dict):
        raise ClaimError("spec.devices is not an object")
    found = devices.get("requests")
    if found is None:
        return []
    if not isinstance(found, list):
        raise ClaimError("spec.devices.requests is not a list")
    return found


def parse(document: Claim) -> ClaimAsk:
    """The typed asks of a ResourceClaim or ResourceClaimTemplate; ClaimError names a malformed field."""
    requests = tuple(parse_request(raw, f"spec.devices.requests[{i}]")
                     for i, raw in enumerate(requests_list(claim_spec(document))))
    return ClaimAsk(kind=str(document.get("kind")), name=display_name(document), requests=requests,
                    scheduler_made=is_scheduler_made(document, requests))


def is_scheduler_made(document: Mapping[str, Any], requests: tuple[ClaimRequest, ...] | None = None) -> bool:
    """The claim kube-scheduler makes for a pod whose extended resources a DRA DeviceClass serves.

    kube-scheduler v1.36 (pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go,
    ``preFilterExtendedResources`` and ``createRequestsAndMappings``; created in PreBind by
    ``createExtendedResourceClaimInAPI``, dynamicresources.go ``bindClaim``) writes exactly: the
    annotation ``resource.kubernetes.io/extended-resource-claim: "true"``, one owner reference to
    the pod (``controller: true``), and requests named ``container-<i>-request-<j>``, each an
    ``exactly`` of one class with ExactCount and a count, nothing else (no selectors, capacity,
    admin access, constraints or config). It allocates the claim before it creates it, so the
    claim's admission can only accept it as it is or make the pod's binding fail, again and again.
    A claim of any other shape (one a user wrote) is not this.
    """
    if document.get("kind") != CLAIM_KIND:
        return False
    found = document.get("metadata")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    annotations: dict[str, Any] = meta["annotations"] if isinstance(meta.get("annotations"), dict) else {}
    owners: list[Any] = meta["ownerReferences"] if isinstance(meta.get("ownerReferences"), list) else []
    if annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) != "true" or len(owners) != 1:
        return False
    owner = owners[0]
    if not isinstance(owner, dict) or (owner.get("apiVersion"), owner.get("kind"), owner.get("controller")) != (
            "v1", "Pod", True):
        return False
    spec = claim_spec(dict(document))
    devices: dict[str, Any] = spec["devices"] if isinstance(spec.get("devices"), dict) else {}
    if set(spec) - {"devices"} or set(devices) - {"requests"}:
        return False
    raw = requests_list(spec)
    if not raw or any(not isinstance(r, dict) or set(r) != {"name", "exactly"} or not isinstance(r["exactly"], dict)
                      or set(r["exactly"]) - {"deviceClassName", "allocationMode", "count"} for r in raw):
        return False
    parsed = requests if requests is not None else tuple(parse_request(r, "request") for r in raw)
    return all(_SCHEDULER_REQUEST.match(r.name) and r.exactly is not None
               and r.exactly.allocation_mode == EXACT_COUNT for r in parsed)


def parse_request(raw: Any, where: str) -> ClaimRequest:
    if not isinstance(raw, dict):
        raise ClaimError(f"{where} is not an object")
    name = _text(raw.get("name"), f"{where}.name")
    exactly = raw.get("exactly")
    first = raw.get("firstAvailable")
    if exactly is not None:
        return ClaimRequest(name=name, exactly=_ask(exactly, name, f"{where}.exactly", sub=False))
    if first is None:
        # v1 requires one of the two; v1beta1's flat form (deviceClassName beside name) is read the same.
        if "deviceClassName" in raw:
            return ClaimRequest(name=name, exactly=_ask(raw, name, where, sub=False))
        return ClaimRequest(name=name)
    if not isinstance(first, list):
        raise ClaimError(f"{where}.firstAvailable is not a list")
    subs = []
    for j, sub in enumerate(first):
        sub_where = f"{where}.firstAvailable[{j}]"
        if not isinstance(sub, dict):
            raise ClaimError(f"{sub_where} is not an object")
        subs.append(_ask(sub, f"{name}/{_text(sub.get('name'), sub_where + '.name')}", sub_where, sub=True))
    return ClaimRequest(name=name, first_available=tuple(subs))


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ClaimError(f"{where} is not a string")
    return value


def _ask(raw: dict[str, Any], name: str, where: str, *, sub: bool) -> DeviceAsk:
    written = raw.get("allocationMode") or EXACT_COUNT
    if written not in (EXACT_COUNT, ALL):
        raise ClaimError(f"{where}.allocationMode: {written!r} is not ExactCount or All")
    mode: AllocationMode = ALL if written == ALL else EXACT_COUNT
    count = raw.get("count")
    if count is None:
        count = 1
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ClaimError(f"{where}.count: {count!r} is not a whole number")
    admin = raw.get("adminAccess")
    if admin is not None and not isinstance(admin, bool):
        raise ClaimError(f"{where}.adminAccess is not true or false")
    return DeviceAsk(name=name, device_class=_text(raw.get("deviceClassName"), f"{where}.deviceClassName"),
                     allocation_mode=mode, count=count if mode == EXACT_COUNT else 0,
                     selectors=selector_expressions(raw.get("selectors"), f"{where}.selectors"),
                     capacity=_capacity(raw.get("capacity"), f"{where}.capacity"),
                     admin_access=bool(admin), sub_request=sub)


def selector_expressions(raw: Any, where: str) -> tuple[str, ...]:
    """The CEL expressions of a ``selectors`` list (entries without ``cel`` are kept out)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ClaimError(f"{where} is not a list")
    out = []
    for k, selector in enumerate(raw):
        cel = selector.get("cel") if isinstance(selector, dict) else None
        if cel is None:
            continue
        if not isinstance(cel, dict):
            raise ClaimError(f"{where}[{k}].cel is not an object")
        out.append(_text(cel.get("expression"), f"{where}[{k}].cel.expression"))
    return tuple(out)


def _capacity(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    requests = raw.get("requests") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(requests, (dict, type(None))):
        raise ClaimError(f"{where}.requests is not an object")
    return tuple(sorted((str(k), str(v)) for k, v in (requests or {}).items()))


def render_request(request: ClaimRequest) -> dict[str, Any]:
    """The ``devices.requests`` entry ``request`` was parsed from, in ``resource.k8s.io/v1``'s shape
    (defaults written out: ``allocationMode``, and ``count`` for ExactCount)."""
    out: dict[str, Any] = {"name": request.name}
    if request.exactly is not None:
        out["exactly"] = _render_ask(request.exactly)
    else:
        out["firstAvailable"] = [{"name": a.name.rsplit("/", 1)[-1], **_render_ask(a)} for a in request.first_available]
    return out


def _render_ask(ask: DeviceAsk) -> dict[str, Any]:
    out: dict[str, Any] = {"deviceClassName": ask.device_class, "allocationMode": ask.allocation_mode}
    if ask.allocation_mode == EXACT_COUNT:
        out["count"] = ask.count
    if ask.selectors:
        out["selectors"] = [{"cel": {"expression": e}} for e in ask.selectors]
    if ask.capacity:
        out["capacity"] = {"requests": dict(ask.capacity)}
    if ask.admin_access:
        out["adminAccess"] = True
    return out


def add_template_claim(pod: dict[str, Any], name: str, template: str, container: int = 0) -> None:
    """Make ``pod`` claim devices from ResourceClaimTemplate ``template`` under ``name``, used by its
    ``container``-th container (the inverse of ``pod_claim_refs`` for one template reference)."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("resourceClaims", []).append({"name": name, "resourceClaimTemplateName": template})
    resources = spec["containers"][container].setdefault("resources", {})
    resources.setdefault("claims", []).append({"name": name})


def may_reference_claims(raw: bytes) -> bool:
    """False when a pod's raw JSON names no ``spec.resourceClaims``, so it need not be decoded to
    find what DRA claims it holds (the API server writes the field name as is)."""
    return b'"resourceClaims"' in raw


def pod_claim_refs(pod: Mapping[str, Any]) -> tuple[PodClaimRef, ...]:
    """The pod's ``spec.resourceClaims``, each with the containers that use it."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    raw = spec.get("resourceClaims")
    if not isinstance(raw, list) or not raw:
        return ()
    users: dict[str, list[str]] = {}
    for key in ("initContainers", "containers"):
        found = spec.get(key)
        for container in found if isinstance(found, list) else ():
            if not isinstance(container, dict):
                continue
            resources = container.get("resources")
            claims = resources.get("claims") if isinstance(resources, dict) else None
            for claim in claims if isinstance(claims, list) else ():
                if isinstance(claim, dict) and isinstance(claim.get("name"), str):
                    users.setdefault(claim["name"], []).append(str(container.get("name")))
    out = []
    for entry in raw:
        if not isinstance(entry, dict):
            continue
        name = str(entry.get("name") or "")
        claim_name = entry.get("resourceClaimName")
        template = entry.get("resourceClaimTemplateName")
        out.append(PodClaimRef(name=name, claim_name=claim_name if isinstance(claim_name, str) else None,
                               template_name=template if isinstance(template, str) else None,
                               containers=tuple(users.get(name, ()))))
    return tuple(out)


# --- CEL selectors on the NVIDIA driver's device attributes -----------------------------------------
# What a policy requires of a GPU (products, families, memory), written as the DRA selector the
# scheduler evaluates against the ResourceSlice devices the driver publishes. Each expression first
# tests ``device.driver`` so that, ANDed into a request for a class of another driver, it is false
# (no such device is allowed) rather than an evaluation error.

def _attribute(name: str) -> str:
    return f'device.attributes["{names.DRA_DRIVER}"].{name}'


def product_selector(products: tuple[str, ...]) -> str:
    """Products as GFD's ``nvidia.com/gpu.product`` spells them (spaces as '-'), so one policy list
    serves device-plugin nodes and DRA devices; the driver's ``productName`` is NVML's name with spaces."""
    listed = ", ".join(f'"{p}"' for p in products)
    return (f'device.driver == "{names.DRA_DRIVER}" && '
            f'{_attribute(names.DRA_PRODUCT_ATTRIBUTE)}.replace(" ", "-") in [{listed}]')


def family_selector(families: tuple[str, ...]) -> str:
    """Families as GFD's ``nvidia.com/gpu.family`` spells them (lower case: ``hopper``); the
    driver's ``architecture`` is NVML's ("Hopper")."""
    listed = ", ".join(f'"{f.lower()}"' for f in families)
    return (f'device.driver == "{names.DRA_DRIVER}" && '
            f'{_attribute(names.DRA_ARCHITECTURE_ATTRIBUTE)}.lowerAscii() in [{listed}]')


def memory_selector(min_mib: int) -> str:
    """At least ``min_mib`` MiB of device memory (the driver's ``memory`` capacity, in bytes)."""
    return (f'device.driver == "{names.DRA_DRIVER}" && '
            f'device.capacity["{names.DRA_DRIVER}"].{names.DRA_MEMORY_CAPACITY}'
            f'.compareTo(quantity("{min_mib}Mi")) >= 0')


def with_selectors(document: Claim, expressions: tuple[str, ...], classes: frozenset[str]) -> Claim:
    """A copy of ``document`` in which every ask of a class in ``classes`` (an ``exactly`` request or
    a ``firstAvailable`` sub-request) carries each of ``expressions`` as a CEL selector. Selectors
    the author wrote stay, in their order; an expression already there is not added twice, so
    applying this to its own output changes nothing."""
    out = copy.deepcopy(document)
    spec = claim_spec(out)
    for raw in requests_list(spec):
        if not isinstance(raw, dict):
            continue
        targets = [raw["exactly"]] if isinstance(raw.get("exactly"), dict) else []
        if isinstance(raw.get("firstAvailable"), list):
            targets += [sub for sub in raw["firstAvailable"] if isinstance(sub, dict)]
        if not targets and "deviceClassName" in raw:
            targets = [raw]  # v1beta1's flat request
        for target in targets:
            if target.get("deviceClassName") not in classes:
                continue
            present = selector_expressions(target.get("selectors"), "selectors")
            missing = [e for e in expressions if e not in present]
            if missing:
                selectors = target.get("selectors") if isinstance(target.get("selectors"), list) else []
                target["selectors"] = [*selectors, *({"cel": {"expression": e}} for e in missing)]
    return out


def render_pod_claim_ref(ref: PodClaimRef) -> dict[str, Any]:
    """The ``spec.resourceClaims`` entry :func:`pod_claim_refs` reads as ``ref`` (its users are the
    containers' ``resources.claims``, written by the pod's author)."""
    out: dict[str, Any] = {"name": ref.name}
    if ref.claim_name is not None:
        out["resourceClaimName"] = ref.claim_name
    if ref.template_name is not None:
        out["resourceClaimTemplateName"] = ref.template_name
    return out
