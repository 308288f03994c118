"""NVIDIA's driver upgrade state machine on a real control plane, without Argo CD.

``gpu-upgrade-controller`` (k8s-operator-libs ``pkg/upgrade`` at the version GPU Operator v26.7.0
pins, reconciled as ``controllers/upgrade_controller.go`` does) and the stand-in for the
operator's other controllers (``argocd_standin``: the driver DaemonSets per NVIDIADriver, node
ownership, status) run against a control plane of this module's own, with NVIDIA's CRDs
(``../shared/schemas``). NVIDIADriver objects are applied directly; the real DaemonSet, ReplicaSet
and disruption controllers and the scheduler do the rest; the fake kubelet has a pod lifecycle
(:data:`tests.e2e.argocd_env.POD_LIFECYCLE`).

What the library does here that the old stand-in did not: drain-required with real evictions
under a PodDisruptionBudget when pod deletion refuses a pod (an emptyDir), the restart-only path
when only a label of the driver pod changes (DRIVER_CONFIG_DIGEST unchanged), upgrade-failed read
from the driver container's restart count, in-sync decided by controller revision.
"""

from __future__ import annotations

import copy
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e import argocd_harness as harness
from tests.e2e import binaries as e2e_binaries
from tests.e2e.argocd_env import BAD_DRIVER, POD_LIFECYCLE, POOL_LABEL
from tests.e2e.argocd_standin import (
    NFD_GPU_LABEL,
    NFD_OS_ID,
    NFD_OS_VERSION,
    OWNER_LABEL,
    GPUOperatorStandIn,
)
from tests.e2e.argocd_upgrades import (
    IN_PLACE_STEPS,
    NodeHistory,
    UpgradeController,
    in_order,
    ready_workload_pods,
    start_gpu_workload,
)
from tests.e2e.waiting import wait_until
from tests.prerequisites import missing, needed
from webhook.localcluster import binaries, controlplane
from webhook.localcluster.cluster import KUBECONFIG_ENV, Cluster

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT.parent / "shared" / "schemas"
NAMESPACE = "gpu-operator"
OLD, NEW = "595.91.07", "610.57.04"
STACK = ROOT / "manifests" / "gpu-operator" / "stack.yaml"
GPUGATE = Path(sys.executable).with_name("gpugate")

pytestmark = pytest.mark.e2e


@dataclass
class Rig:
    cluster: Cluster
    kubectl: harness.Kubectl
    standin: GPUOperatorStandIn
    upgrades: UpgradeController
    history: NodeHistory
    canary: list[str]
    default: list[str]

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.cluster.api_client())

    def explain(self) -> str:
        return "\n".join([self.standin.explain(), self.upgrades.tail(25), "nodes:",
                          self.history.timeline(self.history.changes[0].at if self.history.changes else 0.0),
                          self.cluster.logs_tail(5)])

    def snapshot(self) -> dict[str, Any]:
        return self.standin.snapshot()

    def driver(self, name: str) -> Obj:
        return dict(self.custom.get_cluster_custom_object("nvidia.com", "v1alpha1", "nvidiadrivers", name))

    def patch_driver(self, name: str, spec: Obj) -> None:
        self.custom.patch_cluster_custom_object("nvidia.com", "v1alpha1", "nvidiadrivers", name, {"spec": spec})


