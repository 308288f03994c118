"""One answer builder for both endpoints: the core's typed result becomes the AdmissionReview answer."""

from __future__ import annotations

import orjson
import pytest

from webhook.admission import answers, reviews
from webhook.admission.patchcheck import PatchError
from webhook.admission.results import Mutation, Verdict
from webhook.policy.model import PolicyRef

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
REF = PolicyRef("training", "abc123def456")
ADD = {"op": "add", "path": "/metadata/annotations", "value": {"gpugate.io/policy": str(REF)}}


def test_a_refusal_reads_alike_whichever_endpoint_gave_it():
    at_mutation = answers.answer(Mutation(desired=POD, patch=(), policy=REF, warnings=("w",), denials=("too many",)),
                                 revision=REF.revision, subject=POD)
    at_validation = answers.answer(Verdict(allowed=False, reasons=("too many",), policy=REF, warnings=("w",)),
                                   revision=REF.revision, subject=POD)
    assert at_mutation == at_validation
    assert at_mutation.result == "denied" and at_mutation.policy == str(REF)
    assert at_mutation.answer == reviews.Answer(allowed=False, warnings=("w",), denial_code=403,
                                                denial_message="too many",
                                                audit_annotations={"policy": str(REF), "revision": REF.revision})


def test_a_verdict_without_reasons_names_its_policy():
    decided = answers.answer(Verdict(allowed=False, policy=REF), revision=REF.revision, subject=POD)
    assert decided.answer.denial_message == f"denied by policy {REF}"
    assert answers.answer(Verdict(allowed=False), revision="r", subject=POD).answer.denial_message == \
        "denied by policy gpugate"


def test_a_mutation_carries_its_checked_patch_and_counts_it():
    decided = answers.answer(Mutation(desired=POD, patch=(ADD,), policy=REF), revision=REF.revision, subject=POD)
    assert decided.result == "patched" and decided.patch_ops == 1
    assert decided.answer.allowed and list(decided.answer.patch) == [ADD]
    assert orjson.loads(decided.answer.patch_json) == [ADD]


@pytest.mark.parametrize(("mutation", "label"), [
    (Mutation(desired=POD, patch=(), policy=REF), "unchanged"),
    (Mutation(desired=POD, patch=(), policy=REF, mode="audit"), "audit"),
    (Mutation(desired=POD, patch=(), policy=None), "unchanged"),
])
def test_a_mutation_without_a_patch_is_labelled_by_its_mode(mutation, label):
    decided = answers.answer(mutation, revision="r", subject=POD)
    assert decided.result == label and decided.answer.allowed and not decided.answer.patch
    assert decided.answer.audit_annotations["policy"] == (str(mutation.policy) if mutation.policy else "none")


def test_an_allowing_verdict_is_allowed_with_its_warnings():
    decided = answers.answer(Verdict(allowed=True, policy=REF, warnings=("audit: would deny: x",)),
                             revision=REF.revision, subject=POD)
    assert decided.result == "allowed" and decided.answer.allowed
    assert tuple(decided.answer.warnings) == ("audit: would deny: x",)


def test_a_patch_that_does_not_apply_is_never_answered():
    bad = {"op": "replace", "path": "/spec/nodeName", "value": "n1"}  # replace needs the target
    with pytest.raises(PatchError, match="nodeName"):
        answers.answer(Mutation(desired=POD, patch=(bad,), policy=REF), revision="r", subject=POD)


@pytest.mark.parametrize("fail_closed", [False, True])
def test_the_answers_the_core_never_gives(fail_closed):
    unreadable = answers.unreadable("a list where a mapping goes", revision="r", fail_closed=fail_closed)
    assert unreadable.result == "invalid" and unreadable.answer.allowed is not fail_closed
    assert "a list where a mapping goes" in unreadable.answer.warnings[0]
    broken = answers.internal_error(KeyError("x"), endpoint="mutate", uid="u1", fail_closed=fail_closed)
    assert broken.result == "error" and broken.answer.allowed is not fail_closed and broken.error == "KeyError: 'x'"
    assert "uid u1" in broken.answer.warnings[0]
    assert answers.SKIPPED.answer.allowed and answers.SKIPPED.result == "skipped"
