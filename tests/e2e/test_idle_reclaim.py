"""Idle GPU allocations found and reclaimed where a policy allows, against the real control plane and Prometheus.

``tests/e2e/idle_env.py`` runs two ``gpugate balance --usage`` replicas as the balancer's
ServiceAccount (manifests/balancer's RBAC), a real Prometheus with the shipped gpugate-usage
rules, and a dcgm-exporter page the test writes. The policy evicts idle pods of the test's
namespace after 15 s under 5 % activity. Real controllers, scheduler and PodDisruptionBudget:

1. the idle notebook (a Deployment) is found, evicted through the Eviction API (an Event on it
   names the measured activity) and recreated by its ReplicaSet, once;
2. never touched: the busy pod (90 %), the pod labelled ``gpugate.io/no-reclaim`` (idle: an Event
   says so, no annotation, no eviction), the bare pod no controller would recreate (reported),
   the idle pod whose PodDisruptionBudget allows no disruption (429: an Event says so);
3. the standby replica writes nothing and says why (``gpugate_balancer_idle_paused{reason="standby"}``);
4. ``gpugate usage`` reads GPU-hours that add up, and ``--idle`` lists the findings;
5. Prometheus down: with the PodDisruptionBudget gone the guarded pod would be evicted, but
   nothing is, and ``gpugate_balancer_idle_paused{reason="prometheus"}`` says why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kubernetes import client

from tests.dcgmexporter import Device, Pod, Reading
from tests.e2e.idle_env import IdleStack, idle_stack
from tests.e2e.waiting import wait_until
from webhook.cli import main
from webhook.localcluster.cluster import Cluster, Nodes

AFTER = "15s"
ACTIVITY = {"notebook": 0.01, "busy": 0.9, "kept": 0.0, "guarded": 0.02, "scratch": 0.0}


def policy(namespace: str) -> str:
    return f"""apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {{name: idle-notebooks}}
spec:
  match: {{namespaces: [{namespace}]}}
  idle: {{action: evict, after: {AFTER}}}