def nvidia_driver(name: str, pool: Obj, version: str) -> Obj:
    """An NVIDIADriver as ``gpugate stack`` renders one for ``pool`` of stack.yaml."""
    spec: Obj = {"default": pool.get("default", False), "driverType": "gpu", "usePrecompiled": False,
                 "repository": "nvcr.io/nvidia", "image": "driver", "version": version,
                 "upgradePolicy": copy.deepcopy(pool["upgradePolicy"])}
    if pool.get("nodeSelector"):
        spec["nodeSelector"] = dict(pool["nodeSelector"])
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    if os.environ.get(KUBECONFIG_ENV):
        pytest.skip(f"{KUBECONFIG_ENV}: these tests need a control plane of their own")
    needed(SCHEMAS / "nvidia.com_nvidiadrivers.yaml", "a fresh clone has no ../shared: no NVIDIA CRDs")
    found, controller = binaries.paths(), e2e_binaries.upgrade_controller()
    if found is None or controller is None or shutil.which("kubectl") is None:
        missing("the e2e binaries (with gpu-upgrade-controller) or kubectl are missing; run "
                 "`python -m tests.e2e.binaries build`")
        raise AssertionError("unreachable")
    workdir = Path(tempfile.mkdtemp(prefix="gpugate-upgrades-"))
    keep = bool(os.environ.get("GPUGATE_E2E_KEEP"))
    cluster = Cluster.local(found, settings=controlplane.Settings(keep_workdir=keep))
    parts: list[Any] = []
    try:
        cluster.kubelet.lifecycle = POD_LIFECYCLE
        kubectl = harness.Kubectl(cluster.kubeconfig)
        kubectl("apply", "--server-side", "-f", str(SCHEMAS / "nvidia.com_nvidiadrivers.yaml"),
                "-f", str(SCHEMAS / "nvidia.com_clusterpolicies.yaml"))
        harness.wait_established(cluster.kubeconfig, ["nvidiadrivers.nvidia.com", "clusterpolicies.nvidia.com"])
        core, apps = cluster.core(), client.AppsV1Api(cluster.api_client())
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        labels = {NFD_GPU_LABEL: "true", NFD_OS_ID: "ubuntu", NFD_OS_VERSION: "24.04"}
        suffix = secrets.token_hex(2)
        canary = [cluster.add_gpu_node(f"up-canary-{suffix}-{i}", labels={**labels, POOL_LABEL: "canary"})
                  for i in (1, 2)]
        default = [cluster.add_gpu_node(f"up-default-{suffix}-1", labels=labels)]
        # The operator's own Deployment: the stand-in writes nothing until it is available.
        apps.create_namespaced_deployment(NAMESPACE, {
            "metadata": {"name": "gpu-operator"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "gpu-operator"}},
                     "template": {"metadata": {"labels": {"app": "gpu-operator"}},
                                  "spec": {"containers": [{"name": "operator",
                                                           "image": "nvcr.io/nvidia/gpu-operator:v26.7.0"}]}}}})
        history = NodeHistory(cluster.api_client(), canary + default).start()
        parts.append(history)
        standin = GPUOperatorStandIn(cluster.api_client()).start()
        parts.append(standin)
        upgrades = UpgradeController(controller, cluster.kubeconfig, workdir, namespace=NAMESPACE).start()
        parts.append(upgrades)
        standin.pause_others.append(upgrades.pause)
        rig = Rig(cluster, kubectl, standin, upgrades, history, canary, default)
        pools = {p["name"]: p for p in yaml.safe_load(STACK.read_text())["pools"]}
        kubectl.apply_objects([{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                                "metadata": {"name": "cluster-policy"},
                                "spec": {"driver": {"enabled": True, "useNvidiaDriverCRD": True},
                                         **{key: {} for key in ("daemonsets", "dcgm", "dcgmExporter", "devicePlugin",
                                                                "gfd", "nodeStatusExporter", "operator", "toolkit")}}}])
        kubectl.apply_objects([nvidia_driver("default", pools["default"], OLD),
                               nvidia_driver("canary", pools["canary"], OLD)])
        wait_until(lambda: all(s["state"] == "upgrade-done" and s["ready"] for s in rig.snapshot().values()),
                   timeout=120, what="every node upgrade-done with a Ready driver pod", explain=rig.explain)
        yield rig
    finally:
        for part in reversed(parts):
            part.stop()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_new_canary_driver_walks_nvidias_states_drains_under_the_pdb_and_reschedules(rig: Rig) -> None:
    namespace = start_gpu_workload(rig.cluster.api_client(), {POOL_LABEL: "canary"}, explain=rig.explain)
    before = set(ready_workload_pods(rig.cluster.api_client(), namespace))
    started = rig.history.changes[-1].at + 1e-6
    rig.patch_driver("canary", {"version": NEW})
    wait_until(lambda: all(rig.snapshot()[n]["state"] == "upgrade-done" and rig.snapshot()[n]["driver"] == NEW
                           and rig.snapshot()[n]["ready"] for n in rig.canary),
               timeout=240, what="both canary nodes upgraded to the new driver", explain=rig.explain)
    walks = {n: rig.history.states_walked(n, started) for n in rig.canary}
    for node, walked in walks.items():
        assert in_order(walked, IN_PLACE_STEPS), f"{node}: {walked}\n{rig.explain()}"
    # A node holding a GPU pod with an emptyDir when its turn came: pod deletion (deleteEmptyDir
    # false) refused it, and the drain (deleteEmptyDir true) evicted it, the PDB honoured.
    assert any(in_order(w, ("pod-deletion-required", "drain-required", "pod-restart-required"))
               for w in walks.values()), walks
    most, at_once = rig.history.most_upgrading(rig.canary, started)
    assert most == 1, f"maxParallelUpgrades 1, but {at_once} upgraded at once\n{rig.history.timeline(started)}"
    assert not rig.history.since(started, rig.default), "the canary's new driver moved the default pool"
    after = ready_workload_pods(rig.cluster.api_client(), namespace)
    assert len(after) == 2 and not set(after) & before, f"GPU pods not evicted and rescheduled: {before} -> {after}"
    assert rig.driver("canary")["status"]["state"] == "ready"
    assert not any(rig.snapshot()[n]["unschedulable"] for n in rig.canary)


