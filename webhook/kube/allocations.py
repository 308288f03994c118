"""What allocated ResourceClaims hold: the other half of a node's DRA offer (pure).

A ResourceClaim (``resource.k8s.io/v1``, ``k8s.io/api/resource/v1/types.go``) gets
``status.allocation.devices.results`` when kube-scheduler allocates it: one result per device,
naming the request, ``driver``, ``pool`` and ``device`` (the device's name in that pool's
slices), with ``adminAccess`` for a monitoring-style allocation that does not take the device,
and ``shareID`` / ``consumedCapacity`` for a device that allows multiple allocations.
``status.reservedFor`` lists the pods using the claim; the resourceclaim controller removes a pod
from it once the pod is terminal or gone, and then deallocates the claim (clears
``status.allocation``) and, for a claim it made from a template, deletes it.

The rule here: a claim **holds** its devices while it is allocated and reserved for at least one
consumer. Unreserved, it holds nothing, even if its allocation has not been cleared yet: no pod
can be running with it, and the scheduler would allocate it anew for the next pod anyway.
Admin-access results never hold: the scheduler allocates such devices even when they are in use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from webhook.kube.quantity import QuantityError, bytes_

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceClaim"
Amounts = tuple[tuple[str, str], ...]


class ClaimError(ValueError):
    """A ResourceClaim's status this module cannot read; the message names the field."""


class ResultWire(TypedDict, total=False):
    request: str
    driver: str
    pool: str
    device: str
    adminAccess: bool
    shareID: str
    consumedCapacity: dict[str, str]


class ConsumerWire(TypedDict, total=False):
    apiGroup: str
    resource: str
    name: str
    uid: str


class ClaimStatusWire(TypedDict, total=False):
    allocation: dict[str, Any]
    reservedFor: list[ConsumerWire]


@dataclass(frozen=True, slots=True)
class DeviceKey:
    """A device as a claim names it and a ResourceSlice publishes it: unique in the cluster."""

    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class Allocated:
    """One ``DeviceRequestAllocationResult``."""

    request: str
    key: DeviceKey
    admin_access: bool = False
    share_id: str = ""
    consumed: Amounts = ()
    """``consumedCapacity`` (a share of a device that allows multiple allocations), e.g. memory."""


@dataclass(frozen=True, slots=True)
class Consumer:
    """One ``ResourceClaimConsumerReference`` (a pod, in practice)."""

    resource: str
    name: str
    uid: str
    api_group: str = ""


