"""AdmissionReview ``admission.k8s.io/v1``: decode a request body, encode a response. Nothing else.

No Flask, no policy: the server hands bytes in and gets bytes back, so this module is tested
without a network. Only the keys gpugate reads are typed (kopf's way); the pod object stays a
plain dict so fields Kubernetes adds later survive.

The API server accepts only ``patchType: JSONPatch`` with ``patch`` as the base64 of a JSON array
of RFC 6902 operations, and it echoes nothing for us: the response must carry the same
``apiVersion``, ``kind`` and ``request.uid`` (kubernetes/api ``admission/v1/types.go``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import orjson

from webhook.errors import BadReview
from webhook.kube import claims

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"

# The API server truncates long warnings and drops many; keep each readable and the list short.
MAX_WARNING_CHARS = 256
MAX_WARNINGS = 20


class _GroupVersion(TypedDict, total=False):
    group: str
    """Empty for the core group (pods)."""
    version: str


class GroupVersionKind(_GroupVersion, total=False):
    """``request.kind``: what the object is (``Pod``, ``ResourceClaim``...)."""

    kind: str


class GroupVersionResource(_GroupVersion, total=False):
    """``request.resource``: the REST resource the request was made on (``pods``, ``resourceclaims``...)."""

    resource: str


class ReviewRequest(TypedDict, total=False):
    """The keys of ``request`` that gpugate reads; the rest is carried but not typed."""

    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    subResource: str
    name: str
    namespace: str
    operation: str
    object: dict[str, Any] | None
    oldObject: dict[str, Any] | None
    dryRun: bool


class Status(TypedDict, total=False):
    """``response.status`` of a denial: the HTTP-like code and the message the user reads."""

    code: int
    message: str
    reason: str


class ReviewResponse(TypedDict, total=False):
    """``response``: the uid echoed, the verdict, and a JSONPatch only when there is one."""

    uid: str
    allowed: bool
    status: Status
    patchType: str
    patch: str
    auditAnnotations: dict[str, str]
    warnings: list[str]


class AdmissionReview(TypedDict, total=False):
    """The whole document: a request from the API server, or our response to it."""

    apiVersion: str
    kind: str
    request: ReviewRequest
    """Set in what the API server sends."""
    response: ReviewResponse
    """Set in what the webhook answers (``response_document``)."""


@dataclass(frozen=True, slots=True)
class Review:
    """A decoded request, checked once at the boundary so the route can trust its types."""

    uid: str
    operation: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    sub_resource: str
    namespace: str
    name: str
    dry_run: bool
    object: dict[str, Any] | None
    raw: ReviewRequest

    def is_pod(self) -> bool:
        """A request about the Pod itself (core/v1), not a subresource such as pods/status."""
        return (self.kind.get("group", "") == "" and self.kind.get("kind") == "Pod"
                and not self.sub_resource)

    def is_claim(self) -> bool:
        """A ResourceClaim or ResourceClaimTemplate itself (resource.k8s.io), not resourceclaims/status."""
        return (self.kind.get("group", "") == claims.API_GROUP
                and self.kind.get("kind") in (claims.CLAIM_KIND, claims.TEMPLATE_KIND) and not self.sub_resource)

    @property
    def old_object(self) -> dict[str, Any] | None:
        """The object before an UPDATE (None on CREATE or when absent)."""
        old = self.raw.get("oldObject")
        return old if isinstance(old, dict) else None


@dataclass(frozen=True, slots=True)
class Answer:
    """What the route decided; ``encode`` turns it into the wire response."""

    allowed: bool
    patch: Sequence[Mapping[str, Any]] = ()
    warnings: Sequence[str] = ()
    audit_annotations: Mapping[str, str] = field(default_factory=dict)
    denial_code: int = 403
    denial_message: str = ""
    patch_json: bytes = b""
    """``patch`` already encoded as JSON (the server has it from checking the patch)."""


class UndecodableBody(BadReview):
    """The body is not JSON gpugate can decode (too deep, or not JSON at all); a review the API server
    sent may still be answered by its envelope (``admission.envelope``)."""


def decode(body: bytes | str) -> Review:
    """Parse and check an AdmissionReview request body; BadReview says what is wrong."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        if "depth limit" in str(err).lower() or "recursion" in str(err).lower():
            raise UndecodableBody("the body nests JSON more than 1,024 levels deep, deeper than gpugate "
                                  "decodes") from err
        document = _decode_slowly(body, err)
    if not isinstance(document, dict):
        raise BadReview(f"the body is a JSON {type(document).__name__}, not an AdmissionReview object")
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if kind != KIND:
        raise BadReview(f"kind is {kind!r}, expected {KIND!r}")
    if api_version != API_VERSION:
        raise BadReview(
            f"apiVersion is {api_version!r}; this webhook speaks only {API_VERSION!r} "
            f"(set admissionReviewVersions: [v1] in the webhook configuration)"
        )
    request = document.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing or not a non-empty string")
    operation = request.get("operation")
    if not isinstance(operation, str) or not operation:
        raise BadReview("request.operation is missing or not a string")
    kind_field = _mapping(request, "kind")
    resource_field = _mapping(request, "resource")
    obj = request.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise BadReview(f"request.object is a JSON {type(obj).__name__}, expected an object or null")
    dry_run = request.get("dryRun", False)
    if dry_run is None:
        dry_run = False
    if not isinstance(dry_run, bool):
        raise BadReview("request.dryRun must be true or false")
    return Review(
        uid=uid,
        operation=operation,
        kind=kind_field,  # type: ignore[arg-type]
        resource=resource_field,  # type: ignore[arg-type]
        sub_resource=_string(request, "subResource"),
        namespace=_string(request, "namespace"),
        name=_string(request, "name"),
        dry_run=dry_run,
        object=obj,
        raw=request,  # type: ignore[arg-type]
    )


