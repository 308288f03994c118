"""The AdmissionReview answer to one review, built from what the core decided. Pure.

One builder, ``answer``, serves both endpoints: a ``Mutation`` (``/mutate``) and a ``Verdict``
(``/validate``) are turned into a ``reviews.Answer`` the same way, so a denial, its warnings and its
audit annotations read alike whichever endpoint refused. The few answers the core never gives (a
request left alone, a pod we cannot read, our own bug) are built here too. Each comes as a
``Decision``: the answer plus what the server's metrics and log line say of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from webhook.admission import patchcheck, reviews
from webhook.admission.results import CoreResult, Verdict
from webhook.kube.pods import Pod


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one review, with the labels the metrics and the log line carry."""

    answer: reviews.Answer
    result: str
    """skipped, patched, unchanged, audit, allowed, denied, invalid or error."""
    policy: str = ""
    """``NAME@REVISION`` of the policy that decided, empty when none did."""
    revision: str = ""
    patch_ops: int = 0
    error: str = ""
    """What went wrong, for the log line (invalid and error only)."""


SKIPPED = Decision(reviews.Answer(allowed=True), result="skipped")
"""A request the webhook is not registered to judge (e.g. a pod UPDATE): let through untouched."""


def answer(result: CoreResult, *, revision: str, subject: Pod) -> Decision:
    """The answer to the review of ``subject`` from the core's ``result`` under policy set ``revision``.

    A patch is checked against ``subject`` before it is sent: one the API server cannot apply rejects
    the pod even with failurePolicy: Ignore, so a bad one raises ``patchcheck.PatchError`` here and
    the caller answers it as an internal error (admitted unchanged).
    """
    policy = str(result.policy) if result.policy else ""
    audit = {"policy": policy or "none", "revision": revision}
    warnings = tuple(result.warnings)
    if not result.allowed:
        # A mutation refuses an ask no node can hold (e.g. gpus: "1k") rather than write it into the pod.
        message = "; ".join(result.reasons) or f"denied by policy {policy or 'gpugate'}"
        denied = reviews.Answer(allowed=False, warnings=warnings, audit_annotations=audit, denial_code=403,
                                denial_message=message)
        return Decision(denied, result="denied", policy=policy, revision=revision)
    if isinstance(result, Verdict):
        allowed = reviews.Answer(allowed=True, warnings=warnings, audit_annotations=audit)
        return Decision(allowed, result="allowed", policy=policy, revision=revision)
    patch = list(result.patch)
    patch_json = b""
    if patch:
        patch_json = orjson.dumps(patch)
        patchcheck.check(subject, patch_json)
    patched = reviews.Answer(allowed=True, patch=patch, warnings=warnings, audit_annotations=audit,
                             patch_json=patch_json)
    label = "patched" if patch else "audit" if result.mode == "audit" else "unchanged"
    return Decision(patched, result=label, policy=policy, revision=revision, patch_ops=len(patch))


def unreadable(reason: str, *, revision: str, fail_closed: bool) -> Decision:
    """A pod we cannot read: admitted unchanged with the reason (denied when failing closed)."""
    message = f"gpugate could not read this pod ({reason}); "
    if fail_closed:
        message += "denied because the webhook fails closed"
        refused = reviews.Answer(allowed=False, denial_code=400, denial_message=message, warnings=(message,))
        return Decision(refused, result="invalid", revision=revision, error=reason)
    admitted = reviews.Answer(allowed=True, warnings=(message + "admitted unchanged",))
    return Decision(admitted, result="invalid", revision=revision, error=reason)


def internal_error(err: Exception, *, endpoint: str, uid: str, revision: str = "", fail_closed: bool) -> Decision:
    """Our own bug while judging review ``uid``: admitted unchanged with a warning (denied when failing closed)."""
    what = f"gpugate could not {endpoint} this pod (internal error {type(err).__name__}, uid {uid}); "
    if fail_closed:
        message = what + "denied because the webhook fails closed"
        answered = reviews.Answer(allowed=False, denial_code=403, denial_message=message, warnings=(message,))
    else:
        answered = reviews.Answer(allowed=True, warnings=(what + "admitted unchanged",))
    return Decision(answered, result="error", revision=revision, error=f"{type(err).__name__}: {err}")
