"""`gpugate stack status --kube`: the real kubernetes client against the fake API server."""

from __future__ import annotations

import json
import socket

import pytest
from click.testing import CliRunner

from tests.kubefake import fake_kube  # noqa: F401 - pytest fixture
from webhook.cli import main
from webhook.names import DRIVER_OWNER_LABEL
from webhook.stack import status


def node(name: str, *, gpu: bool = True, owner: str | None = None, state: str | None = None,
         pool_label: str | None = None) -> dict:
    labels = {"kubernetes.io/hostname": name}
    if gpu:
        labels[status.GPU_PRESENT_LABEL] = "true"
    if owner:
        labels[DRIVER_OWNER_LABEL] = owner
    if state:
        labels[status.DRIVER_UPGRADE_STATE_LABEL] = state
    if pool_label:
        labels["gpugate.io/driver-pool"] = pool_label
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def nvidia_driver(name: str, state: str, reason: str) -> dict:
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": name},
            "spec": {"driverType": "gpu", "image": "driver"},
            "status": {"state": state, "conditions": [
                {"type": "Ready", "status": "True" if state == "ready" else "False", "reason": reason,
                 "message": "", "lastTransitionTime": "2026-08-21T10:00:00Z"}]}}


def populate(fk) -> None:
    fk.put({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
            "spec": {}, "status": {"state": "notReady", "namespace": "gpu-operator", "conditions": [
                {"type": "Ready", "status": "False", "reason": "DriverNotReady", "message": "upgrade in progress",
                 "lastTransitionTime": "2026-08-21T10:00:00Z"}]}})
    fk.put(nvidia_driver("default", "ready", "Reconciled"))
    fk.put(nvidia_driver("canary", "notReady", "DriverNotReady"))
    for item in (
        node("gpu-a", owner="default", state="upgrade-done"),
        node("gpu-b", owner="default", state="upgrade-done"),
        node("gpu-c", owner="default", state="upgrade-required"),
        node("gpu-d", owner="canary", state="cordon-required", pool_label="canary"),
        node("gpu-e", pool_label="canary"),  # not yet labelled by the operator: matched by nodeSelector
        node("cpu-1", gpu=False),
    ):
        fk.put(item)