def test_a_label_only_change_restarts_the_driver_in_place_without_draining(rig: Rig) -> None:
    """gpu-operator PR #2527 (k8s-operator-libs RestartOnlyPredicate): DRIVER_CONFIG_DIGEST unchanged."""
    started = rig.history.changes[-1].at + 1e-6
    pods = rig.cluster.core().list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=nvidia-driver")
    old_pods = {p.metadata.uid for p in pods.items if p.spec.node_name in rig.default}
    rig.patch_driver("default", {"labels": {"team": "ml"}})
    wait_until(lambda: rig.history.states_walked(rig.default[0], started)[-1:] == ["upgrade-done"]
               and len(rig.history.states_walked(rig.default[0], started)) > 1,
               timeout=120, what="the default node restarted in place", explain=rig.explain)
    walked = rig.history.states_walked(rig.default[0], started)
    assert "pod-restart-required" in walked and not {"wait-for-jobs-required", "pod-deletion-required",
                                                     "drain-required"} & set(walked), walked
    pods = rig.cluster.core().list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=nvidia-driver")
    now = {p.metadata.uid for p in pods.items if p.spec.node_name in rig.default and not p.metadata.deletion_timestamp}
    assert now and not now & old_pods, "the driver pod was not restarted"
    assert not rig.cluster.core().read_node(rig.default[0]).spec.unschedulable


def test_a_crash_looping_driver_fails_the_node_and_the_next_one_waits(rig: Rig) -> None:
    rig.patch_driver("canary", {"version": BAD_DRIVER})
    wait_until(lambda: any(rig.snapshot()[n]["state"] == "upgrade-failed" for n in rig.canary), timeout=180,
               what="a canary node upgrade-failed", explain=rig.explain)
    rig.upgrades.wait_reconciles(5)
    snapshot = rig.snapshot()
    failed = [n for n in rig.canary if snapshot[n]["state"] == "upgrade-failed"]
    assert len(failed) == 1, snapshot
    assert snapshot[failed[0]]["restarts"] > 10 and snapshot[failed[0]]["driver"] == BAD_DRIVER, snapshot
    other = next(n for n in rig.canary if n not in failed)
    assert snapshot[other]["state"] == "upgrade-required" and snapshot[other]["driver"] == NEW, snapshot
    assert snapshot[failed[0]]["unschedulable"], "a failed node stays cordoned"
    assert rig.driver("canary")["status"]["state"] == "notReady"
    # Rolled back in the CR: the failed node stays failed until it is retried.
    rig.patch_driver("canary", {"version": NEW})
    rig.upgrades.wait_reconciles(8)
    assert rig.snapshot()[failed[0]]["state"] == "upgrade-failed"
    rig.kubectl("label", "node", failed[0], "nvidia.com/gpu-driver-upgrade-state=upgrade-required", "--overwrite")
    wait_until(lambda: all(rig.snapshot()[n]["state"] == "upgrade-done" and rig.snapshot()[n]["driver"] == NEW
                           for n in rig.canary), timeout=180, what="the canary pool back on the old driver",
               explain=rig.explain)
    assert not any(rig.snapshot()[n]["unschedulable"] for n in rig.canary)