@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim as the counting reads it: what it was given and who uses it."""

    namespace: str
    name: str
    uid: str = ""
    results: tuple[Allocated, ...] = ()
    allocated: bool = False
    """``status.allocation`` is set (a claim can be allocated with no result for our driver)."""
    reserved_for: tuple[Consumer, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def held(self) -> tuple[Allocated, ...]:
        """The results that take their device now (see the module's rule); empty when released."""
        if not self.allocated or not self.reserved_for:
            return ()
        return tuple(r for r in self.results if not r.admin_access)


def parse(obj: Any) -> Claim:
    """A ResourceClaim's JSON (only metadata and status are read); ClaimError naming a bad field."""
    if not isinstance(obj, dict):
        raise ClaimError("expected a ResourceClaim object")
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    if not isinstance(meta, dict) or not isinstance(status, dict):
        raise ClaimError("metadata and status: expected objects")
    allocation = status.get("allocation")
    results: list[Allocated] = []
    if allocation is not None:
        if not isinstance(allocation, dict):
            raise ClaimError("status.allocation: expected an object")
        raw = ((allocation.get("devices") or {}).get("results")) or []
        if not isinstance(raw, list):
            raise ClaimError("status.allocation.devices.results: expected a list")
        results = [_result(item, f"status.allocation.devices.results[{i}]") for i, item in enumerate(raw)]
    reserved = status.get("reservedFor") or []
    if not isinstance(reserved, list):
        raise ClaimError("status.reservedFor: expected a list")
    consumers = tuple(_consumer(item, f"status.reservedFor[{i}]") for i, item in enumerate(reserved))
    return Claim(namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
                 uid=str(meta.get("uid") or ""), results=tuple(results), allocated=allocation is not None,
                 reserved_for=consumers)


def _result(raw: Any, where: str) -> Allocated:
    if not isinstance(raw, dict):
        raise ClaimError(f"{where}: expected an object")
    texts = {}
    for field in ("request", "driver", "pool", "device"):
        value = raw.get(field)
        if not isinstance(value, str) or not value:
            raise ClaimError(f"{where}.{field}: expected a non-empty string")
        texts[field] = value
    consumed = raw.get("consumedCapacity") or {}
    if not isinstance(consumed, dict):
        raise ClaimError(f"{where}.consumedCapacity: expected an object")
    for name, value in consumed.items():
        try:
            bytes_(value)
        except QuantityError as err:
            raise ClaimError(f"{where}.consumedCapacity[{name}]: {err}") from err
    return Allocated(request=texts["request"], key=DeviceKey(texts["driver"], texts["pool"], texts["device"]),
                     admin_access=raw.get("adminAccess") is True, share_id=str(raw.get("shareID") or ""),
                     consumed=tuple(sorted((str(k), str(v)) for k, v in consumed.items())))


def _consumer(raw: Any, where: str) -> Consumer:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not isinstance(raw.get("resource"), str):
        raise ClaimError(f"{where}: expected an object with resource and name")
    return Consumer(resource=raw["resource"], name=raw["name"], uid=str(raw.get("uid") or ""),
                    api_group=str(raw.get("apiGroup") or ""))


def render_status(claim: Claim) -> ClaimStatusWire:
    """The ``status`` that :func:`parse` reads back as ``claim`` (allocation results and reservedFor)."""
    status = ClaimStatusWire()
    if claim.allocated:
        results = []
        for r in claim.results:
            item = ResultWire(request=r.request, driver=r.key.driver, pool=r.key.pool, device=r.key.device)
            if r.admin_access:
                item["adminAccess"] = True
            if r.share_id:
                item["shareID"] = r.share_id
            if r.consumed:
                item["consumedCapacity"] = dict(r.consumed)
            results.append(item)
        status["allocation"] = {"devices": {"results": results}} if results else {}
    if claim.reserved_for:
        consumers = []
        for c in claim.reserved_for:
            wire = ConsumerWire(resource=c.resource, name=c.name, uid=c.uid)
            if c.api_group:
                wire["apiGroup"] = c.api_group
            consumers.append(wire)
        status["reservedFor"] = consumers
    return status


def render(claim: Claim) -> dict[str, Any]:
    """A ResourceClaim carrying ``claim``'s identity and status (its spec is the asks' business)."""
    meta = {"name": claim.name, "namespace": claim.namespace}
    if claim.uid:
        meta["uid"] = claim.uid
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "status": dict(render_status(claim))}


def dra_backed_resources(pod: dict[str, Any]) -> frozenset[str]:
    """Extended resources of ``pod`` that a DRA claim serves, not a device plugin.

    With the extended-resource mapping (a DeviceClass with ``extendedResourceName``, as the NVIDIA
    chart's ``gpu.nvidia.com`` has for ``nvidia.com/gpu``), kube-scheduler satisfies a pod's
    ``nvidia.com/gpu`` request on a node without device-plugin allocatable by allocating a claim it
    creates, and records that in ``status.extendedResourceClaimStatus.requestMappings``. Those
    requests are counted through the claim; counting the pod's request as well would count the
    same GPUs twice.
    """
    status = pod.get("status") or {}
    found = status.get("extendedResourceClaimStatus") if isinstance(status, dict) else None
    mappings = found.get("requestMappings") if isinstance(found, dict) else None
    if not isinstance(mappings, list):
        return frozenset()
    return frozenset(str(m["resourceName"]) for m in mappings if isinstance(m, dict) and m.get("resourceName"))
