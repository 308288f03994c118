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

from webhook.admission import mutation, validation
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
          now: datetime | None = None) -> Admission:
    """Mutate ``pod``, apply the patch, validate the result: what the API server would store."""
    mutated = mutation.mutate(pod, namespace=namespace, policies=policies, inventory=inventory, now=now)
    if mutated.denials:
        return Admission(mutation=mutated, verdict=None, stored=None)
    stored = jsonpatch.apply_patch(pod, list(mutated.patch)) if mutated.patch else pod
    verdict = validation.validate(stored, namespace=namespace, policies=policies, inventory=inventory, now=now)
    return Admission(mutation=mutated, verdict=verdict, stored=stored if verdict.allowed else None)
