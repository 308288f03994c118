"""The offline CLI: ``gpugate mutate``, ``validate``, ``policy check`` and ``policy test``."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import jsonpatch
import pytest
import yaml
from click.testing import CliRunner

from webhook.cli import main

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
EXAMPLE = ROOT / "webhook" / "examples" / "pod-training.yaml"


def run(*args: str) -> CliRunner.invoke:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_mutate_prints_the_mutated_pod() -> None:
    result = run("mutate", EXAMPLE, "--policies", POLICIES, "-n", "ml-team")
    assert result.exit_code == 0, result.output
    pod = yaml.safe_load(result.stdout)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert pod["metadata"]["annotations"]["gpugate.io/policy"].startswith("training@")
    assert "set nvidia.com/gpu: 4" in result.stderr


def test_mutate_patch_output_applies_to_the_input() -> None:
    result = run("mutate", EXAMPLE, "--policies", POLICIES, "-n", "ml-team", "-o", "patch")
    assert result.exit_code == 0
    patch = json.loads(result.stdout)
    mutated = jsonpatch.apply_patch(yaml.safe_load(EXAMPLE.read_text()), patch)
    json_out = json.loads(run("mutate", EXAMPLE, "--policies", POLICIES, "-n", "ml-team", "-o", "json").stdout)
    assert mutated == json_out


def test_mutate_diff_shows_added_lines() -> None:
    result = run("mutate", EXAMPLE, "--policies", POLICIES, "-n", "ml-team", "-o", "diff")
    assert result.stdout.startswith("---")
    lines = result.stdout.splitlines()
    # Against the file as written: its comments, quotes and flow mappings are no change.
    removed = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    assert removed == ['        requests: {cpu: "16", memory: 128Gi}', "        limits: {memory: 128Gi}"], removed
    assert "+        requests: {cpu: \"16\", memory: 128Gi, nvidia.com/gpu: '4'}" in lines


def test_mutate_exits_1_with_the_reason_when_denied(tmp_path: Path) -> None:
    pod = yaml.safe_load(EXAMPLE.read_text())
    pod["metadata"]["labels"]["gpugate.io/gpus"] = "16"
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod))
    result = run("mutate", tmp_path / "pod.yaml", "--policies", POLICIES, "-n", "ml-team")
    assert result.exit_code == 1
    assert "denied: label gpugate.io/gpus='16' asks for 16 GPUs; policy training allows 8" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(("content", "expected"), [
    ("kind: Pod\napiVersion: v1\nmetadata: {name: x\n", "line 4, column 1: invalid YAML"),
    ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n", "a Deployment is not mutated"),
    ("apiVersion: v1\nkind: Service\nmetadata: {name: x}\n", "no Pod, ResourceClaim, ResourceClaimTemplate"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: []}\n", "spec.containers"),
    ("- just\n- a list\n", "expected a mapping, got list"),
], ids=["malformed-yaml", "a-workload", "not-a-pod", "no-containers", "a-list"])
def test_mutate_refuses_a_file_that_is_not_a_pod(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(content)
    result = run("mutate", path, "--policies", POLICIES)
    assert result.exit_code == 1
    assert str(path) in result.stderr and expected in result.stderr


def test_validate_reports_allowed_and_denied(tmp_path: Path) -> None:
    assert "allowed (policy training@" in run("validate", EXAMPLE, "--policies", POLICIES, "-n", "ml-team").stdout
    pod = yaml.safe_load(EXAMPLE.read_text())
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod))
    result = run("validate", tmp_path / "pod.yaml", "--policies", POLICIES, "-n", "ml-team")
    assert result.exit_code == 1
    assert "requests 1 but limits 2" in result.stdout


def test_policy_check_accepts_the_starter_set() -> None:
    result = run("policy", "check", POLICIES)
    assert result.exit_code == 0
    assert "6 policies valid" in result.stdout


def test_policy_check_lists_every_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: gpugate.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: a}\n"
        "spec: {gpu: {max: eight}, colour: blue}\n"
        "---\napiVersion: gpugate.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: b}\n"
        "spec: {gpu: {resource: nvidia.com/gpus}}\n")
    (tmp_path / "b.yaml").write_text("apiVersion: gpugate.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: c}\nspec: [\n")
    result = run("policy", "check", tmp_path)
    assert result.exit_code == 1
    err = result.stderr
    assert "a.yaml, document 1, spec: unknown field(s): 'colour'" in err
    assert "a.yaml, document 1, spec.gpu.max: 'eight' is not of type 'integer'" in err
    assert "a.yaml, document 2, spec.gpu.resource: unknown NVIDIA resource 'nvidia.com/gpus'" in err
    assert "b.yaml, line 5, column 1: invalid YAML" in err
    assert "4 problem(s)" in err


def test_policy_test_runs_the_cases_and_writes_junit(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    result = run("policy", "test", POLICIES, "--junit", junit)
    assert result.exit_code == 0, result.output
    assert "PASS  training-packs-on-clique" in result.stdout
    suite = ElementTree.parse(junit).getroot()
    assert suite.get("failures") == "0"
    # Every case folder the runner finds: it walks the tree (policies/tests/dra/ holds the DRA cases).
    assert int(suite.get("tests")) == len(list((POLICIES / "tests").rglob("case.yaml")))


def test_policy_test_fails_on_a_broken_case(tmp_path: Path) -> None:
    (tmp_path / "training.yaml").write_text((POLICIES / "training.yaml").read_text().replace("max: 8", "max: 16"))
    case = tmp_path / "tests" / "over-max"
    case.mkdir(parents=True)
    src = POLICIES / "tests" / "training-over-max-denied"
    for name in ("case.yaml", "pod.yaml"):
        (case / name).write_text((src / name).read_text())
    junit = tmp_path / "junit.xml"
    result = run("policy", "test", tmp_path, "--junit", junit)
    assert result.exit_code == 1
    assert "FAIL  over-max" in result.stdout and "0 passed, 1 failed" in result.stdout
    assert ElementTree.parse(junit).getroot().get("failures") == "1"
