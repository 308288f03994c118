"""The harness does what a real cluster does: these are the promises other e2e tests build on.

A real API server answers; fake GPU nodes are Ready and heartbeat through Leases; the real
kube-scheduler places GPU pods and refuses impossible ones; Job pods complete and the Job
controller marks the Job Complete; the default admission chain mutates pods; a second
scheduler from the project's own KubeSchedulerConfiguration places pods that name it.
"""

from __future__ import annotations

import json
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import ServingCerts
from webhook.localcluster import binaries
from webhook.localcluster.cluster import Cluster, Nodes
from webhook.localcluster.fakekubelet import COMPLETE_AFTER, FAKE_NODE, LEASE_RENEW_SECONDS

ROOT = Path(__file__).resolve().parents[2]


def gpu_pod(name: str, *, gpus: int, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "containers": [{"name": "main", "image": "registry.example/cuda:12",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            **spec,
        },
    }


def read_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The pod as the API server stores it (plain JSON, camelCase keys)."""
    response = cluster.core().read_namespaced_pod(name, namespace, _preload_content=False)
    return json.loads(response.data)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == kind), {})


def test_api_server_answers_with_a_stamped_version(cluster: Cluster) -> None:
    version = client.VersionApi(cluster.api_client()).get_code()
    names = {ns.metadata.name for ns in cluster.core().list_namespace().items}

    assert {"default", "kube-system", "kube-node-lease"} <= names
    if cluster.plane is not None:
        stamped = binaries.version(binaries.KUBERNETES)
        assert version.git_version == stamped, "binaries.py stamps the version Helm's kubeVersion checks read"
        assert cluster.plane.get("/readyz") == (200, b"ok")


def test_gpu_node_is_ready_with_gfd_labels_and_its_lease_is_renewed(cluster: Cluster, nodes: Nodes) -> None:
    name = nodes.gpu(gpus=4, product="NVIDIA-A100-SXM4-80GB", family="ampere", clique="fabric-1.0",
                     mig={"1g.10gb": 7}, mig_config="all-balanced", whole_gpus=3)
    coordination = client.CoordinationV1Api(cluster.api_client())
    first = coordination.read_namespaced_lease(name, "kube-node-lease").spec.renew_time

    node = cluster.core().read_node(name)
    assert condition(cluster.api_client().sanitize_for_serialization(node), "Ready")["status"] == "True"
    assert not [t for t in node.spec.taints or [] if t.key.startswith("node.kubernetes.io/")]
    assert node.status.allocatable["nvidia.com/gpu"] == "3"
    assert node.status.allocatable["nvidia.com/mig-1g.10gb"] == "7"
    assert node.status.allocatable["cpu"] == "63500m", "allocatable is capacity minus the system reservation"
    assert node.metadata.labels | {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.clique": "fabric-1.0",
        "nvidia.com/mig.config": "all-balanced", FAKE_NODE: "true",
    } == node.metadata.labels

    renewed = wait_until(
        lambda: (lease := coordination.read_namespaced_lease(name, "kube-node-lease").spec.renew_time) > first
        and lease,
        timeout=LEASE_RENEW_SECONDS + 5, interval=0.5, what=f"the Lease of {name} to be renewed",
        explain=cluster.logs_tail)
    assert isinstance(renewed, datetime)


def test_gpu_pod_is_scheduled_to_a_gpu_node_runs_and_is_deleted(cluster: Cluster, nodes: Nodes,
                                                                 namespace: str) -> None:
    gpu_node = nodes.gpu(gpus=2)
    nodes.cpu()
    core = cluster.core()
    core.create_namespaced_pod(namespace, gpu_pod("trainer", gpus=1))

    pod = wait_until(lambda: (p := read_pod(cluster, namespace, "trainer"))["status"].get("phase") == "Running" and p,
                     what="pod trainer to run", explain=cluster.logs_tail)
    node = core.read_node(pod["spec"]["nodeName"])
    assert int(node.status.allocatable.get("nvidia.com/gpu", "0")) >= 1, "only GPU nodes fit"
    assert pod["spec"]["nodeName"] == gpu_node or cluster.plane is None, "the only GPU node here"
    assert condition(pod, "Ready")["status"] == "True"
    assert pod["status"]["containerStatuses"][0]["state"]["running"]
    assert pod["status"]["podIP"]
    wait_until(lambda: any(e.reason == "Scheduled" for e in core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=trainer").items), what="the Scheduled event")

    core.delete_namespaced_pod("trainer", namespace)  # graceful: the fake kubelet finishes it
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, timeout=10,
               what="the Terminating pod to be force-deleted", explain=cluster.logs_tail)


def test_pod_asking_more_gpus_than_any_node_has_stays_pending(cluster: Cluster, nodes: Nodes,
                                                              namespace: str) -> None:
    nodes.gpu(gpus=8)
    core = cluster.core()
    core.create_namespaced_pod(namespace, gpu_pod("greedy", gpus=1000))

    def failed_scheduling() -> client.CoreV1Event | None:
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=greedy").items
        return next((e for e in events if e.reason == "FailedScheduling"), None)

    event = wait_until(failed_scheduling, what="a FailedScheduling event for pod greedy", explain=cluster.logs_tail)
    # The event can be recorded before the scheduler writes the PodScheduled condition: wait for it too.
    def scheduled_condition_written() -> dict[str, Any] | None:
        stored = read_pod(cluster, namespace, "greedy")
        return stored if condition(stored, "PodScheduled") else None

    pod = wait_until(scheduled_condition_written, what="the PodScheduled condition of pod greedy",
                     explain=cluster.logs_tail)

    assert "Insufficient nvidia.com/gpu" in (event.message or "")
    assert pod["status"]["phase"] == "Pending"
    scheduled = condition(pod, "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")


def test_job_pod_completes_and_the_job_is_complete(cluster: Cluster, nodes: Nodes, namespace: str) -> None:
    nodes.gpu(gpus=1)
    template = gpu_pod("unused", gpus=1, labels={COMPLETE_AFTER: "1"}, restartPolicy="Never")
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "finetune"},
           "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": template["metadata"]["labels"]},
                                                    "spec": template["spec"]}}}
    batch = client.BatchV1Api(cluster.api_client())
    batch.create_namespaced_job(namespace, job)

    def complete() -> dict[str, Any] | None:
        current = json.loads(batch.read_namespaced_job("finetune", namespace, _preload_content=False).data)
        return current if condition(current, "Complete").get("status") == "True" else None

    done = wait_until(complete, timeout=30, what="job finetune to be Complete", explain=cluster.logs_tail)
    assert done["status"]["succeeded"] == 1
    pods = cluster.core().list_namespaced_pod(namespace, label_selector="batch.kubernetes.io/job-name=finetune").items
    assert [p.status.phase for p in pods] == ["Succeeded"]
    assert pods[0].status.container_statuses[0].state.terminated.exit_code == 0


def test_default_admission_chain_mutates_pods(cluster: Cluster, namespace: str) -> None:
    core = cluster.core()
    scheduling = client.SchedulingV1Api(cluster.api_client())
    priority_class = f"{namespace}-high"
    scheduling.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                      "metadata": {"name": priority_class}, "value": 1000})
    core.create_namespaced_limit_range(namespace, {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
        "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "250m"}, "default": {"cpu": "1"}}]}})
    try:
        core.create_namespaced_pod(namespace, gpu_pod("admitted", gpus=1, priorityClassName=priority_class))
        pod = read_pod(cluster, namespace, "admitted")
    finally:
        scheduling.delete_priority_class(priority_class)

    tolerations = {(t["key"], t.get("tolerationSeconds")) for t in pod["spec"]["tolerations"]}
    assert {("node.kubernetes.io/not-ready", 300), ("node.kubernetes.io/unreachable", 300)} <= tolerations, \
        "DefaultTolerationSeconds"
    token_volumes = [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    assert token_volumes and "serviceAccountToken" in token_volumes[0]["projected"]["sources"][0], "ServiceAccount"
    assert pod["spec"]["serviceAccountName"] == "default"
    assert pod["spec"]["priority"] == 1000, "Priority"
    assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "250m", "LimitRanger"
    assert pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1", \
        "extended resources: requests default to limits"


def test_project_scheduler_profile_runs_as_a_second_scheduler(cluster: Cluster, nodes: Nodes,
                                                              namespace: str, tmp_path: Path) -> None:
    """The shipped configuration as it is, but for where the extender is: its balancer Service is
    not here, so it points at a closed loopback port, and its CA file at a fresh CA. The extender is
    ignorable, so its outage must not stop the profile from scheduling (tests/e2e/test_extender.py
    shows its choice winning when it is up)."""
    if cluster.plane is None:
        pytest.skip("attached to an existing cluster: its schedulers are its own")
    config = yaml.safe_load((ROOT / "manifests/scheduler/scheduler-config.yaml").read_text())
    for extender in config.get("extenders") or []:
        assert extender.get("ignorable") is True, extender
        extender["urlPrefix"] = f"https://127.0.0.1:{closed_port()}/extender"
        if (extender.get("tlsConfig") or {}).get("caFile"):
            extender["tlsConfig"]["caFile"] = str(ServingCerts(tmp_path / "extender-ca").ca)
    profile = config["profiles"][0]["schedulerName"]
    scheduler = cluster.start_scheduler(config, name="gpugate-scheduler", leader_elect=False)
    try:
        gpu_node = nodes.gpu(gpus=2)
        cluster.core().create_namespaced_pod(namespace, gpu_pod("packed", gpus=1, schedulerName=profile))
        pod = wait_until(lambda: (p := read_pod(cluster, namespace, "packed"))["spec"].get("nodeName") and p,
                         what=f"the {profile} scheduler to bind pod packed", explain=cluster.logs_tail)
    finally:
        scheduler.stop()
    assert pod["spec"]["nodeName"] == gpu_node


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
