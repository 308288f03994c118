"""Policies govern DRA claims: mutation and verdicts for ResourceClaims, templates and the pods using them. Pure.

A claim or template that asks an NVIDIA DeviceClass (``gpu.nvidia.com``, ``mig.nvidia.com``) or a
class some policy lists in ``spec.claims.deviceClasses`` is judged by the policy that matches its
namespace and its own labels, exactly as a pod's extended-resource ask is judged: deny rules,
``spec.gpu.max`` (per claim, and per pod over the claims it references), the classes the policy
allows, no ``allocationMode: All`` and no ``adminAccess`` unless allowed, and ``products`` /
``families`` / ``minMemoryMiB`` as CEL selectors on the NVIDIA driver's device attributes.

Mutation adds those selectors to every governed ask (an ``exactly`` request or each
``firstAvailable`` sub-request) that lacks them; validation denies an ask without them, as a
node-affinity term without the policy's requirement is denied for a pod: selectors in one ask are
ANDed, so an ask carrying the policy's expression cannot escape it whatever else it says, while
an ask without it (a sub-request the author added, a second request) could land anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook import names
from webhook.admission import patches
from webhook.admission.claimladder import required_selectors
from webhook.admission.mutation import governed_classes
from webhook.admission.results import Mutation, Verdict
from webhook.admission.validation import allowed_resources, deny_rule_reasons, pod_total
from webhook.kube import claims, pods
from webhook.kube import demand as kube_demand
from webhook.kube.claims import Claim, ClaimAsk, DeviceAsk
from webhook.policy import PolicySet, matching
from webhook.policy.model import GPUPolicy, PolicyRef

Resolved = kube_demand.Resolved
"""(kind, name) -> what that claim or template asks: the objects a pod references that the
caller could read (from the same file, or the API); a reference not in it is not counted."""


def allowed_classes(policy: GPUPolicy) -> frozenset[str]:
    """``spec.claims.deviceClasses``, or the classes ``spec.gpu``'s resources map to: whole or shared
    GPUs -> ``gpu.nvidia.com``, a MIG resource -> ``mig.nvidia.com``."""
    if policy.claims.device_classes is not None:
        return frozenset(policy.claims.device_classes)
    resources = allowed_resources(policy)
    out = set()
    if resources & {names.GPU_RESOURCE, names.SHARED_GPU_RESOURCE}:
        out.add(names.DRA_GPU_CLASS)
    if any(r.startswith(names.MIG_RESOURCE_PREFIX) for r in resources):
        out.add(names.DRA_MIG_CLASS)
    return frozenset(out)


def per_claim_limit(policy: GPUPolicy) -> int | None:
    return policy.claims.max_per_claim if policy.claims.max_per_claim is not None else policy.gpu.max


def _subject(document: Mapping[str, Any]) -> pods.Pod:
    """What policy matching reads of a claim: its labels (a claim has no pod labels of its own)."""
    return {"metadata": {"labels": pods.labels(dict(document))}}


def select(policies: PolicySet, document: Claim, *, namespace: str) -> GPUPolicy | None:
    """The policy for a claim: namespace globs and podSelector on the claim's labels; a claim asking
    GPUs is a GPU ask, so gpuOnly policies apply. The skip label does not skip limits (as for pods)."""
    return matching.select(policies, _subject(document), namespace=namespace, honor_skip=False, asks_for_gpus=True)


def _describe(document: Claim, namespace: str) -> str:
    return f"{document.get('kind', 'ResourceClaim')} '{claims.display_name(document)}' in namespace '{namespace}'"


def _what(ask: ClaimAsk, governed: frozenset[str]) -> str:
    parts = [f"request '{a.name}' asks {a.count if a.allocation_mode == claims.EXACT_COUNT else 'all'} "
             f"{a.device_class}" for a in ask.asks() if a.device_class in governed]
    return "; ".join(parts)


# --- mutation -----------------------------------------------------------------------------------

def mutate_claim(document: Claim, *, namespace: str, policies: PolicySet) -> Mutation:
    """The claim with the policy's CEL selectors on each governed ask and the policy annotation;
    what the author set (other selectors, counts, capacity, config) is kept. Idempotent."""
    governed = governed_classes(policies)
    ask = claims.parse(document)
    if not any(a.device_class in governed for a in ask.asks()) or pods.is_skipped(_subject(document)):
        return Mutation(desired=document, patch=(), policy=None)  # gpugate.io/skip opts out of shaping only
    if ask.scheduler_made:
        return Mutation(desired=document, patch=(), policy=None)  # allocated already: see validate_claim
    policy = select(policies, document, namespace=namespace)
    if policy is None:
        return Mutation(desired=document, patch=(), policy=None)
    ref = PolicyRef(policy.name, policies.revision)
    selectors = required_selectors(policy)
    desired = claims.with_selectors(document, selectors, governed) if selectors else dict(document)
    desired = _annotated(desired, str(ref))
    warnings = []
    if selectors:
        warnings.append(f"gpugate {ref}: every GPU request of {_describe(document, namespace)} carries the "
                        f"policy's device selectors ({len(selectors)})")
    patch = patches.make_patch(document, desired)
    if policy.mode == "audit":
        notes = tuple(f"audit: {w}" for w in warnings)
        if patch:
            notes += (f"audit: gpugate {ref} would apply {len(patch)} patch operation(s); mode is audit",)
        return Mutation(desired=document, patch=(), policy=ref, warnings=notes, mode="audit")
    return Mutation(desired=desired, patch=patch, policy=ref, warnings=tuple(warnings))


def _annotated(document: Claim, value: str) -> Claim:
    out = dict(document)
    meta = dict(out.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), names.POLICY_ANNOTATION: value}
    out["metadata"] = meta
    return out


# --- validation ---------------------------------------------------------------------------------

def validate_claim(document: Claim, *, namespace: str, policies: PolicySet) -> Verdict:
    """Deny rules of every matching policy and the selected policy's claim rules."""
    governed = governed_classes(policies)
    ask = claims.parse(document)
    if not any(a.device_class in governed for a in ask.asks()):
        return Verdict(allowed=True)
    if ask.scheduler_made:
        # kube-scheduler made it for a pod's nvidia.com/gpu (extended-resource mapping) and allocated it
        # already: the pod's request was judged when the pod was admitted (max per pod, deny rules,
        # products as node affinity). Judged alone it would match by its labels (it has none) another
        # policy than its pod did, and a refusal fails the pod's binding for ever (tests/e2e).
        return Verdict(allowed=True)
    subject = _subject(document)
    where = _describe(document, namespace)
    denials, warnings = deny_rule_reasons(subject, namespace, policies, lambda: f"{where}: {_what(ask, governed)}")
    policy = select(policies, document, namespace=namespace)
    ref = PolicyRef(policy.name, policies.revision) if policy else None
    if policy is not None:
        own = claim_rules(ask, policy, ref, governed, where)
        if policy.mode == "audit":
            warnings += [f"audit: would deny: {r}" for r in own]
        else:
            denials += own
    return Verdict(allowed=not denials, reasons=tuple(denials), policy=ref, warnings=tuple(warnings))


