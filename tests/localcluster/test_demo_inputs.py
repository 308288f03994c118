"""``gpugate demo`` refuses a bad --policies folder or --webhook-configurations file before it starts
anything: they used to surface after the control plane had started, as a 35-line traceback 104 s
later (a server that never became ready) or as ``KeyError: 'webhooks'``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from webhook.cli import main
from webhook.localcluster import cluster

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATIONS = ROOT / "manifests" / "webhook" / "webhookconfigurations.yaml"


@pytest.fixture(autouse=True)
def nothing_may_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first thing the demo starts is the control plane's build or lookup: it must not be reached."""
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo started the control plane on bad input")

    monkeypatch.setattr(cluster, "ensure_binaries", started)


def demo(*args: object):
    return CliRunner().invoke(main, ["demo", "--once", *[str(a) for a in args]])


def test_a_policy_typo_fails_at_once_with_policy_checks_problems(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    shutil.copytree(ROOT / "policies", folder, ignore=shutil.ignore_patterns("tests"))
    training = folder / "training.yaml"
    training.write_text(training.read_text().replace("max: 8", "max: eight"))
    result = demo("--policies", folder, "--webhook-configurations", CONFIGURATIONS)
    checked = CliRunner().invoke(main, ["policy", "check", str(folder)])
    assert result.exit_code == 1 and checked.exit_code == 1
    (problem,) = [line for line in checked.stderr.splitlines() if "spec.gpu.max" in line]
    assert problem in result.stderr and "nothing was started" in result.stderr
    assert "Traceback" not in result.output


def test_an_empty_policy_folder_fails_at_once(tmp_path: Path) -> None:
    result = demo("--policies", tmp_path, "--webhook-configurations", CONFIGURATIONS)
    assert result.exit_code == 1 and "holds no GPUPolicy" in result.stderr


@pytest.mark.parametrize(("content", "says"), [
    ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
     "document 1: expected a MutatingWebhookConfiguration or a ValidatingWebhookConfiguration, got 'Deployment'"),
    ("apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {name: x}\n",
     "ValidatingWebhookConfiguration has no webhooks list"),  # was KeyError: 'webhooks'
    ("kind: [\n", "line 2, column 1: invalid YAML"),
    ("", "no webhook configuration in it"),
], ids=["a-deployment", "no-webhooks", "not-yaml", "empty"])
def test_a_wrong_webhook_configurations_file_gets_one_line_naming_it(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "hooks.yaml"
    path.write_text(content)
    result = demo("--policies", ROOT / "policies", "--webhook-configurations", path)
    assert result.exit_code == 1, result.output
    assert says in result.stderr
    assert str(path) in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_install_helm_without_helm_says_so_before_starting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUGATE_HELM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no helm anywhere
    result = demo("--install", "helm", "--policies", ROOT / "policies", "--webhook-configurations", CONFIGURATIONS)
    assert result.exit_code == 1 and "gpugate demo --install helm needs helm" in result.stderr


def test_install_helm_with_a_folder_that_is_no_chart_says_so(tmp_path: Path) -> None:
    helm = tmp_path / "helm"
    helm.write_text("#!/bin/sh\nexit 0\n")
    helm.chmod(0o755)
    result = demo("--install", "helm", "--helm", helm, "--chart", tmp_path, "--policies", ROOT / "policies",
                  "--webhook-configurations", CONFIGURATIONS)
    assert result.exit_code == 1 and f"{tmp_path} holds no Chart.yaml" in result.stderr
