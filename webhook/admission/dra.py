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
from dataclasses import dataclass, field
from typing import Any

from webhook import names
from webhook.admission import patches, podclaims, rightsizedtemplate
from webhook.admission.claimladder import required_selectors
from webhook.admission.mutation import governed_classes
from webhook.admission.results import Mutation, Verdict
from webhook.admission.validation import allowed_classes, deny_rule_reasons
from webhook.kube import claimowners, claims, pods, units
from webhook.kube import demand as kube_demand
from webhook.kube.claims import Claim, ClaimAsk, DeviceAsk
from webhook.policy import PolicySet, matching
from webhook.policy.model import GPUPolicy, PolicyRef

Resolved = kube_demand.Resolved
"""(kind, name) -> what that claim or template asks: the objects a pod references that the
caller could read (from the same file, or the API); a reference not in it is not counted."""


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

def mutate_claim(document: Claim, *, namespace: str, policies: PolicySet,
                 classes: units.DeviceClasses = units.ASSUMED) -> Mutation:
    """The claim with the policy's CEL selectors on each governed ask and the policy annotation;
    what the author set (other selectors, counts, capacity, config) is kept. Idempotent."""
    governed = governed_classes(policies, classes)
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

@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimContext:
    """What the caller read from the API to judge a claim with the pods it serves; empty: alone."""

    owner: pods.Pod | None = None
    """The Pod the claim names as its controlling owner, as read by name (None: none, or not found)."""
    owner_claims: Resolved = field(default_factory=dict)
    """The claims and templates the owner references, as read."""
    naming: tuple[tuple[pods.Pod, Resolved], ...] = ()
    """Live pods that reference this claim (or template) by name, each with its other claims as read."""


def validate_claim(document: Claim, *, namespace: str, policies: PolicySet,
                   classes: units.DeviceClasses = units.ASSUMED, context: ClaimContext | None = None) -> Verdict:
    """Deny rules of every matching policy and the selected policy's claim rules; and, since nothing
    is trusted by its shape, the pods the claim serves judged with it in place:

    - a claim in kube-scheduler's shape whose owner pod exists with that UID and asks exactly those
      devices through DRA-mapped extended resources was judged with its pod (which was admitted);
      it is let through untouched, since a refusal would only fail the pod's binding for ever;
    - a claim the resourceclaim controller made from a template, for a pod that exists with that
      UID and names that template, is the pod's: judged under the pod's policy, with the pod;
    - any other claim is judged on its own (its labels select the policy), and every pod that
      already names it is judged with it (deny rules, ``max``), so creating a claim after the pod
      that names it, or deleting and creating it again larger, gives that pod nothing its policy
      forbids.
    """
    gpus = matching.gpu_names(policies, classes)
    ask = claims.parse(document)
    if not any(a.device_class in gpus.governed for a in ask.asks()):
        return Verdict(allowed=True)
    ctx = context or ClaimContext()
    where = _describe(document, namespace)
    key = (ask.kind, claims.display_name(document))
    naming = _naming_pods(ctx, key, ask, where, namespace, policies, classes)
    if ask.kind == claims.CLAIM_KIND:
        if claimowners.made_by_scheduler_for(document, ctx.owner, classes):
            return naming
        entry = claimowners.generated_for(document, ctx.owner)
        if entry is not None and ctx.owner is not None and entry.key is not None:
            return merge(_for_owner(ask, entry.key, ctx, where, namespace, policies, classes), naming)
    verdict = _alone(document, ask, where, namespace, policies, gpus.governed)
    if ask.kind == claims.TEMPLATE_KIND and key[1].startswith(names.RIGHTSIZED_TEMPLATE_PREFIX):
        verdict = merge(verdict, _rightsized(document, ctx, where, namespace, policies))
    return merge(verdict, naming)


