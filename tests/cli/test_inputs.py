"""The offline commands read what a user has at hand: stdin, a folder, several files, workloads; JSON out.

``validate`` runs the chain the API server runs, so it never says "allowed" for a pod the mutating
webhook refuses; a stale ``--inventory`` is said; ``policy check`` catches a policy file kustomize
would leave out of the ConfigMap.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from webhook.cli import main

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
EXAMPLES = ROOT / "webhook" / "examples"
TRAINING = EXAMPLES / "pod-training.yaml"


def run(*args: object, stdin: str | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], input=stdin, catch_exceptions=False)


def pod_asking(gpus: str) -> str:
    pod = yaml.safe_load(TRAINING.read_text())
    pod["metadata"]["labels"]["gpugate.io/gpus"] = gpus
    return yaml.safe_dump(pod)


def test_validate_refuses_what_the_mutating_webhook_refuses(tmp_path: Path) -> None:
    """gpugate.io/gpus: "100" was "allowed" by validate (the pod as written passes validation), and the
    server's mutating webhook refuses it."""
    (tmp_path / "pod.yaml").write_text(pod_asking("100"))
    result = run("validate", tmp_path / "pod.yaml", "--policies", POLICIES, "-n", "ml-team")
    assert result.exit_code == 1
    assert result.stdout.startswith("denied: label gpugate.io/gpus='100' asks for 100 GPUs; policy training allows 8")
    assert "allowed" not in result.stdout


def test_validate_reads_stdin_folders_and_several_files(tmp_path: Path) -> None:
    """Without -n each is judged in its own namespace (else 'default'): pod-web.yaml names web-shop."""
    result = run("validate", "-", EXAMPLES, TRAINING, "--policies", POLICIES, stdin=pod_asking("2"))
    lines = result.stdout.splitlines()
    assert lines[0].startswith("-: allowed (policy ")
    assert any(line.startswith(f"{EXAMPLES / 'pod-web.yaml'}: denied: pod 'shop-' in namespace 'web-shop'")
               for line in lines)
    sources = [line.split(": ", 1)[0] for line in lines]
    assert sources == ["-", *sorted(str(p) for p in EXAMPLES.glob("pod-*.yaml")), str(TRAINING)]
    assert "left out 1 document(s)" in result.stderr  # webhook/examples/balancer.yaml: not a pod
    assert result.exit_code == 1


def test_validate_judges_a_workload_by_its_template_as_the_webhook_does(tmp_path: Path) -> None:
    web = yaml.safe_load((EXAMPLES / "pod-web.yaml").read_text())
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "shop", "namespace": "web-shop"},
                  "spec": {"selector": {"matchLabels": {"app": "shop"}},
                           "template": {"metadata": {"labels": {"app": "shop"}}, "spec": web["spec"]}}}
    result = run("validate", "-", "--policies", POLICIES, "-o", "json", stdin=yaml.safe_dump(deployment))
    (judged,) = json.loads(result.stdout)
    assert result.exit_code == 1 and judged["kind"] == "Deployment" and judged["namespace"] == "web-shop"
    assert judged["allowed"] is False
    assert "GPUs are not available in web and frontend namespaces" in judged["reasons"][0]


def test_validate_json_is_one_list_of_verdicts_with_reasons_and_warnings() -> None:
    result = run("validate", TRAINING, "--policies", POLICIES, "-n", "ml-team", "-o", "json")
    (judged,) = json.loads(result.stdout)
    assert result.exit_code == 0 and judged["allowed"] is True and judged["policy"].startswith("training@")
    assert judged["source"] == str(TRAINING) and any("set nvidia.com/gpu: 4" in w for w in judged["warnings"])


def test_mutate_reads_a_kubectl_list_from_stdin_and_prints_each_pod() -> None:
    pods = [yaml.safe_load(TRAINING.read_text()), yaml.safe_load((EXAMPLES / "pod-notebook.yaml").read_text())]
    listed = {"apiVersion": "v1", "kind": "List", "items": pods}
    result = run("mutate", "-", "--policies", POLICIES, "-n", "ml-team", stdin=json.dumps(listed))
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.stdout))
    assert [d["metadata"]["annotations"]["gpugate.io/policy"].split("@")[0] for d in documents] == \
        ["training", "notebooks"]


def test_a_missing_input_is_named() -> None:
    result = CliRunner().invoke(main, ["validate", "no-such.yaml", "--policies", str(POLICIES)])
    assert result.exit_code == 1 and "no-such.yaml: no such file or folder" in result.stderr


def test_a_stale_inventory_is_said_not_silently_ignored(tmp_path: Path) -> None:
    old = (datetime.now(UTC) - timedelta(hours=3)).isoformat().replace("+00:00", "Z")
    (tmp_path / "inventory.json").write_text(json.dumps({"apiVersion": "gpugate.io/v1alpha1", "kind": "GPUInventory",
                                                         "generatedAt": old, "offers": []}))
    rightsized = EXAMPLES / "pod-rightsized.yaml"
    result = run("mutate", rightsized, "--policies", POLICIES, "-n", "ml-team", "--inventory",
                 tmp_path / "inventory.json")
    assert result.exit_code == 0, result.output
    assert f"warning: --inventory {tmp_path / 'inventory.json'}: the balancer's inventory is 3 h old (limit 5 min); " \
           "right-sizing ignores it" in result.stderr
    assert "the balancer's inventory is 3 h old (limit 5 min), so a whole GPU" in result.stderr


def test_policy_check_flags_a_policy_file_kustomize_leaves_out(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    shutil.copytree(POLICIES, folder, ignore=shutil.ignore_patterns("tests"))
    (folder / "training-large.yaml").write_text((folder / "training.yaml").read_text()
                                                .replace("name: training", "name: training-large")
                                                .replace("priority: 100", "priority: 150"))
    result = run("policy", "check", folder)
    assert result.exit_code == 1
    assert "training-large.yaml: not listed in kustomization.yaml's configMapGenerator files" in result.stderr
    listed = folder / "kustomization.yaml"
    listed.write_text(listed.read_text() + "      - training-large.yaml\n      - gone.yaml\n")
    result = run("policy", "check", folder)
    assert result.exit_code == 1 and "lists gone.yaml, which is not in" in result.stderr
    assert "training-large.yaml" not in result.stderr


@pytest.mark.parametrize("folder", [POLICIES, POLICIES / "extender"])
def test_the_shipped_folders_list_every_policy_file(folder: Path) -> None:
    result = run("policy", "check", folder, "-o", "json")
    checked = json.loads(result.stdout)
    assert result.exit_code == 0 and checked["valid"] is True and checked["problems"] == []
    assert len(checked["policies"]) >= 6 and len(checked["revision"]) == 12


def test_policy_check_json_lists_the_problems(tmp_path: Path) -> None:
    result = run("policy", "check", tmp_path, "-o", "json")
    checked = json.loads(result.stdout)
    assert result.exit_code == 1 and checked["valid"] is False and "holds no GPUPolicy" in checked["problems"][0]


def test_policy_test_json_has_every_case() -> None:
    result = run("policy", "test", POLICIES, "-o", "json")
    tested = json.loads(result.stdout)
    assert result.exit_code == 0 and tested["failed"] == 0
    assert tested["passed"] == len(tested["cases"]) == len(list((POLICIES / "tests").rglob("case.yaml")))
