"""The real gpu-operator chart, rendered with helm the way Argo CD renders it, means what stack.yaml says.

NVIDIA's chart packages are in ../shared/upstream/charts (a folder chartrender reads as
``file://``); helm is the one built from its Go module for the e2e tests. Without either the tests
skip and say which is missing. The server-side dry-run of the same renders is in tests/e2e/test_chart.py.
"""

from __future__ import annotations

import copy
import re
import shutil
import socket
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.helmtool import helm_binary
from tests.prerequisites import needed
from tests.stack.conftest import ROOT, SHARED, commit_all, git
from webhook.cli import main
from webhook.stack import chartcheck, chartrender, manifests
from webhook.stack.model import Stack

CHARTS = SHARED / "upstream" / "charts"


@pytest.fixture(scope="module")
def helm() -> Path:
    path = helm_binary()
    needed(CHARTS, "NVIDIA's chart packages")
    return path


def render(helm: Path, stack: Stack, values: bytes) -> list[dict]:
    source = chartrender.ChartSource(repo_url=f"file://{CHARTS}", chart=stack.chart,
                                     version=str(stack.operator_version))
    return chartrender.render(helm, source, values=values, kube_version=f"1.{stack.kubernetes_minor}")


def checked_in() -> tuple[Stack, bytes, list[dict]]:
    stack = manifests.load_stack(ROOT)
    from webhook.stack import manifestcheck

    return stack, (ROOT / manifests.VALUES_FILE).read_bytes(), manifestcheck.kustomize(ROOT / manifests.DRIVERS_DIR)


def test_the_pinned_chart_with_our_values_passes_every_chart_check(helm):
    stack, values, drivers = checked_in()
    checks = chartcheck.check_rendered_chart(render(helm, stack, values), stack, drivers)
    assert [c.name for c in checks] == ["chart-clusterpolicy", "chart-nvidiadriver", "chart-delete-hooks",
                                        "chart-sync-order"]
    assert all(c.ok for c in checks), [c.reason for c in checks if not c.ok]


def test_the_nfd_prune_hook_is_off(helm):
    """Without postDeleteCleanup: false the chart renders NFD's post-delete prune Job,
    which Argo CD runs on any deletion of the Application."""
    stack, values, _ = checked_in()
    data = yaml.safe_load(values)
    assert data["node-feature-discovery"]["postDeleteCleanup"] is False
    del data["node-feature-discovery"]
    check = chartcheck.check_delete_hooks(render(helm, stack, yaml.safe_dump(data).encode()))
    assert not check.ok and "node-feature-discovery-prune" in check.reason and "PostDelete" in check.reason
    objects = render(helm, stack, values)
    hooks = {o["metadata"]["name"]: o["metadata"]["annotations"]["helm.sh/hook"] for o in objects
             if "helm.sh/hook" in (o["metadata"].get("annotations") or {})}
    assert hooks == {"gpu-operator-cleanup-gpucluster": "pre-delete"}, "only the no-op GPUCluster cleanup is left"
    assert not any(o["kind"] == "GPUCluster" for o in objects)


def test_a_policy_the_values_do_not_carry_is_caught(helm):
    """In clusterpolicy mode the ClusterPolicy's upgradePolicy must be the default pool's."""
    stack, values, _ = checked_in()
    single = stack.replace(management="clusterpolicy", pools=(stack.default_pool,))
    derived = manifests.render_values(values.decode(), single).encode()
    assert all(c.ok for c in chartcheck.check_rendered_chart(render(helm, single, derived), single, []))
    drifted = yaml.safe_load(derived)
    drifted["driver"]["upgradePolicy"]["maxParallelUpgrades"] = 7
    check = chartcheck.check_cluster_policy(render(helm, single, yaml.safe_dump(drifted).encode()), single)
    assert not check.ok and "maxParallelUpgrades (7 != 2)" in check.reason


def test_a_driver_in_a_later_wave_is_caught(helm):
    stack, values, drivers = checked_in()
    late = copy.deepcopy(drivers)
    late[0]["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] = "1"
    check = chartcheck.check_sync_order(render(helm, stack, values) + late)
    assert not check.ok and "2 waves" in check.reason


# --- `gpugate stack upgrade` renders the target release --------------------------------------

def run(repo: Path, *args: str):
    return CliRunner().invoke(main, ["stack", *args, "--repo", str(repo)], catch_exceptions=False)


def test_upgrade_renders_the_new_releases_chart_with_the_new_values(stack_repo, set_stack, helm, monkeypatch):
    """v26.3.3 -> v26.7.0 is checked on the v26.7.0 chart's own render before the commit."""
    monkeypatch.setenv(chartrender.CHART_REPO_ENV, f"file://{CHARTS}")
    set_stack(operator_version="v26.3.3", management="clusterpolicy", pools={"default": {"driver": "580.126.20"}})
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "595.91.07", "--helm", str(helm))
    assert result.exit_code == 0, result.output
    assert "PASS  chart-render" in result.output and "gpu-operator v26.7.0 from file://" in result.output
    assert "PASS  chart-clusterpolicy" in result.output and "driver 595.91.07 from the ClusterPolicy" in result.output
    text = git(stack_repo, "log", "-n1", "--format=%B")
    for name in ("chart-render", "chart-clusterpolicy", "chart-nvidiadriver", "chart-delete-hooks", "chart-sync-order"):
        assert f"\n  {name}: " in text, name