def claim_rules(ask: ClaimAsk, policy: GPUPolicy, ref: PolicyRef | None, governed: frozenset[str],
                where: str) -> list[str]:
    """The selected policy's rules on one claim's governed asks; each reason names the claim, the
    request, the policy and the fix."""
    out: list[str] = []
    allowed = allowed_classes(policy)
    selectors = required_selectors(policy)
    limit = per_claim_limit(policy)
    for device in (a for a in ask.asks() if a.device_class in governed):
        out.extend(_ask_rules(device, policy, ref, allowed, selectors, limit, where))
    total = ask.most_devices(governed)
    one_over = limit is not None and any(a.count > limit for a in ask.asks() if a.device_class in governed)
    if limit is not None and total > limit and not one_over:
        out.append(f"{where} asks up to {total} GPU devices across its requests; policy {ref} allows {limit} per "
                   f"claim. Ask for {limit} or fewer in total, or split the work into several pods")
    return out


def _ask_rules(device: DeviceAsk, policy: GPUPolicy, ref: PolicyRef | None, allowed: frozenset[str],
               selectors: tuple[str, ...], limit: int | None, where: str) -> list[str]:
    request = f"{where}, request '{device.name}'"
    if device.device_class not in allowed:
        offered = ", ".join(sorted(allowed)) or "no DeviceClass"
        return [f"{request} asks DeviceClass {device.device_class}, which policy {ref} does not allow; ask for "
                f"{offered} instead, or use a profile whose policy offers {device.device_class}"]
    out = []
    if device.allocation_mode == claims.ALL and not policy.claims.allow_allocation_mode_all:
        out.append(f"{request} asks allocationMode: All (every matching device, a count no limit can bound); "
                   f"policy {ref} does not allow it. Ask for allocationMode: ExactCount with a count"
                   f"{f' of {limit} or fewer' if limit is not None else ''}")
    if device.admin_access and not policy.claims.allow_admin_access:
        out.append(f"{request} asks adminAccess (access to devices other pods use); policy {ref} does not allow "
                   f"it. Remove adminAccess, or ask in a namespace whose policy sets claims.allowAdminAccess")
    if limit is not None and device.count > limit:
        out.append(f"{request} asks {device.count} {device.device_class} devices; policy {ref} allows {limit}. "
                   f"Ask for {limit} or fewer, or use a profile whose policy allows more")
    missing = [e for e in selectors if e not in device.selectors]
    if missing:
        out.append(f"{request} may get devices outside the policy's requirement ({_requirement(policy)}): it lacks "
                   f"the selector {missing[0]!r}; policy {ref} requires it on every GPU request and sub-request. "
                   f"Create it through the gpugate webhook (which adds it), or add the selector to each request")
    return out


