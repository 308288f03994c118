"""What the admission core decides, as typed values: a ``Mutation`` or a ``Verdict``. Pure.

The mutating core (``mutation.mutate``, ``dra.mutate_claim``) gives a Mutation and the validating
one (``validation.validate``, ``dra.validate_claim``) a Verdict. Both answer the same three
questions the server turns into an AdmissionReview answer (``answers.answer``): allowed or not and
why (``allowed``, ``reasons``), under which policy, with which warnings. Nothing here knows HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.admission.patches import PatchOp
from webhook.kube.pods import Pod
from webhook.policy.model import PolicyRef


@dataclass(frozen=True, slots=True)
class Mutation:
    """Everything one mutation decided: the desired pod, the patch to it and why.

    ``denials`` are reasons to refuse the pod at mutation (the webhook answers allowed: false):
    asks no node can satisfy, which must not be written into the pod first.
    """

    desired: Pod
    patch: tuple[PatchOp, ...]
    policy: PolicyRef | None
    warnings: tuple[str, ...] = ()
    mode: str = "enforce"
    denials: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.denials

    @property
    def reasons(self) -> tuple[str, ...]:
        return self.denials


@dataclass(frozen=True, slots=True)
class Verdict:
    """Allowed or not, and why: a value, never an exception."""

    allowed: bool
    reasons: tuple[str, ...] = ()
    policy: PolicyRef | None = None
    warnings: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)


CoreResult = Mutation | Verdict
"""What either endpoint's core gives for one object."""