"""


def pod_spec(node: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"labels": labels},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "main", "image": "registry.example/jupyter:4",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def deployment(name: str, node: str, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app": name, **(extra_labels or {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": pod_spec(node, labels)}}


@pytest.fixture
def stack(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[IdleStack]:
    with idle_stack(cluster, tmp_path, policy(namespace)) as started:
        yield started


def running(cluster: Cluster, namespace: str) -> dict[str, client.V1Pod]:
    """app label -> its one Running pod that is not terminating."""
    found = {}
    for item in cluster.core().list_namespaced_pod(namespace).items:
        if item.status.phase == "Running" and item.metadata.deletion_timestamp is None:
            found[(item.metadata.labels or {}).get("app", item.metadata.name)] = item
    return found


def events(cluster: Cluster, namespace: str) -> list[client.CoreV1Event]:
    return [e for e in cluster.core().list_namespaced_event(namespace).items
            if e.source and e.source.component == "gpugate-balancer"]


def show(stack: IdleStack, node: str, pods: dict[str, client.V1Pod], namespace: str) -> None:
    stack.exporter.show([Reading(device=Device(host=node, gpu=i, pod=Pod(name=p.metadata.name, namespace=namespace)),
                                 active=ACTIVITY[app]) for i, (app, p) in enumerate(sorted(pods.items()))])


def test_an_idle_notebook_is_evicted_and_recreated_and_nothing_else_is_touched(
        cluster: Cluster, nodes: Nodes, namespace: str, stack: IdleStack) -> None:
    node = nodes.gpu(gpus=8)
    apps = client.AppsV1Api(cluster.api_client())
    for name, labels in (("notebook", {}), ("busy", {}), ("kept", {"gpugate.io/no-reclaim": "true"}), ("guarded", {})):
        apps.create_namespaced_deployment(namespace, deployment(name, node, labels))
    client.PolicyV1Api(cluster.api_client()).create_namespaced_pod_disruption_budget(namespace, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    bare = pod_spec(node, {"app": "scratch"})
    bare["metadata"]["name"] = "scratch"
    cluster.core().create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", **bare})
    before = wait_until(lambda: (found := running(cluster, namespace)) and len(found) == 5 and found, timeout=60,
                        what="five GPU pods running", explain=cluster.logs_tail)
    show(stack, node, before, namespace)
    leader = stack.leader()
    standby = next(r for r in stack.replicas if r is not leader)

    # 1. The notebook is evicted once its 15 s of idleness are measured, and its ReplicaSet recreates it.
    old = before["notebook"].metadata.uid
    after = wait_until(lambda: (found := running(cluster, namespace)).get("notebook") is not None
                       and found["notebook"].metadata.uid != old and found, timeout=90,
                       what="the idle notebook evicted and recreated", explain=stack.explain)
    evicted = [e for e in events(cluster, namespace) if e.reason == "GPUIdleEvicted"]
    assert [e.involved_object.uid for e in evicted] == [old], evicted
    assert "idle for 15s" in evicted[0].message and "under the 5% of policy idle-notebooks" in evicted[0].message
    assert "recreates it" in evicted[0].message
    wait_until(lambda: leader.metric("gpugate_balancer_idle_actions_total", action="evict", result="pdb") >= 1,
               timeout=30, what="the guarded pod's eviction refused by its PodDisruptionBudget", explain=stack.explain)

    # 2. Never touched: same pods (UIDs), not terminating, no annotation; the reasons are Events.
    time.sleep(3)  # three more looks
    now = running(cluster, namespace)
    for app in ("busy", "kept", "guarded", "scratch"):
        assert now[app].metadata.uid == before[app].metadata.uid, app
        assert "gpugate.io/idle" not in (now[app].metadata.annotations or {}), app
    reasons = {(e.involved_object.name, e.reason) for e in events(cluster, namespace)}
    assert (before["kept"].metadata.name, "GPUIdle") in reasons
    assert (before["guarded"].metadata.name, "GPUIdleEvictionRefused") in reasons
    assert (before["scratch"].metadata.name, "GPUIdle") in reasons
    assert not any(name == before["busy"].metadata.name for name, _ in reasons)
    assert leader.metric("gpugate_balancer_idle_actions_total", action="evict", result="ok") == 1
    assert after["notebook"].metadata.uid not in {e.involved_object.uid for e in events(cluster, namespace)}

    # 3. The standby looked at nothing and wrote nothing.
    assert standby.metric("gpugate_balancer_idle_paused", reason="standby") == 1
    assert standby.metric("gpugate_balancer_idle_actions_total") == 0
    assert {e.reporting_instance for e in events(cluster, namespace)} == {leader.identity}
    assert leader.metric("gpugate_balancer_api_errors_total") == 0, leader.tail()

    # 4. gpugate usage: GPU-hours that add up; the findings by pod.
    runner = CliRunner()
    usage = runner.invoke(main, ["usage", "--prometheus", stack.prometheus.url, "--since", "20s", "--step", "1s",
                                 "-o", "json"])
    assert usage.exit_code == 0, usage.output
    report = json.loads(usage.output)
    assert report["identity_error"] is not None and report["identity_error"] < 0.01, report
    mine = {o["owner"]: o for o in report["owners"] if o["namespace"] == namespace}
    busy = mine["busy"]  # of its measured GPU-hours, the share used is its devices' activity
    assert busy["used"] / (busy["used"] + busy["idle"]) == pytest.approx(ACTIVITY["busy"])
    assert busy["allocated"] > 0
    assert busy["used"] + busy["idle"] + busy["unmeasured"] == pytest.approx(busy["allocated"])
    lines = runner.invoke(main, ["usage", "--prometheus", stack.prometheus.url, "--idle", "-o", "json"])
    listed = {x["pod"]: x["action"] for x in json.loads(lines.output) if x["namespace"] == namespace}
    assert listed == {before["kept"].metadata.name: "report", before["guarded"].metadata.name: "evict",
                      before["scratch"].metadata.name: "report"}

    # 5. Prometheus down: the guarded pod's PDB goes, yet nothing is evicted, and the metric says why.
    stack.prometheus.stop()
    client.PolicyV1Api(cluster.api_client()).delete_namespaced_pod_disruption_budget("guarded", namespace)
    wait_until(lambda: leader.metric("gpugate_balancer_idle_paused", reason="prometheus") == 1, timeout=30,
               what="the leader paused for Prometheus", explain=stack.explain)
    time.sleep(3)
    assert running(cluster, namespace)["guarded"].metadata.uid == before["guarded"].metadata.uid
    assert leader.metric("gpugate_balancer_idle_actions_total", action="evict", result="ok") == 1