def _requirement(policy: GPUPolicy) -> str:
    gpu = policy.gpu
    parts = []
    if gpu.products:
        parts.append(f"products {', '.join(gpu.products)}")
    if gpu.families:
        parts.append(f"families {', '.join(gpu.families)}")
    if gpu.min_memory_mib:
        parts.append(f"at least {gpu.min_memory_mib} MiB of GPU memory")
    return "; ".join(parts)


def validate_pod_claims(pod: pods.Pod, *, namespace: str, policies: PolicySet, resolved: Resolved) -> Verdict:
    """A pod's GPU devices through the claims it references (those in ``resolved``) plus its own
    GPU resources, against ``max`` per pod; and deny rules, which a GPU claim triggers for the pod."""
    governed = governed_classes(policies)
    refs = kube_demand.claim_refs(pod)
    held = [(ref, resolved[ref.key]) for ref in refs if ref.key is not None and ref.key in resolved
            and any(a.device_class in governed for a in resolved[ref.key].asks())]
    if not held:
        return Verdict(allowed=True)
    where = f"pod '{pods.display_name(pod)}' in namespace '{namespace}'"
    borrowed = [ref for ref in refs if ref.key is not None and ref.key in resolved and resolved[ref.key].scheduler_made]
    if borrowed:
        names_ = ", ".join(f"'{ref.name}' ({ref.key[1] if ref.key else ''})" for ref in borrowed)
        return Verdict(allowed=False, reasons=(
            f"{where} references the ResourceClaim {names_} made by kube-scheduler for another pod's extended "
            f"resources; only that pod may use it. Ask for nvidia.com/gpu in the pod's resources, or reference a "
            f"claim or template of your own",))
    through = "; ".join(f"claim '{ref.name}' ({ask.kind} {ask.name}) asks up to {ask.most_devices(governed)}"
                        for ref, ask in held)
    denials: list[str] = []
    warnings: list[str] = []
    if not pods.asks_for_gpus(pod):  # a pod asking GPUs itself meets the deny rules in validation.validate
        denials, warnings = deny_rule_reasons(pod, namespace, policies, lambda: f"{where}: {through}")
    policy = matching.select(policies, pod, namespace=namespace, honor_skip=False, asks_for_gpus=True)
    ref = PolicyRef(policy.name, policies.revision) if policy else None
    own: list[str] = []
    if policy is not None and policy.gpu.max is not None:
        devices = sum(ask.most_devices(governed) for _, ask in held)
        own_resource = pod_total(pod, policy.gpu.resource)
        if devices + own_resource > policy.gpu.max:
            extra = f" and {own_resource} {policy.gpu.resource} of its containers" if own_resource else ""
            own.append(f"{where} holds up to {devices + own_resource} GPU devices ({through}{extra}); policy {ref} "
                       f"allows {policy.gpu.max} per pod. Reference fewer or smaller claims, or split the job into "
                       f"several pods")
    if policy is not None:
        if policy.mode == "audit":
            warnings += [f"audit: would deny: {r}" for r in own]
        else:
            denials += own
    return Verdict(allowed=not denials, reasons=tuple(denials), policy=ref, warnings=tuple(warnings))


def merge(first: Verdict, second: Verdict) -> Verdict:
    """Both verdicts' reasons and warnings; the first's policy unless it had none."""
    if second.allowed and not second.warnings:
        return first
    return Verdict(allowed=first.allowed and second.allowed, reasons=first.reasons + second.reasons,
                   policy=first.policy or second.policy, warnings=first.warnings + second.warnings)


def resolve_documents(documents: Iterable[Any]) -> dict[tuple[str, str], ClaimAsk]:
    """The claims and templates among ``documents`` (a multi-document file), by (kind, name)."""
    out = {}
    for document in documents:
        if isinstance(document, dict) and claims.is_claim_document(document):
            ask = claims.parse(document)
            out[(ask.kind, ask.name)] = ask
    return out
