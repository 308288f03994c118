"""A pod judged together with the ResourceClaims and templates it references. Pure.

The pod's admission request carries only the names of its claims; the caller reads what they ask
(``resolved``) and this module judges the pod with them: deny rules (a GPU claim makes the pod a
GPU pod), ``max`` in GPU units over the pod's own resources and its claims' devices and capacity
(``kube.units.claim_units``), no claim kube-scheduler made for another pod, and, when the pod is
being created, no reference to a claim or template that could not be read: a claim created after
the pod that names it would otherwise never be counted with it (the ordering refusal; docs/dra.md).

The same judgement runs when a claim is created (``dra.validate_claim``): the pods that already
name it, or the pod it is made for, are judged with it in place.

What a denial says: the pod's own asks and the names its claims are referenced by, never what a
referenced object asks, whether it exists, or which pods name a claim. The webhook cannot tell
the API server's call from a POST made by hand for another namespace (no client certificate on
most clusters), so an answer must not name what the caller could not read itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from webhook.admission.results import Verdict
from webhook.admission.validation import counted, deny_rule_reasons
from webhook.kube import claims, pods, rightsizedclaims, units
from webhook.kube import demand as kube_demand
from webhook.kube.claims import ClaimAsk, PodClaimRef
from webhook.policy import PolicySet, matching
from webhook.policy.model import PolicyRef

Resolved = kube_demand.Resolved


@dataclass(frozen=True, slots=True, kw_only=True)
class Judging:
    """How a pod is judged with its claims: at its own creation, or when a claim it names is."""

    refuse_missing: bool = True
    """A reference that could not be read refuses the pod (at the pod's creation)."""
    own_judged: bool = True
    """``validation.validate`` judged the pod's own asks in the same answer: its deny rules and
    ``max`` over its own resources are not said twice."""


AT_CREATION = Judging()
WITH_A_NEW_CLAIM = Judging(refuse_missing=False, own_judged=False)


def held_claims(refs: tuple[PodClaimRef, ...], resolved: Resolved,
                gpus: units.GpuNames) -> tuple[tuple[PodClaimRef, ClaimAsk], ...]:
    """The references ``resolved`` holds that ask a device of a class that can hold GPUs."""
    return kube_demand.claim_asks(refs, resolved, gpus.governed)


def validate(pod: pods.Pod, *, namespace: str, policies: PolicySet, resolved: Resolved,
             classes: units.DeviceClasses = units.ASSUMED, judging: Judging = AT_CREATION) -> Verdict:
    """The pod's verdict on what its claims add (see the module's docstring)."""
    gpus = matching.gpu_names(policies, classes)
    refs = kube_demand.claim_refs(pod)
    resolved = {**rightsized(pod), **resolved}
    where = f"pod '{pods.display_name(pod)}' in namespace '{namespace}'"
    refused = _unreadable(refs, resolved, where) if judging.refuse_missing else []
    refused += _borrowed(refs, resolved, where)
    if refused:
        return Verdict(allowed=False, reasons=tuple(refused))
    held = held_claims(refs, resolved, gpus)
    if not held:
        return Verdict(allowed=True)
    through = ", ".join(f"'{ref.name}'" for ref, _ in held)
    own_asks = kube_demand.gpu_asks(pod, gpus)
    denials: list[str] = []
    warnings: list[str] = []
    if not (judging.own_judged and (own_asks or pods.labels_ask_for_gpus(pod))):
        denials, warnings = deny_rule_reasons(pod, namespace, policies,
                                              lambda: f"{where}: it asks GPUs through its claims {through}")
    policy = matching.select(policies, pod, namespace=namespace, honor_skip=False, asks_for_gpus=True)
    ref = PolicyRef(policy.name, policies.revision) if policy else None
    own: list[str] = []
    limit = policy.gpu.max if policy is not None else None
    if limit is not None:
        mine = kube_demand.gpu_units(pod, gpus)
        total = mine + sum((units.claim_units(ask, gpus) for _, ask in held), Fraction(0))
        if total > limit and not (judging.own_judged and mine > limit):
            asked = f"{counted(own_asks)}; " if own_asks else ""
            own.append(f"{where} asks more than {limit} GPUs in all ({asked}the ResourceClaims and templates its "
                       f"claims {through} name, counted by their devices and capacity); policy {ref} allows "
                       f"{limit} per pod. Reference fewer or smaller claims, or split the job into several pods")
    if policy is not None:
        if policy.mode == "audit":
            warnings += [f"audit: would deny: {r}" for r in own]
        else:
            denials += own
    return Verdict(allowed=not denials, reasons=tuple(denials), policy=ref, warnings=tuple(warnings))


def _unreadable(refs: tuple[PodClaimRef, ...], resolved: Resolved, where: str) -> list[str]:
    """A reference not in ``resolved``: absent, forbidden, too large or too slow read the same, so
    the answer says nothing of whether it exists."""
    out = []
    for ref in refs:
        if ref.key is not None and ref.key not in resolved:
            out.append(f"{where}: its claim '{ref.name}' names {ref.key[0]} '{ref.key[1]}', which gpugate could not "
                       f"read (it does not exist yet, or reading it failed), so its GPUs cannot be counted. Create "
                       f"claims and templates before the pods that use them")
    return out


def _borrowed(refs: tuple[PodClaimRef, ...], resolved: Resolved, where: str) -> list[str]:
    """A claim in kube-scheduler's shape serves only the pod it was made for (which never names it)."""
    return [f"{where}: its claim '{ref.name}' names ResourceClaim '{ref.key[1]}', which only the pod kube-scheduler "
            f"made it for may use; ask for the extended resource in the pod's resources, or reference a claim or "
            f"template of your own"
            for ref in refs if ref.key is not None and ref.key in resolved and resolved[ref.key].scheduler_made]


def rightsized(pod: pods.Pod) -> dict[tuple[str, str], ClaimAsk]:
    """The right-sized template the pod carries (hash-checked; ``rightsizedtemplate.rules`` checks it
    is what right-sizing computes), which the balancer creates only after the pod: read from the pod
    until then."""
    try:
        template = rightsizedclaims.wanted(pod)
    except rightsizedclaims.TemplateError:
        return {}
    if template is None:
        return {}
    ask = claims.parse(template)
    return {(ask.kind, ask.name): ask}


def with_claim(resolved: Resolved, key: tuple[str, str], ask: ClaimAsk) -> dict[tuple[str, str], ClaimAsk]:
    """``resolved`` with the object ``key`` names read as ``ask`` (the claim being created)."""
    return {**resolved, key: ask}


def names_claim(pod: pods.Pod, claim_name: str) -> bool:
    """``pod`` references ResourceClaim ``claim_name`` by name."""
    return any(ref.key == (claims.CLAIM_KIND, claim_name) for ref in kube_demand.claim_refs(pod))
