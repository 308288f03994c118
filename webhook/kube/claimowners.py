"""Whose a ResourceClaim says it is, checked against the pod itself. Pure.

Owner references and annotations are written by whoever creates the claim; the API server checks
neither against anything. So a claim in kube-scheduler's shape (``claims.is_scheduler_made``) or in
the resourceclaim controller's (annotation ``resource.kubernetes.io/pod-claim-name``) is taken as
such only when the pod it names as its controller exists with that UID and asks exactly what the
claim holds: the caller reads the pod (by name, from the API) and this module compares.

kube-scheduler's claim for a pod's DRA-mapped extended resources (v1.37.2,
``pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go``,
``createRequestsAndMappings`` and ``createResourceRequestAndMappings``) is recomputed here from the
pod: for each mapped resource served through DRA on the chosen node (sorted by name), one
``exactly`` request per long-lived container (regular containers and sidecars) named
``container-<i>-request-<j>`` (``i`` counts init containers first, ``j`` is the resource's place among
the container's sorted request names) asking its count, and for the plain init containers only the
largest part they cannot reuse from the long-lived requests after them. Which resources the
node serves through DRA is not known to admission; the claim's own request names say which they
are, and every one must map to a DeviceClass serving that resource.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.kube import claims, demand, pods, units
from webhook.kube.claims import ClaimRequest, PodClaimRef
from webhook.kube.quantity import whole_count

POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
"""On a claim the resourceclaim controller made from a template: the pod's ``spec.resourceClaims[].name``
it was made for (k8s.io/api/resource/v1 ``PodResourceClaimAnnotation``)."""
_REQUEST_NAME = re.compile(r"^container-([0-9]+)-request-([0-9]+)$")


def controlling_pod(document: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the Pod the claim names as its controlling owner, or None."""
    meta = document.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, dict) and owner.get("apiVersion") == "v1" and owner.get("kind") == "Pod" \
                and owner.get("controller") is True and isinstance(owner.get("name"), str):
            return owner["name"], str(owner.get("uid") or "")
    return None


def is_owner(document: Mapping[str, Any], pod: Mapping[str, Any] | None) -> bool:
    """``pod`` (as read from the API) is the claim's controlling owner: same name and the same UID."""
    owner = controlling_pod(document)
    if owner is None or pod is None:
        return False
    meta = pods.metadata(dict(pod))
    return bool(owner[1]) and (meta.get("name"), meta.get("uid")) == owner


def generated_for(document: Mapping[str, Any], pod: Mapping[str, Any] | None) -> PodClaimRef | None:
    """The entry of ``pod``'s ``spec.resourceClaims`` a claim was made from by the resourceclaim
    controller: the claim is annotated with the entry's name, is owned by ``pod`` (name and UID),
    and that entry names a template. None for any other claim."""
    meta = document.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    entry = annotations.get(POD_CLAIM_ANNOTATION) if isinstance(annotations, dict) else None
    if not isinstance(entry, str) or not is_owner(document, pod):
        return None
    assert pod is not None
    return next((r for r in demand.claim_refs(dict(pod)) if r.name == entry and r.template_name), None)


def made_by_scheduler_for(document: Mapping[str, Any], pod: Mapping[str, Any] | None,
                          classes: units.DeviceClasses) -> bool:
    """The claim is kube-scheduler's for ``pod``: its shape, owned by ``pod`` (name and UID), and
    exactly the requests the scheduler computes from ``pod`` for the resources it names."""
    if not claims.is_scheduler_made(document) or not is_owner(document, pod):
        return False
    assert pod is not None
    written = claims.parse(dict(document)).requests
    served = _served(written, pod, classes)
    if served is None:
        return False
    expected = scheduler_requests(pod, served)
    if [(r.name, r.count) for r in expected] != [(r.name, r.exactly.count if r.exactly else None) for r in written]:
        return False
    return all(r.exactly is not None and r.exactly.device_class in {c.name for c in classes.serving(resource)}
               for r, resource in zip(written, (x.resource for x in expected), strict=True))


def _served(written: tuple[ClaimRequest, ...], pod: Mapping[str, Any],
            classes: units.DeviceClasses) -> frozenset[str] | None:
    """The extended resources the claim's request names point at, each mapped to a class; None
    when a name points at no such resource."""
    every = _containers(pod)
    found = set()
    for request in written:
        match = _REQUEST_NAME.match(request.name)
        if match is None or int(match.group(1)) >= len(every):
            return None
        keys = sorted(_requests(every[int(match.group(1))]))
        j = int(match.group(2))
        if j >= len(keys) or not classes.serving(keys[j]):
            return None
        found.add(keys[j])
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class Expected:
    """One request kube-scheduler would write: its name, the extended resource, the count."""

    name: str
    resource: str
    count: int


def scheduler_requests(pod: Mapping[str, Any], served: frozenset[str]) -> tuple[Expected, ...]:
    """The requests kube-scheduler writes for ``pod`` when the node serves ``served`` through DRA,
    sorted by name (the module's docstring says how)."""
    every = _containers(pod)
    init_count = len(pods.init_containers(dict(pod)))
    long_lived = [i for i, c in enumerate(every) if i >= init_count or c.get("restartPolicy") == "Always"]
    short_lived = [i for i in range(init_count) if i not in long_lived]
    out: list[Expected] = []
    for resource in sorted(served):
        made: dict[int, Expected] = {}
        for i in long_lived:
            request = _request(i, every[i], resource, ())
            if request is not None:
                made[i] = request
        largest: Expected | None = None
        for i in short_lived:
            reusable = tuple(made[k].count for k in sorted(made) if k >= i)
            request = _request(i, every[i], resource, reusable)
            if request is not None and (largest is None or largest.count < request.count):
                largest = request
        if largest is not None:
            out.append(largest)
        out.extend(made[i] for i in sorted(made))
    return tuple(sorted(out, key=lambda r: r.name))


def _request(index: int, container: dict[str, Any], resource: str, reusable: tuple[int, ...]) -> Expected | None:
    requested = _requests(container)
    count = whole_count(requested.get(resource)) if resource in requested else None
    if not count:
        return None
    taken = 0
    for part in reusable:
        taken += part
        if taken >= count:
            return None
    return Expected(f"container-{index}-request-{sorted(requested).index(resource)}", resource, count - taken)


def _containers(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    return pods.init_containers(dict(pod)) + pods.containers(dict(pod))


def _requests(container: dict[str, Any]) -> dict[str, Any]:
    """The container's requests as the API server stores them: a request left out defaults to its limit."""
    return {**pods.resource_section(container, "limits"), **pods.resource_section(container, "requests")}
