"""``gpugate validate``, ``mutate`` and ``admit`` take ResourceClaims and templates."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from tests.server.harness import SERVICE_HOST, Server, copy_policies
from webhook.cli import main
from webhook.kube import claims

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
CASES = POLICIES / "tests" / "dra"
WEB_TEMPLATE = CASES / "web-claim-template-denied" / "template.yaml"
INFERENCE_TEMPLATE = CASES / "inference-claim-template-gets-device-selectors" / "template.yaml"
POD_WITH_TEMPLATES = CASES / "pod-over-max-through-claims-denied" / "pod.yaml"


def run(*args: object) -> CliRunner.invoke:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_validate_denies_a_gpu_template_in_a_web_namespace() -> None:
    result = run("validate", WEB_TEMPLATE, "--policies", POLICIES, "-n", "web-shop")
    assert result.exit_code == 1
    assert "denied: ResourceClaimTemplate 'eight-gpus' in namespace 'web-shop'" in result.stdout


def test_mutate_prints_the_template_with_the_policys_selectors() -> None:
    result = run("mutate", INFERENCE_TEMPLATE, "--policies", POLICIES, "-n", "ml-team")
    assert result.exit_code == 0, result.output
    shaped = yaml.safe_load(result.stdout)
    whole = shaped["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]
    assert whole["selectors"][-1] == {"cel": {"expression": claims.memory_selector(24000)}}


def test_validate_counts_the_templates_written_after_the_pod() -> None:
    result = run("validate", POD_WITH_TEMPLATES, "--policies", POLICIES, "-n", "ml-vision")
    assert result.exit_code == 1
    assert "asks more than 8 GPUs in all" in result.stdout and "allows 8 per pod" in result.stdout


def test_a_file_with_two_claims_judges_each(tmp_path: Path) -> None:
    """A claim is not followed by claims it references (only a pod is): each is a subject of its own."""
    path = tmp_path / "two.yaml"
    path.write_text(WEB_TEMPLATE.read_text() + "---\n" + WEB_TEMPLATE.read_text())
    result = run("validate", path, "--policies", POLICIES)
    lines = result.stdout.splitlines()
    assert result.exit_code == 1 and [line.split(": ", 1)[0] for line in lines] == [f"{path}#{n}" for n in (1, 2)]


def test_admit_sends_a_template_to_the_server(tmp_path: Path) -> None:
    server = Server(tmp_path, policies=copy_policies(tmp_path / "policies")).start()
    try:
        result = run("admit", WEB_TEMPLATE, "--server", server.url, "--ca", server.ca, "--server-name",
                     SERVICE_HOST, "-n", "web-shop")
    finally:
        server.stop()
    assert result.exit_code == 1, result.output
    assert "GPUs are not available in web and frontend namespaces" in result.output
