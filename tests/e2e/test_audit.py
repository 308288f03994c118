"""``gpugate audit`` on the real API server: PolicyReports written for what runs, a policy change
shown at the next pass, and a clear refusal while the PolicyReport CRD is not installed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.webhook_fixture import GPUGATE, Namespaces, create_pod, kubectl, pod_manifest
from tests.server.harness import copy_policies
from webhook.localcluster.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "manifests" / "webhook" / "components" / "audit" / "policyreports-crd.yaml"
WEB = "GPUs are not available in web and frontend namespaces"


@pytest.fixture(scope="module")
def made(cluster: Cluster) -> Iterator[Namespaces]:
    made = Namespaces(cluster)
    yield made
    made.delete_all()


@pytest.fixture(scope="module")
def scene(cluster: Cluster, made: Namespaces) -> tuple[str, str]:
    """A GPU pod in a web namespace (created while no webhook judged it) and a GPU pod in an ML one."""
    web, ml = made.make("web-audit"), made.make("ml-audit")
    core = cluster.core()
    create_pod(core, web, pod_manifest("shop", gpus=1))
    create_pod(core, ml, pod_manifest("trainer", gpus=1))
    return web, ml


def audit(cluster: Cluster, policies: Path, *namespaces: str, extra: tuple[str, ...] = (),
          check: bool = False) -> subprocess.CompletedProcess[str]:
    args = [str(GPUGATE), "audit", "--kubeconfig", str(cluster.kubeconfig), "--policies", str(policies), *extra]
    for namespace in namespaces:
        args += ["-n", namespace]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=check)


def report(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    custom = client.CustomObjectsApi(cluster.api_client())
    try:
        return json.loads(custom.get_namespaced_custom_object("wgpolicyk8s.io", "v1alpha2", namespace, "policyreports",
                                                              "gpugate", _preload_content=False).data)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def test_without_the_crd_writing_reports_is_refused_naming_it(cluster: Cluster, scene: tuple[str, str],
                                                              tmp_path: Path) -> None:
    if kubectl(cluster, "get", "crd", "policyreports.wgpolicyk8s.io", check=False).returncode == 0:
        pytest.fail("the PolicyReport CRD is installed already: this test must run first in its module")
    done = audit(cluster, copy_policies(tmp_path / "policies"), *scene, extra=("--write-reports", "-o", "none"))
    assert done.returncode == 1 and "the PolicyReport CRD (policyreports.wgpolicyk8s.io) is not installed" \
        in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_one_pass_writes_a_report_per_namespace_and_exits_1_on_a_failure(cluster: Cluster, scene: tuple[str, str],
                                                                         tmp_path: Path) -> None:
    kubectl(cluster, "apply", "--server-side", "-f", str(CRD))
    kubectl(cluster, "wait", "--for=condition=Established", "crd/policyreports.wgpolicyk8s.io", "--timeout=60s")
    web, ml = scene
    done = audit(cluster, copy_policies(tmp_path / "policies"), web, ml, extra=("--write-reports", "-o", "json"))
    assert done.returncode == 1, done.stderr
    found = {(f["namespace"], f["name"]): f for f in json.loads(done.stdout)["findings"]}
    assert found[(web, "shop")]["result"] == "fail" and WEB in found[(web, "shop")]["message"]
    assert found[(ml, "trainer")]["result"] != "fail"
    written = report(cluster, web)
    assert written is not None and written["summary"]["fail"] == 1
    assert written["results"][0]["resources"][0]["name"] == "shop" and written["results"][0]["policy"] == "web-no-gpus"
    listed = kubectl(cluster, "get", "policyreports", "-n", web)  # the CRD's columns: Pass, Fail, Warn
    assert "gpugate" in listed.stdout and "FAIL" in listed.stdout.splitlines()[0]


def test_a_policy_change_shows_at_the_next_pass(cluster: Cluster, scene: tuple[str, str], tmp_path: Path) -> None:
    web, _ = scene
    policies = copy_policies(tmp_path / "policies")
    interval = 2.0
    command = [str(GPUGATE), "audit", "--kubeconfig", str(cluster.kubeconfig), "--policies", str(policies),
               "-n", web, "--write-reports", "--interval", str(interval), "-o", "none"]
    running = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env={**os.environ})
    try:
        _until(lambda: (report(cluster, web) or {}).get("summary", {}).get("fail") == 1, 30, "the first pass")
        (policies / "web-no-gpus.yaml").unlink()  # the deny rule is gone: the pod passes now
        changed = time.monotonic()
        _until(lambda: (report(cluster, web) or {}).get("summary", {}).get("fail") == 0, 30, "the change")
        # Within one resync after the pass that began before the change (a pass takes well under a second here).
        print(f"policy change shown after {time.monotonic() - changed:.1f} s (interval {interval:g} s)")
    finally:
        os.killpg(running.pid, signal.SIGTERM)
        _, stderr = running.communicate(timeout=30)
    assert running.returncode == 0 and "SIGTERM: audit stopped" in stderr, stderr


def _until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)