def test_upgrade_refuses_a_commit_whose_chart_says_something_else(stack_repo, helm, monkeypatch):
    monkeypatch.setenv(chartrender.CHART_REPO_ENV, f"file://{CHARTS}")
    values = stack_repo / manifests.VALUES_FILE
    values.write_text(values.read_text().replace("    deployDefaultCR: false\n", "    deployDefaultCR: true\n"))
    commit_all(stack_repo, "the chart's own default NVIDIADriver next to ours")
    result = run(stack_repo, "plan", "--operator", "v26.7.0", "--driver", "610.57.04", "--helm", str(helm))
    assert result.exit_code == 1 and "FAIL  chart-nvidiadriver" in result.output, result.output


def test_without_helm_the_render_is_skipped_and_said(stack_repo, monkeypatch, tmp_path):
    monkeypatch.delenv(chartrender.HELM_ENV, raising=False)
    tools = tmp_path / "bin"  # kubectl and git stay, no helm (even where one is installed system-wide)
    tools.mkdir()
    for tool in ("kubectl", "git"):
        found = shutil.which(tool)
        assert found, f"{tool} is needed by the stack tool (the stack_repo fixture checks it)"
        (tools / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(tools))
    assert shutil.which("helm") is None
    result = run(stack_repo, "plan", "--operator", "v26.7.0", "--driver", "610.57.04")
    assert result.exit_code == 0, result.output
    # SKIP, not PASS: nothing was rendered; the line says how to run it.
    assert "SKIP  chart-render" in result.output and "not rendered: helm not found" in result.output
    assert "to render it, give helm with --helm PATH or $GPUGATE_HELM, or put it on PATH" in result.output
    assert "its ClusterPolicy was not checked against stack.yaml" in result.output
    # The way to get helm is said once (it was in the check, its reason and the warning), and the
    # result does not say "all checks pass" with one not run.
    assert result.output.count("--helm PATH") == 1, result.output
    # (the preflight's cluster rules are skipped too without --kube)
    assert re.search(r"^result: every check that ran passes; \d+ skipped \((\S+, )*chart-render(, \S+)*\)$",
                     result.output, re.MULTILINE), result.output
    assert "all checks pass" not in result.output
    skipped = run(stack_repo, "plan", "--operator", "v26.7.0", "--driver", "610.57.04", "--skip-chart-render")
    assert "SKIP  chart-render" in skipped.output and "to render it, drop --skip-chart-render" in skipped.output


def test_a_commit_without_the_chart_render_says_it_was_skipped_not_passed_and_not_how_to_get_helm(stack_repo):
    """The helm hint was in every stack commit message, under "Checks passed" and again in its warning."""
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "610.57.04", "--skip-chart-render")
    assert result.exit_code == 0, result.output
    text = git(stack_repo, "log", "-n1", "--format=%B")
    passed = text.split("Checks passed:\n", 1)[1].split("\n\n", 1)[0]
    skipped = text.split("Checks skipped:\n", 1)[1].split("\n\n", 1)[0].split("\n")
    assert "chart-render" not in passed and "  chart-render" in skipped
    assert "the gpu-operator v26.7.0 chart was not rendered, so its ClusterPolicy was not checked" in text
    assert "--helm" not in text and "GPUGATE_HELM" not in text


def test_an_unreachable_chart_repository_names_the_ways_around_it(stack_repo, helm, monkeypatch):
    """With helm present and NVIDIA's repository unreachable, the failure named no way out."""
    with socket.socket() as sock:  # a port nothing listens on: the repository "cannot be reached"
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv(chartrender.CHART_REPO_ENV, f"http://127.0.0.1:{port}/nvidia")
    result = run(stack_repo, "plan", "--operator", "v26.7.0", "--driver", "610.57.04", "--helm", str(helm))
    assert result.exit_code == 1 and "FAIL  chart-render" in result.output, result.output
    assert "--chart-repo file:///PATH" in result.output and "--skip-chart-render" in result.output
