"""The pod as the API server would store it after gpugate's two webhooks: mutate, patch, validate. Pure.

One home for the order the API server uses (mutating webhooks, then the validating ones on the
mutated object), shared by ``gpugate mutate``, the golden-case runner and the replay, so none of
them judges a pod the webhook never sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jsonpatch

from webhook.admission import dra, mutation, validation
from webhook.kube import claims
from webhook.kube.inventory import EMPTY, Inventory
from webhook.policy import PolicySet


@dataclass(frozen=True, slots=True)
class Admission:
    """What happened to one pod: the mutation, the verdict on the mutated pod, the stored pod."""

    mutation: mutation.Mutation
    verdict: validation.Verdict | None
    """None when the mutating endpoint already refused the pod."""
    stored: dict[str, Any] | None
    """The pod as stored, or None when it was denied."""

    @property
    def allowed(self) -> bool:
        return self.stored is not None

    @property
    def reasons(self) -> tuple[str, ...]:
        if self.mutation.denials:
            return self.mutation.denials
        return self.verdict.reasons if self.verdict is not None else ()

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.mutation.warnings + (self.verdict.warnings if self.verdict is not None else ())


def admit(pod: dict[str, Any], *, namespace: str, policies: PolicySet, inventory: Inventory = EMPTY,
          now: datetime | None = None, resolved: dra.Resolved | None = None) -> Admission:
    """Mutate ``pod``, apply the patch, validate the result: what the API server would store.

    ``pod`` may also be a ResourceClaim or ResourceClaimTemplate (``admission.dra``); for a pod,
    ``resolved`` holds the claims and templates it references that the caller has read.
    """
    mutated = mutate(pod, namespace=namespace, policies=policies, inventory=inventory, now=now, resolved=resolved)
    if mutated.denials:
        return Admission(mutation=mutated, verdict=None, stored=None)
    stored = jsonpatch.apply_patch(pod, list(mutated.patch)) if mutated.patch else pod
    verdict = validate(stored, namespace=namespace, policies=policies, inventory=inventory, now=now, resolved=resolved)
    return Admission(mutation=mutated, verdict=verdict, stored=stored if verdict.allowed else None)


def mutate(obj: dict[str, Any], *, namespace: str, policies: PolicySet, inventory: Inventory = EMPTY,
           now: datetime | None = None, resolved: dra.Resolved | None = None) -> mutation.Mutation:
    """The mutating endpoint's decision on a pod (with the claims it references in ``resolved``:
    a pod asking GPUs only through them is shaped as a GPU pod) or a DRA claim."""
    if claims.is_claim_document(obj):
        return dra.mutate_claim(obj, namespace=namespace, policies=policies)
    return mutation.mutate(obj, namespace=namespace, policies=policies, inventory=inventory, now=now,
                           resolved=resolved)


def validate(obj: dict[str, Any], *, namespace: str, policies: PolicySet, inventory: Inventory = EMPTY,
             now: datetime | None = None, resolved: dra.Resolved | None = None) -> validation.Verdict:
    """The validating endpoint's verdict on a pod (with the claims it references in ``resolved``) or a claim."""
    if claims.is_claim_document(obj):
        return dra.validate_claim(obj, namespace=namespace, policies=policies)
    verdict = validation.validate(obj, namespace=namespace, policies=policies, inventory=inventory, now=now)
    if resolved:
        verdict = dra.merge(verdict, dra.validate_pod_claims(obj, namespace=namespace, policies=policies,
                                                             resolved=resolved))
    return verdict
