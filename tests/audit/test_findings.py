"""The audit's core: what runs, judged by today's policies, as findings and PolicyReports."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tests.prerequisites import needed
from webhook.admission import chain
from webhook.audit import findings
from webhook.policy import loading, parsing

ROOT = Path(__file__).resolve().parents[2]
POLICIES = loading.load_dir(ROOT / "policies")
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SHARED = ROOT.parent / "shared" / "schemas"


def example(name: str, namespace: str, **meta: Any) -> dict[str, Any]:
    pod = yaml.safe_load((ROOT / "webhook" / "examples" / name).read_text())
    pod["metadata"] = {**pod["metadata"], "name": pod["metadata"].get("generateName", "p") + "x",
                       "namespace": namespace, "uid": f"uid-{name}", **meta}
    return pod


def starter_with(edit: bytes, replacement: bytes, *, file: str = "training.yaml") -> Any:
    """The starter set with one edit to ``file``."""
    texts = [(name, data.replace(edit, replacement) if name.endswith(file) else data)
             for name, data in loading.read_dir(ROOT / "policies")]
    return parsing.parse(texts)


def admitted(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the cluster stored it: shaped by the starter policies, then running."""
    result = chain.admit(pod, namespace=pod["metadata"]["namespace"], policies=POLICIES)
    assert result.stored is not None, result.reasons
    stored = copy.deepcopy(result.stored)
    stored["status"] = {"phase": "Running"}
    return stored


def test_a_pod_admitted_under_todays_policies_passes() -> None:
    (found,) = findings.audit([admitted(example("pod-training.yaml", "ml-team"))], policies=POLICIES, now=NOW)
    assert (found.result, found.policy, found.rule) == ("pass", "training", "admission")


def test_a_pod_from_before_a_deny_rule_fails_with_the_rules_message() -> None:
    """A GPU pod created in web-shop before web-no-gpus existed (or while the webhook was down)."""
    running = example("pod-web.yaml", "web-shop")
    running["status"] = {"phase": "Running"}
    (found,) = findings.audit([running], policies=POLICIES, now=NOW)
    assert found.result == "fail" and "GPUs are not available in web and frontend namespaces" in found.message


def test_a_pod_shaped_differently_by_todays_policies_is_a_warning_naming_the_fields() -> None:
    shaped = admitted(example("pod-training.yaml", "ml-team"))
    policies = starter_with(b"strategy: pack", b"strategy: spread")
    (found,) = findings.audit([shaped], policies=policies, now=NOW)
    assert found.result == "warn" and found.rule == "shaping" and "/spec/affinity" in found.message


def test_the_policy_revision_alone_is_no_warning() -> None:
    """Every pod carries NAME@REVISION: a policy commit that changes nothing for it is no finding."""
    shaped = admitted(example("pod-training.yaml", "ml-team"))
    policies = starter_with(b"metadata:", b"# a comment changes the revision\nmetadata:")
    assert policies.revision != POLICIES.revision
    (found,) = findings.audit([shaped], policies=policies, now=NOW)
    assert found.result == "pass"


def test_a_namespace_that_skips_shaping_is_judged_by_validation_alone() -> None:
    unshaped = example("pod-training.yaml", "ml-team")
    unshaped["status"] = {"phase": "Running"}
    assert findings.audit([unshaped], policies=POLICIES, now=NOW)[0].result == "warn"
    skipped = findings.skipped([{"metadata": {"name": "ml-team", "labels": {"gpugate.io/skip": "true"}}}])
    assert findings.audit([unshaped], policies=POLICIES, now=NOW, skipped_namespaces=skipped)[0].result == "pass"


def test_ended_pods_and_owned_workloads_are_not_judged_twice() -> None:
    ended = example("pod-web.yaml", "web-shop")
    ended["status"] = {"phase": "Succeeded"}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "shop", "namespace": "web-shop"},
                  "spec": {"template": {"metadata": {"labels": {"app": "shop"}},
                                        "spec": example("pod-web.yaml", "web-shop")["spec"]}}}
    replica_set = copy.deepcopy(deployment)
    replica_set["kind"] = "ReplicaSet"
    replica_set["metadata"] = {"name": "shop-1", "namespace": "web-shop",
                               "ownerReferences": [{"kind": "Deployment", "name": "shop"}]}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "web-shop"}}
    found = findings.audit([ended, deployment, replica_set, service], policies=POLICIES, now=NOW)
    assert [(f.kind, f.name, f.result) for f in found] == [("Deployment", "shop", "fail")]


def test_findings_become_one_policyreport_per_namespace_valid_against_the_crd() -> None:
    objects = [admitted(example("pod-training.yaml", "ml-team")), example("pod-web.yaml", "web-shop")]
    reports = findings.reports(findings.audit(objects, policies=POLICIES, now=NOW), now=NOW)
    assert [(r["metadata"]["namespace"], r["summary"]["pass"], r["summary"]["fail"]) for r in reports] == \
        [("ml-team", 1, 0), ("web-shop", 0, 1)]
    result = reports[1]["results"][0]
    assert result["resources"][0]["kind"] == "Pod" and result["resources"][0]["uid"] == "uid-pod-web.yaml"
    assert result["policy"] == "web-no-gpus" and result["properties"]["revision"] == POLICIES.revision
    crd = yaml.safe_load(needed(SHARED / "wgpolicyk8s.io_policyreports.yaml", "the PolicyReport CRD").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    import jsonschema

    for report in reports:
        jsonschema.validate(report, schema)


def test_the_table_lists_failures_first() -> None:
    objects = [admitted(example("pod-training.yaml", "ml-team")), example("pod-web.yaml", "web-shop")]
    lines = findings.table(findings.audit(objects, policies=POLICIES, now=NOW)).splitlines()
    assert lines[0].split() == ["NAMESPACE", "KIND", "NAME", "RESULT", "POLICY", "MESSAGE"]
    assert lines[1].split()[:5] == ["web-shop", "Pod", "shop-x", "FAIL", "web-no-gpus"]
    assert lines[2].split()[3] == "PASS"


def test_the_audit_leaves_out_the_namespaces_admission_leaves_out() -> None:
    from webhook.commands.audit import EXCLUDED

    documents = yaml.safe_load_all((ROOT / "manifests/webhook/webhookconfigurations.yaml").read_text())
    validating = next(d for d in documents if d["kind"] == "ValidatingWebhookConfiguration")
    (expression,) = [e for e in validating["webhooks"][0]["namespaceSelector"]["matchExpressions"]
                     if e["key"] == "kubernetes.io/metadata.name"]
    assert sorted(EXCLUDED) == sorted(expression["values"])
