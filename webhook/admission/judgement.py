"""What the cluster's admission would decide about one object, of any kind gpugate judges. Pure.

``gpugate validate`` (files) and ``gpugate audit`` (what runs) ask the same question of a Pod, a
DRA claim or a workload: would the API server admit it now, after gpugate's mutating webhook
(whose refusals count) and its validating one? A ``Judgement`` is the answer with its reasons, the
warnings the author would read, and, for an object already shaped, whether today's policies would
shape it differently. The same chain the server runs (``chain.admit``, ``workloads.judge``), so an
offline "allowed" is never a pod the server refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhook import names
from webhook.admission import chain, dra, workloads
from webhook.kube import pods
from webhook.kube.inventory import EMPTY, Inventory
from webhook.policy import PolicySet

_POLICY_ANNOTATION_PATH = "/metadata/annotations/" + names.POLICY_ANNOTATION.replace("/", "~1")


@dataclass(frozen=True, slots=True, kw_only=True)
class Judgement:
    """One object's fate at admission under a policy set."""

    source: str
    """Where the object came from: a file (``-`` for stdin), or ``namespace/Kind/name`` in a cluster."""
    kind: str
    name: str
    namespace: str
    allowed: bool
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    policy: str | None = None
    """``NAME@REVISION`` of the policy that decided; None when none applies."""
    reshaped: tuple[str, ...] = ()
    """JSON-patch paths mutation would change on the object as it is (the policy annotation aside):
    for a pod shaped under older policies, what today's would do differently."""

    def line(self) -> str:
        """The verdict as ``gpugate validate`` prints it (one line per reason when denied)."""
        if not self.allowed:
            return "\n".join(f"denied: {reason}" for reason in self.reasons)
        return f"allowed (policy {self.policy or 'none'})"

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "kind": self.kind, "name": self.name, "namespace": self.namespace,
                "allowed": self.allowed, "policy": self.policy, "reasons": list(self.reasons),
                "warnings": list(self.warnings), "reshaped": list(self.reshaped)}


def judge(obj: dict[str, Any], *, source: str, namespace: str, policies: PolicySet, inventory: Inventory = EMPTY,
          now: datetime | None = None, claims: tuple[dict[str, Any], ...] = (), shaped: bool = True) -> Judgement:
    """``obj`` (a Pod, with the ``claims`` and templates it references; a claim; or a workload) as
    the cluster would admit it in ``namespace`` now. ``shaped`` False: the mutating webhook is not
    called there (a namespace labelled ``gpugate.io/skip``), so only the validating one judges."""
    name = pods.display_name(obj)
    kind = str(obj.get("kind") or "Pod")
    workload = workloads.kind_of_document(obj)
    if workload is not None:
        verdict = workloads.judge(workload, obj, namespace=namespace, policies=policies, inventory=inventory, now=now)
        return Judgement(source=source, kind=kind, name=name, namespace=namespace, allowed=verdict.allowed,
                         reasons=verdict.reasons, warnings=verdict.warnings,
                         policy=str(verdict.policy) if verdict.policy else None)
    if not shaped:  # pods only: a workload is judged by the validating webhook, which shapes its template
        verdict = chain.validate(obj, namespace=namespace, policies=policies, inventory=inventory, now=now,
                                 resolved=dra.resolve_documents(claims))
        return Judgement(source=source, kind=kind, name=name, namespace=namespace, allowed=verdict.allowed,
                         reasons=verdict.reasons, warnings=verdict.warnings,
                         policy=str(verdict.policy) if verdict.policy else None)
    admitted = chain.admit(obj, namespace=namespace, policies=policies, inventory=inventory, now=now,
                           resolved=dra.resolve_documents(claims))
    policy = admitted.mutation.policy or (admitted.verdict.policy if admitted.verdict else None)
    reshaped = tuple(op["path"] for op in admitted.mutation.patch if op["path"] != _POLICY_ANNOTATION_PATH
                     and not op["path"].startswith(_POLICY_ANNOTATION_PATH + "/"))
    return Judgement(source=source, kind=kind, name=name, namespace=namespace, allowed=admitted.allowed,
                     reasons=admitted.reasons if not admitted.allowed else (), warnings=admitted.warnings,
                     policy=str(policy) if policy else None, reshaped=reshaped)