def test_stack_plan_kube_reads_the_cluster_and_names_a_pod_that_pins_the_canarys_driver(rig: Rig) -> None:
    """``gpugate stack plan --kube`` against the real API server: the CRDs as served, the GPU nodes (all
    upgrade-done by now), the pods; a privileged pod mounting /dev/nvidia0 on a canary node, with no GPU
    request the upgrade deletes it for, fails the plan of a canary driver change, named, with the fix;
    and the same plan for the default pool, whose nodes it does not touch, passes that rule."""
    core = rig.cluster.core()
    core.create_namespace({"metadata": {"name": "ops"}})
    core.create_namespaced_pod("ops", {"metadata": {"name": "gpu-probe-0"}, "spec": {
        "nodeName": rig.canary[0], "tolerations": [{"operator": "Exists"}],
        "volumes": [{"name": "nvidia0", "hostPath": {"path": "/dev/nvidia0"}}],
        "containers": [{"name": "probe", "image": "registry.example/gpu-probe:2",
                        "securityContext": {"privileged": True},
                        "volumeMounts": [{"name": "nvidia0", "mountPath": "/dev/nvidia0"}]}]}})
    env = {**os.environ, KUBECONFIG_ENV: "", "KUBECONFIG": str(rig.cluster.kubeconfig)}

    def plan(pool: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(GPUGATE), "stack", "plan", "--repo", str(ROOT), "--operator", "v26.7.0",
                               "--driver", NEW, "--pool", pool, "--skip-chart-render", "--kube"],
                              capture_output=True, text=True, env=env, timeout=300, check=False)

    canary = plan("canary")
    assert canary.returncode == 1, canary.stdout + canary.stderr
    [line] = [x for x in canary.stdout.splitlines() if "gpu-consumers" in x]
    assert line.strip().startswith("FAIL") and "pod ops/gpu-probe-0 on " + rig.canary[0] in line, canary.stdout
    assert "fix: stop them on the reloaded nodes" in canary.stdout
    assert "CRD(s)" in next(x for x in canary.stdout.splitlines() if x.strip().startswith("PASS  cluster"))
    default = plan("default")
    assert "PASS  gpu-consumers" in default.stdout, default.stdout
    core.delete_namespace("ops")


def test_ownership_fails_closed_on_a_conflict_and_drops_a_stale_owner(rig: Rig) -> None:
    """internal/nvidiadriver AssignOwners: two non-default CRs on one node change no label; a node
    no CR claims loses its owner label."""
    pools = {p["name"]: p for p in yaml.safe_load(STACK.read_text())["pools"]}
    rig.kubectl.apply_objects([nvidia_driver("canary-twin", pools["canary"], NEW)])
    wait_until(lambda: (rig.driver("canary-twin").get("status") or {}).get("state") == "notReady"
               and rig.driver("canary")["status"]["state"] == "notReady", timeout=30,
               what="both canary CRs notReady", explain=rig.explain)
    reasons = {c["reason"] for c in rig.driver("canary-twin")["status"]["conditions"] if c["type"] == "Error"}
    assert reasons == {"ConflictingNodeSelector"}
    labels = {n: rig.cluster.core().read_node(n).metadata.labels for n in rig.canary + rig.default}
    assert {labels[n].get(OWNER_LABEL) for n in rig.canary} == {"canary"}
    rig.kubectl("delete", "nvidiadriver", "canary-twin")
    rig.kubectl("delete", "nvidiadriver", "default")
    wait_until(lambda: OWNER_LABEL not in (rig.cluster.core().read_node(rig.default[0]).metadata.labels or {}),
               timeout=30, what="the stale owner label removed", explain=rig.explain)
