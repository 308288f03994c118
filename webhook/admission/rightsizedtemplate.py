"""A right-sized pod names only the ResourceClaimTemplate right-sizing computes for it. Pure.

Right-sizing through DRA writes into a pod the name of a template (``gpugate-rightsized-<hash>``),
a label with that name and the template itself in an annotation; the balancer creates the template
from the annotation (``webhook/kube/rightsizedclaims.py``). A pod's author can write all three, so
what the webhook wrote is recomputed here rather than trusted: validation refuses a pod whose
label, annotation or ``gpugate-rightsized-*`` reference is not exactly the template
``claimladder.ladder`` gives its ask under its policy, and the claim webhook admits such a template
only when a pod that names it recomputes to it (``dra.validate_claim``). So the balancer, which
creates what pods ask, can only ever create what gpugate itself computed.
"""

from __future__ import annotations

from webhook import names
from webhook.admission import claimladder
from webhook.admission.claimladder import ClaimLadder
from webhook.kube import demand as kube_demand
from webhook.kube import pods, rightsizedclaims
from webhook.kube.claims import Claim
from webhook.policy.model import GPUPolicy, PolicyRef


def expected(pod: pods.Pod, policy: GPUPolicy) -> ClaimLadder | str | None:
    """The template right-sizing through DRA makes for ``pod`` under ``policy``: None when the
    policy does not right-size through DRA or the pod asks no size; a str when no rung fits."""
    sizing = policy.rightsizing
    if sizing is None or sizing.through != "dra":
        return None
    try:
        ask = kube_demand.size_of(pod)
    except kube_demand.SizeError:
        return None
    if ask is None:
        return None
    profile = pods.labels(pod).get(names.PROFILE_LABEL)
    return claimladder.ladder(ask, sizing, selectors=claimladder.required_selectors(policy),
                              min_memory_mib=policy.gpu.min_memory_mib,
                              labels={names.PROFILE_LABEL: profile} if profile else None)


def carried(pod: pods.Pod) -> tuple[str | None, str | None, tuple[str, ...]]:
    """What ``pod`` carries of right-sizing: the label, the annotation, and the names of the
    ``gpugate-rightsized-*`` templates its claims reference."""
    label = pods.labels(pod).get(names.CLAIM_TEMPLATE_LABEL)
    annotation = pods.annotations_of(pod).get(names.CLAIM_TEMPLATE_ANNOTATION)
    named = tuple(ref.template_name for ref in kube_demand.claim_refs(pod)
                  if ref.template_name and ref.template_name.startswith(names.RIGHTSIZED_TEMPLATE_PREFIX))
    return label, annotation, named


def rules(pod: pods.Pod, policy: GPUPolicy, ref: PolicyRef | None) -> list[str]:
    """A denial when the pod carries right-sizing that is not what gpugate computes for it."""
    label, annotation, named = carried(pod)
    if label is None and annotation is None and not named:
        return []
    where = f"pod '{pods.display_name(pod)}'"
    fix = (f"remove the label and annotation {names.CLAIM_TEMPLATE_LABEL} and the claim "
           f"'{names.RIGHTSIZED_CLAIM}', and let gpugate right-size the pod")
    made = expected(pod, policy)
    if not isinstance(made, ClaimLadder):
        return [f"{where} carries a right-sized ResourceClaimTemplate, but policy {ref} right-sizes nothing "
                f"through DRA for it; {fix}"]
    matches = (label == made.name and annotation == rightsizedclaims.encode(made.template)
               and named == (made.name,) and _claim_name(pod, made.name) == names.RIGHTSIZED_CLAIM)
    if matches:
        return []
    return [f"{where} carries a right-sized ResourceClaimTemplate that is not the one gpugate computes for its "
            f"ask under policy {ref} ({made.name}); {fix}"]


def _claim_name(pod: pods.Pod, template: str) -> str | None:
    return next((r.name for r in kube_demand.claim_refs(pod) if r.template_name == template), None)


def recomputes_to(pod: pods.Pod, policy: GPUPolicy | None, template: Claim) -> bool:
    """``template`` is exactly the one right-sizing computes for ``pod`` under ``policy``, which names it."""
    if policy is None:
        return False
    made = expected(pod, policy)
    if not isinstance(made, ClaimLadder):
        return False
    _, _, named = carried(pod)
    return made.name in named and rightsizedclaims.encode(made.template) == rightsizedclaims.encode(
        _comparable(template))


def _comparable(template: Claim) -> Claim:
    """A template as the API server hands it to admission, reduced to what right-sizing writes
    (apiVersion, kind, name, labels, spec): the API server adds metadata (namespace, uid, times),
    and writes the claims' own ``spec.metadata`` as ``{}`` when there is none (Go's encoding of an
    empty ObjectMeta); one that is not empty is kept, so it does not match."""
    meta = template.get("metadata") if isinstance(template.get("metadata"), dict) else {}
    out_meta = {"name": meta.get("name"), "labels": meta.get("labels") or {}}  # type: ignore[union-attr]
    spec = dict(template["spec"]) if isinstance(template.get("spec"), dict) else template.get("spec")
    if isinstance(spec, dict) and spec.get("metadata") in ({}, None):
        spec.pop("metadata", None)
    return {"apiVersion": template.get("apiVersion"), "kind": template.get("kind"), "metadata": out_meta,
            "spec": spec}
