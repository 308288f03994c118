"""The starter policies' golden cases, run by the same runner as ``gpugate policy test``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from webhook.admission import chain, dra
from webhook.kube.documents import read_admission_file
from webhook.offline import cases
from webhook.policy import loading

POLICY_DIR = Path(__file__).resolve().parents[2] / "policies"
CASES = cases.find_cases(POLICY_DIR)


def test_every_starter_policy_has_a_case() -> None:
    """Each policy in policies/ shapes or denies the pod of at least one golden case."""
    policies = loading.load_dir(POLICY_DIR)
    exercised: set[str] = set()
    for case in CASES:
        spec = yaml.safe_load((case / "case.yaml").read_text())
        document = read_admission_file(case / spec.get("pod", "pod.yaml"))  # a pod, or a DRA claim
        result = chain.mutate(document.subject, namespace=spec["namespace"], policies=policies)
        if result.policy:
            exercised.add(result.policy.name)
        verdict = chain.validate(result.desired, namespace=spec["namespace"], policies=policies,
                                 resolved=dra.resolve_documents(document.claims))
        exercised.update(re.findall(r"policy ([a-z0-9-]+)@", verdict.message))
    assert exercised == {p.name for p in policies.policies}


@pytest.mark.parametrize("case_dir", CASES, ids=[c.name for c in CASES])
def test_golden_case(case_dir: Path) -> None:
    result = cases.run_case(case_dir, loading.load_dir(POLICY_DIR))
    assert result.passed, result.detail


def test_runner_reports_a_wrong_expectation(tmp_path: Path) -> None:
    """A case whose expected pod differs fails with a unified diff, so the runner can fail at all."""
    case = tmp_path / "tests" / "wrong"
    case.mkdir(parents=True)
    (tmp_path / "p.yaml").write_text((POLICY_DIR / "training.yaml").read_text())
    source = POLICY_DIR / "tests" / "training-packs-on-clique"
    (case / "pod.yaml").write_text((source / "pod.yaml").read_text())
    (case / "expected.yaml").write_text((source / "expected.yaml").read_text().replace("'8'", "'7'"))
    (case / "case.yaml").write_text("namespace: ml-vision\nexpect: {mutated: expected.yaml}\n")
    [result] = cases.run_all(tmp_path)
    assert not result.passed
    assert "-        nvidia.com/gpu: '7'" in result.detail
    assert "+        nvidia.com/gpu: '8'" in result.detail