def _decode_slowly(body: bytes | str, err: orjson.JSONDecodeError) -> Any:
    """The standard decoder's reading of what orjson refused: JSON the API server passes through
    untyped (a claim's opaque parameters) may hold an integer past 64 bits, valid JSON orjson refuses."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise UndecodableBody(f"the body is not JSON ({err}); send an AdmissionReview {API_VERSION} document") from err


def encode(review: Review, answer: Answer) -> bytes:
    """The AdmissionReview response for ``review`` as JSON bytes."""
    return orjson.dumps(response_document(review.uid, answer))


def response_document(uid: str, answer: Answer) -> AdmissionReview:
    """The response as a dict: JSONPatch fields only when there is something to patch."""
    response: ReviewResponse = {"uid": uid, "allowed": answer.allowed}
    if not answer.allowed:
        response["status"] = {"code": answer.denial_code, "message": answer.denial_message or "denied"}
    elif answer.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = (base64.b64encode(answer.patch_json).decode("ascii") if answer.patch_json
                             else encode_patch(answer.patch))
    warnings = [_clip(w) for w in answer.warnings][:MAX_WARNINGS]
    if warnings:
        response["warnings"] = warnings
    if answer.audit_annotations:
        response["auditAnnotations"] = {str(k): str(v) for k, v in answer.audit_annotations.items()}
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def encode_patch(ops: Sequence[Mapping[str, Any]]) -> str:
    return base64.b64encode(orjson.dumps(list(ops))).decode("ascii")


def decode_patch(patch: str) -> list[dict[str, Any]]:
    """The JSON Patch operations in a response's base64 ``patch`` (for ``gpugate admit`` and tests)."""
    try:
        ops = json.loads(base64.b64decode(patch, validate=True))
    except (ValueError, TypeError) as err:
        raise BadReview(f"response.patch is not base64 of JSON ({err})") from err
    if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
        raise BadReview("response.patch is not a JSON array of operations")
    return ops


_RESOURCES = {"Pod": ("", "v1", "pods"),
              claims.CLAIM_KIND: (claims.API_GROUP, "v1", "resourceclaims"),
              claims.TEMPLATE_KIND: (claims.API_GROUP, "v1", "resourceclaimtemplates")}


def wrap_pod(pod: Mapping[str, Any], *, uid: str, namespace: str | None = None,
             operation: str = "CREATE", dry_run: bool = False) -> AdmissionReview:
    """An AdmissionReview request for ``pod`` (or a ResourceClaim or ResourceClaimTemplate) as the
    API server would send it on CREATE."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    ns = namespace or str(meta.get("namespace") or "default")  # type: ignore[union-attr]
    group, version, plural = _RESOURCES.get(str(pod.get("kind")), _RESOURCES["Pod"])
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": str(pod.get("kind") or "Pod")},
            "resource": {"group": group, "version": version, "resource": plural},
            "name": str(meta.get("name") or ""),  # type: ignore[union-attr]
            "namespace": ns,
            "operation": operation,
            "object": dict(pod),
            "oldObject": None,
            "dryRun": dry_run,
        },
    }


def _mapping(request: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = request.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadReview(f"request.{key} is a JSON {type(value).__name__}, expected an object")
    return value


def _string(request: Mapping[str, Any], key: str) -> str:
    value = request.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadReview(f"request.{key} must be a string")
    return value


def _clip(text: str) -> str:
    text = str(text)
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 1] + "…"