def _alone(document: Claim, ask: ClaimAsk, where: str, namespace: str, policies: PolicySet,
           governed: frozenset[str]) -> Verdict:
    """The claim judged by the policy its own labels select: deny rules and the claim rules."""
    subject = _subject(document)
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


def _for_owner(ask: ClaimAsk, key: tuple[str, str], ctx: ClaimContext, where: str, namespace: str,
               policies: PolicySet, classes: units.DeviceClasses) -> Verdict:
    """A claim made from a template for its owner pod: the pod's policy's claim rules, and the pod
    judged with this claim in the template's place."""
    assert ctx.owner is not None
    owner = ctx.owner
    gpus = matching.gpu_names(policies, classes)
    policy = matching.select(policies, owner, namespace=namespace, honor_skip=False, asks_for_gpus=True)
    ref = PolicyRef(policy.name, policies.revision) if policy else None
    own = claim_rules(ask, policy, ref, gpus.governed, where) if policy is not None else []
    pod = podclaims.validate(owner, namespace=namespace, policies=policies, classes=classes,
                             resolved=podclaims.with_claim(ctx.owner_claims, key, ask),
                             judging=podclaims.WITH_A_NEW_CLAIM)
    if not pod.allowed:
        own.append(f"{where}: the pod it is made for would then hold GPUs its policy does not allow (more than "
                   f"its max per pod, or where a deny rule forbids GPUs)")
    if policy is not None and policy.mode == "audit":
        return Verdict(allowed=True, policy=ref, warnings=tuple(f"audit: would deny: {r}" for r in own))
    return Verdict(allowed=not own, reasons=tuple(own), policy=ref)


def _naming_pods(ctx: ClaimContext, key: tuple[str, str], ask: ClaimAsk, where: str, namespace: str,
                 policies: PolicySet, classes: units.DeviceClasses) -> Verdict:
    """The pods that already name the claim, each judged with it (their deny rules and ``max``)."""
    if key[0] != claims.CLAIM_KIND:
        return Verdict(allowed=True)
    refused = any(not podclaims.validate(pod, namespace=namespace, policies=policies, classes=classes,
                                         resolved=podclaims.with_claim(resolved, key, ask),
                                         judging=podclaims.WITH_A_NEW_CLAIM).allowed for pod, resolved in ctx.naming)
    if not refused:
        return Verdict(allowed=True)
    # Neither which pods nor how many: the caller may not be the API server (enforcement.md).
    return Verdict(allowed=False, reasons=(
        f"{where}: a pod that already names it would then hold GPUs its policy does not allow (more than its "
        f"max per pod, or where a deny rule forbids GPUs); delete the pods that name it first, or create a claim "
        f"they may hold",))


def _rightsized(document: Claim, ctx: ClaimContext, where: str, namespace: str, policies: PolicySet) -> Verdict:
    """A template named like right-sizing's is admitted only as what right-sizing computed for a pod
    that names it (``rightsizedtemplate``): the balancer creates only what gpugate itself wrote."""
    for pod, _ in ctx.naming:
        policy = matching.select(policies, pod, namespace=namespace, honor_skip=False, asks_for_gpus=True)
        if rightsizedtemplate.recomputes_to(pod, policy, document):
            return Verdict(allowed=True)
    return Verdict(allowed=False, reasons=(
        f"{where} is named like the templates gpugate's right-sizing writes ({names.RIGHTSIZED_TEMPLATE_PREFIX}*), "
        f"but no pod that names it recomputes to exactly it; gpugate's balancer creates such a template for the "
        f"pods right-sizing gave it to, and no other",))


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


def validate_pod_claims(pod: pods.Pod, *, namespace: str, policies: PolicySet, resolved: Resolved,
                        classes: units.DeviceClasses = units.ASSUMED) -> Verdict:
    """A pod at its creation with the claims and templates it references (``podclaims``)."""
    return podclaims.validate(pod, namespace=namespace, policies=policies, resolved=resolved, classes=classes)


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
