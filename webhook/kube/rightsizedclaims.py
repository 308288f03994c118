"""The ResourceClaimTemplate a right-sized pod references, as the webhook writes it and the balancer keeps it. Pure.

Right-sizing through DRA cannot put a claim inline in a pod (a pod only names claims or
templates) and the webhook must not create objects (``sideEffects: None``). So the webhook gives the
pod a reference to a template whose name is a hash of its content, the label
``gpugate.io/claim-template: <name>`` and the template itself as JSON in the annotation of the same
name; the balancer watches pods with that label and creates the template in the pod's namespace
when it is missing (webhook/balancer/templatekeeper.py). Until it exists the controller manager's
resourceclaim controller retries and the pod waits, Pending, as for any missing template.

The name is the content's hash, so one template serves every pod with the same ladder and ask, a
template never needs an update, and the balancer can check that an annotation says what its name
promises (a pod cannot have another template created under a right-sized name).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from webhook import names
from webhook.errors import InputError
from webhook.kube import claims
from webhook.kube.claims import Claim

HASH_CHARS = 12
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpugate"}


class TemplateError(InputError):
    """A right-sized pod's annotation that is not the template its label names."""


def content_hash(labels: Mapping[str, str], spec: Mapping[str, Any]) -> str:
    """A short hash of what makes the template: its labels and its ResourceClaimSpec."""
    canonical = json.dumps({"labels": dict(labels), "spec": spec}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_CHARS]


def template(labels: Mapping[str, str], spec: Mapping[str, Any]) -> Claim:
    """The ResourceClaimTemplate for a claim ``spec``; its name is the hash of ``labels`` and ``spec``."""
    every_label = {**MANAGED_BY, **labels}
    return {"apiVersion": claims.API_VERSION, "kind": claims.TEMPLATE_KIND,
            "metadata": {"name": names.RIGHTSIZED_TEMPLATE_PREFIX + content_hash(every_label, spec),
                         "labels": every_label},
            "spec": {"spec": json.loads(json.dumps(spec))}}


def encode(document: Claim) -> str:
    """The annotation value: the template as compact JSON, keys sorted (so a second pass writes the same)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def wanted(pod: Mapping[str, Any]) -> Claim | None:
    """The template a right-sized pod needs, or None for a pod without the label.

    TemplateError when the annotation is missing, not JSON, not a ResourceClaimTemplate, or not the
    content its name is the hash of: the balancer then creates nothing and says why."""
    meta = _mapping(pod.get("metadata"))
    name = _mapping(meta.get("labels")).get(names.CLAIM_TEMPLATE_LABEL)
    if not name:
        return None
    raw = _mapping(meta.get("annotations")).get(names.CLAIM_TEMPLATE_ANNOTATION)
    if not isinstance(raw, str):
        raise TemplateError(f"label {names.CLAIM_TEMPLATE_LABEL}={name} without the annotation "
                            f"{names.CLAIM_TEMPLATE_ANNOTATION} that holds the template")
    try:
        document = json.loads(raw)
    except ValueError as err:
        raise TemplateError(f"annotation {names.CLAIM_TEMPLATE_ANNOTATION} is not JSON: {err}") from err
    if not isinstance(document, dict) or not claims.is_claim_document(document) \
            or document.get("kind") != claims.TEMPLATE_KIND:
        raise TemplateError(f"annotation {names.CLAIM_TEMPLATE_ANNOTATION} is not a ResourceClaimTemplate")
    doc_meta = _mapping(document.get("metadata"))
    labels = {str(k): str(v) for k, v in _mapping(doc_meta.get("labels")).items()}
    inner = _mapping(document.get("spec")).get("spec")
    if not isinstance(inner, dict):
        raise TemplateError(f"annotation {names.CLAIM_TEMPLATE_ANNOTATION} has no spec.spec")
    expected = names.RIGHTSIZED_TEMPLATE_PREFIX + content_hash(labels, inner)
    if doc_meta.get("name") != name or expected != name:
        raise TemplateError(f"annotation {names.CLAIM_TEMPLATE_ANNOTATION} is not the template {name}: its content "
                            f"hashes to {expected}")
    return {"apiVersion": claims.API_VERSION, "kind": claims.TEMPLATE_KIND,
            "metadata": {"name": name, "labels": dict(labels)}, "spec": {"spec": inner}}


def add_reference(spec: dict[str, Any], template_name: str) -> None:
    """Add to a pod spec (a copy the caller owns) the entry of ``spec.resourceClaims`` that names
    ``template_name`` as the pod's claim ``gpugate-gpu``."""
    spec["resourceClaims"] = [*(spec.get("resourceClaims") or ()),
                              {"name": names.RIGHTSIZED_CLAIM, "resourceClaimTemplateName": template_name}]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}