def test_status_kube_reports_states_conditions_and_nodes_per_pool_by_upgrade_state(stack_repo, fake_kube):
    populate(fake_kube)
    result = CliRunner().invoke(main, ["stack", "status", "--repo", str(stack_repo), "--kube",
                                       "--server", fake_kube.url, "-o", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    cluster = data["cluster"]
    assert cluster["clusterPolicies"] == [{"name": "cluster-policy", "state": "notReady", "conditions": [
        {"type": "Ready", "status": "False", "reason": "DriverNotReady", "message": "upgrade in progress"}]}]
    assert {d["name"]: d["state"] for d in cluster["nvidiaDrivers"]} == {"default": "ready", "canary": "notReady"}
    pools = {p["name"]: p for p in cluster["pools"]}
    assert pools["default"]["upgradeStates"] == {"upgrade-done": 2, "upgrade-required": 1}
    assert pools["canary"]["upgradeStates"] == {"(none)": 1, "cordon-required": 1}
    assert pools["canary"]["nodes"] == ["gpu-d", "gpu-e"] and pools["canary"]["nvidiaDriver"] == "notReady"
    assert data["git"]["operator"]["version"] == "v26.7.0"
    gets = {r.path: r.query for r in fake_kube.requests if r.method == "GET"}
    assert "/apis/nvidia.com/v1/clusterpolicies" in gets
    assert "/apis/nvidia.com/v1alpha1/nvidiadrivers" in gets
    assert gets["/api/v1/nodes"].get("labelSelector") == "nvidia.com/gpu.present=true"


def test_status_kube_text_names_each_object_and_pool(stack_repo, fake_kube):
    populate(fake_kube)
    result = CliRunner().invoke(main, ["stack", "status", "--repo", str(stack_repo), "--server", fake_kube.url],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "operator           gpu-operator v26.7.0" in out
    assert "ClusterPolicy cluster-policy: notReady [Ready=False (DriverNotReady)]" in out
    assert "NVIDIADriver canary: notReady [Ready=False (DriverNotReady)]" in out
    assert "    default      upgrade-done=2, upgrade-required=1 (NVIDIADriver ready)" in out
    assert "    canary       (none)=1, cordon-required=1 (NVIDIADriver notReady)" in out


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def no_traceback(result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output


@pytest.fixture
def no_kubeconfig(tmp_path, monkeypatch) -> None:
    """No in-cluster service account and no kubeconfig, as on a laptop that never ran kubectl."""
    from kubernetes.config import kube_config

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "absent"))


def test_status_kube_without_a_cluster_says_how_to_point_at_one(stack_repo, no_kubeconfig):
    """The same message as `gpugate balance` and `gpugate certs`, never a traceback."""
    result = CliRunner().invoke(main, ["stack", "status", "--repo", str(stack_repo), "--kube"])
    no_traceback(result)
    assert result.exit_code == 1
    assert "error: no cluster to talk to (" in result.output
    assert "pass --kubeconfig FILE (and --context NAME) or --server URL, run in a pod with a service account, " \
           "or set KUBECONFIG" in result.output


@pytest.mark.parametrize(("command", "listing"), [
    (["status", "--kube"], "ClusterPolicies"),
    # the preflight rules read the cluster, CRDs first (and step 2 of the driver migration its ClusterPolicy)
    (["plan", "--operator", "v26.7.0", "--driver-management", "nvidiadriver", "--kube"], "CRDs"),
])
def test_stack_commands_against_a_server_that_does_not_answer_say_so(stack_repo, set_stack, command, listing):
    """urllib3's MaxRetryError was printed as "listing ClusterPolicies failed:
    HTTPConnectionPool(...)"; kubeclient words it for every command that talks to the cluster."""
    if command[0] == "plan":
        set_stack(operator_version="v26.7.0", management="clusterpolicy")
    result = CliRunner().invoke(main, ["stack", *command, "--repo", str(stack_repo),
                                       "--server", f"http://127.0.0.1:{closed_port()}"])
    no_traceback(result)
    assert result.exit_code == 1
    assert f"error: listing {listing}: the API server does not answer (" in result.output
    assert "check --server or KUBECONFIG and that the cluster is up" in result.output


def test_status_kube_when_the_api_server_refuses_names_its_answer(stack_repo, fake_kube):
    populate(fake_kube)
    fake_kube.fail_next("GET", r"/api/v1/nodes", code=403, reason="Forbidden",
                        message='nodes is forbidden: User "dev" cannot list resource "nodes"')
    result = CliRunner().invoke(main, ["stack", "status", "--repo", str(stack_repo), "--server", fake_kube.url])
    no_traceback(result)
    assert result.exit_code == 1
    assert ('error: listing nodes: the API server answered 403 nodes is forbidden: User "dev" cannot list '
            'resource "nodes"') in result.output


def test_a_failed_driver_upgrade_is_a_status_line_and_exit_1(stack_repo, fake_kube):
    """The upgrade controller records a failure only on the node label (and a metric);
    no ClusterPolicy or NVIDIADriver condition says it, so Argo CD stays Progressing. Status must say it."""
    populate(fake_kube)
    fake_kube.put(node("gpu-f", owner="canary", state="upgrade-failed", pool_label="canary"))
    result = CliRunner().invoke(main, ["stack", "status", "--repo", str(stack_repo), "--server", fake_kube.url],
                                catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert "DRIVER UPGRADE FAILED on pool canary: gpu-f." in result.output
    assert "kubectl label node gpu-f nvidia.com/gpu-driver-upgrade-state=upgrade-required --overwrite" in result.output
    data = json.loads(CliRunner().invoke(main, ["stack", "status", "--repo", str(stack_repo), "--server",
                                                fake_kube.url, "-o", "json"]).output)
    assert data["cluster"]["upgradeFailed"] == 1
    assert {p["name"]: p["upgradeFailed"] for p in data["cluster"]["pools"]} == {"default": [], "canary": ["gpu-f"]}


def test_status_names_the_chart_repository_of_the_site_file(stack_repo):
    result = CliRunner().invoke(main, ["stack", "status", "--repo", str(stack_repo)], catch_exceptions=False)
    assert result.exit_code == 0
    from webhook.stack import site

    chart_repo = site.load(stack_repo).chart_repo_url  # a fork's own site.yaml passes too
    assert f"operator           gpu-operator v26.7.0 ({chart_repo})" in result.output
