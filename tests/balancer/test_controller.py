"""The balancer end to end: the real kubernetes client against tests/kubefake.py."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest

from tests.balancer.conftest import fast_settings, wait_for
from tests.balancer.test_prometheus import FakePrometheus, vector
from tests.kubefake import STRATEGIC_PATCH, FakeKube
from webhook.balancer.prometheus import PROFILING_METRIC
from webhook.balancer.settings import PrometheusSettings
from webhook.logs import JSONFormatter
from webhook.names import CONGESTED_TAINT_KEY, GPU_FREE_LABEL, GPU_LOAD_LABEL

OURS = (GPU_FREE_LABEL, GPU_LOAD_LABEL)


def gpu_node(name: str, gpus: int = 8, labels: dict | None = None, taints: list | None = None) -> dict:
    allocatable = {"cpu": "64", "memory": "512Gi"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = str(gpus)
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "status": {"allocatable": allocatable, "capacity": dict(allocatable)}}
    if taints is not None:
        body["spec"] = {"taints": taints}
    return body


def cpu_node(name: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}}


def gpu_pod(name: str, node: str, gpus: int = 1, phase: str = "Running", namespace: str = "ml") -> dict:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {"requests": {"cpu": "1"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer", "resources": resources}]},
            "status": {"phase": phase}}


def labels_of(fk: FakeKube, name: str) -> dict:
    return (fk.get("v1", "Node", name) or {}).get("metadata", {}).get("labels") or {}


def marks(fk: FakeKube, name: str) -> tuple[str | None, str | None]:
    labels = labels_of(fk, name)
    return labels.get(GPU_FREE_LABEL), labels.get(GPU_LOAD_LABEL)


def node_patches(fk: FakeKube, name: str | None = None) -> list:
    return [r for r in fk.requests if r.method == "PATCH" and r.path.startswith("/api/v1/nodes/")
            and (name is None or r.path == f"/api/v1/nodes/{name}")]


def sample(balancer, metric: str, **labels: str) -> float | None:
    return balancer.metrics.registry.get_sample_value(metric, labels or None)


def test_labels_converge_as_pods_are_added_and_deleted(fake_kube: FakeKube, start_balancer) -> None:
    fake_kube.put(gpu_node("gpu-1", labels={"team": "vision"}))
    fake_kube.put(gpu_node("gpu-2"))
    fake_kube.put(cpu_node("cpu-1", labels={"team": "web"}))
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=2))
    fake_kube.put(gpu_pod("done", "gpu-1", gpus=4, phase="Succeeded"))  # finished: holds nothing
    fake_kube.put(gpu_pod("pending", "", gpus=8))  # unbound: holds nothing
    start_balancer()
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("6", "idle") and marks(fake_kube, "gpu-2") == ("8", "idle"),
             what="first labels")
    fake_kube.put(gpu_pod("b", "gpu-1", gpus=6))
    fake_kube.put(gpu_pod("c", "gpu-2", gpus=4))
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("0", "congested") and marks(fake_kube, "gpu-2") == ("4", "busy"),
             what="labels after pods were added")
    fake_kube.delete("v1", "Pod", "b", "ml")
    fake_kube.put(gpu_pod("c", "gpu-2", gpus=4, phase="Failed"))
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("6", "idle") and marks(fake_kube, "gpu-2") == ("8", "idle"),
             what="labels after pods were deleted or finished")
    assert labels_of(fake_kube, "gpu-1")["team"] == "vision"
    assert labels_of(fake_kube, "cpu-1") == {"team": "web"}
    assert node_patches(fake_kube, "cpu-1") == []
    assert {r.content_type for r in node_patches(fake_kube)} == {STRATEGIC_PATCH}
    # one patch per node per change: first labels, pods added, pods gone
    assert len(node_patches(fake_kube, "gpu-1")) == 3 and len(node_patches(fake_kube, "gpu-2")) == 3


def test_nothing_is_written_when_no_value_changes(fake_kube: FakeKube, start_balancer) -> None:
    fake_kube.put(gpu_node("gpu-1"))
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=2))
    running = start_balancer(fast_settings(resync_interval=0.1))
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("6", "idle"), what="labels")
    before = len(node_patches(fake_kube))
    fake_kube.put(gpu_pod("cpu-only", "gpu-1", gpus=0))  # holds no GPU
    pod = gpu_pod("a", "gpu-1", gpus=2)
    pod["metadata"]["labels"] = {"changed": "yes"}  # same GPUs, other fields changed
    fake_kube.put(pod)
    first = sample(running.balancer, "gpugate_balancer_last_full_sync_timestamp_seconds")
    wait_for(lambda: sample(running.balancer, "gpugate_balancer_last_full_sync_timestamp_seconds") > first + 0.2,
             what="a few full resyncs")
    assert len(node_patches(fake_kube)) == before


def test_a_node_that_stops_being_a_gpu_node_loses_only_our_marks(fake_kube: FakeKube, start_balancer) -> None:
    theirs = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    fake_kube.put(gpu_node("gpu-1", gpus=2, labels={"team": "a"}, taints=[theirs]))
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=2))
    start_balancer(fast_settings(taint_congested=True))
    ours = {"key": CONGESTED_TAINT_KEY, "effect": "PreferNoSchedule"}
    wait_for(lambda: (fake_kube.get("v1", "Node", "gpu-1").get("spec") or {}).get("taints") == [theirs, ours],
             what="congested taint")
    assert marks(fake_kube, "gpu-1") == ("0", "congested")
    fake_kube.put(gpu_node("gpu-1", gpus=None, labels={"team": "a", GPU_FREE_LABEL: "0",
                                                       GPU_LOAD_LABEL: "congested"}, taints=[theirs, ours]))
    wait_for(lambda: marks(fake_kube, "gpu-1") == (None, None), what="our labels removed")
    node = fake_kube.get("v1", "Node", "gpu-1")
    assert node["spec"]["taints"] == [theirs]
    assert node["metadata"]["labels"] == {"kubernetes.io/hostname": "gpu-1", "team": "a"}


def test_congested_taint_is_lifted_when_the_node_frees_up(fake_kube: FakeKube, start_balancer) -> None:
    fake_kube.put(gpu_node("gpu-1", gpus=2))
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=2))
    start_balancer(fast_settings(taint_congested=True))
    wait_for(lambda: (fake_kube.get("v1", "Node", "gpu-1").get("spec") or {}).get("taints"), what="taint")
    fake_kube.delete("v1", "Pod", "a", "ml")
    wait_for(lambda: (fake_kube.get("v1", "Node", "gpu-1")["spec"].get("taints") == []
                      and marks(fake_kube, "gpu-1") == ("2", "idle")), what="taint lifted")


def test_an_expired_watch_relists_and_converges(fake_kube: FakeKube, start_balancer) -> None:
    fake_kube.put(gpu_node("gpu-1"))
    running = start_balancer()
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("8", "idle"), what="labels")
    wait_for(lambda: fake_kube.open_watches("pods") and fake_kube.open_watches("nodes"), what="watches")
    lists_before = sum(1 for r in fake_kube.requests if r.path == "/api/v1/pods" and "watch" not in r.query)
    fake_kube.expire_watches()
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=5))
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("3", "busy"), what="labels after relist")
    lists_after = sum(1 for r in fake_kube.requests if r.path == "/api/v1/pods" and "watch" not in r.query)
    assert lists_after > lists_before
    assert sample(running.balancer, "gpugate_balancer_relists_total", resource="pods") >= 1
    assert sample(running.balancer, "gpugate_balancer_relists_total", resource="nodes") >= 1


def test_api_errors_back_off_and_never_stop_the_balancer(fake_kube: FakeKube, start_balancer) -> None:
    fake_kube.put(gpu_node("gpu-1"))
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=1))
    fake_kube.fail_next("GET", r"^/api/v1/pods$", 500, count=3)
    fake_kube.fail_next("PATCH", r"^/api/v1/nodes/gpu-1$", 503, count=2)
    running = start_balancer()
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("7", "idle"), what="labels despite errors")
    b = running.balancer
    assert sample(b, "gpugate_balancer_api_errors_total", operation="pods.list") == 3
    assert sample(b, "gpugate_balancer_api_errors_total", operation="patch_node") == 2
    assert sample(b, "gpugate_balancer_label_writes_total", result="error") == 2
    wait_for(lambda: sample(b, "gpugate_balancer_label_writes_total", result="ok") == 1, what="one good write counted")


def test_only_the_leader_writes_and_a_standby_takes_over_when_it_stops(fake_kube: FakeKube, start_balancer) -> None:
    fake_kube.put(gpu_node("gpu-1"))
    first = start_balancer(fast_settings())
    wait_for(lambda: first.balancer.writes(), what="first replica leading")
    second = start_balancer(fast_settings(lease={"identity": "replica-b"}))
    wait_for(lambda: second.balancer.synced, what="standby caches synced")
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=3))
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("5", "idle"), what="labels from the leader")
    wait_for(lambda: "gpu-1" in second.balancer.tiers(), what="standby computed tiers")
    assert sample(second.balancer, "gpugate_balancer_label_writes_total", result="ok") in (None, 0.0)
    assert sample(second.balancer, "gpugate_balancer_leader") == 0
    assert sample(first.balancer, "gpugate_balancer_leader") == 1
    wait_for(lambda: sample(first.balancer, "gpugate_balancer_label_writes_total", result="ok")
             == len(node_patches(fake_kube)), what="every node patch counted by the leader")

    first.stop()  # releases the lease
    lease = fake_kube.get("coordination.k8s.io/v1", "Lease", "gpugate-balancer", "gpugate-system")
    assert not lease["spec"].get("holderIdentity")
    wait_for(lambda: second.balancer.writes(), timeout=3, what="standby taking over")
    fake_kube.put(gpu_pod("b", "gpu-1", gpus=4))
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("1", "busy"), what="labels from the new leader")
    # The counter moves once the PATCH has returned, a moment after the fake stored it.
    wait_for(lambda: sample(second.balancer, "gpugate_balancer_label_writes_total", result="ok") == 1,
             what="the new leader counting its one write")
    lease = fake_kube.get("coordination.k8s.io/v1", "Lease", "gpugate-balancer", "gpugate-system")
    assert lease["spec"]["holderIdentity"] == "replica-b" and lease["spec"]["leaseTransitions"] == 1


def test_prometheus_utilization_sets_tiers_and_its_loss_falls_back_to_allocation(
        fake_kube: FakeKube, start_balancer) -> None:
    prom = FakePrometheus()
    prom.answers[PROFILING_METRIC] = vector([({"Hostname": "gpu-1"}, 0.95), ({"Hostname": "gpu-2"}, 0.1)])
    fake_kube.put(gpu_node("gpu-1"))
    fake_kube.put(gpu_node("gpu-2"))
    settings = fast_settings(prometheus=PrometheusSettings(url=prom.url, interval=0.1, timeout=0.5, stale_after=0.3))
    running = start_balancer(settings)
    try:
        wait_for(lambda: marks(fake_kube, "gpu-1") == ("8", "congested") and marks(fake_kube, "gpu-2") == ("8", "idle"),
                 what="utilization-driven tiers")
        b = running.balancer
        assert sample(b, "gpugate_balancer_prometheus_up") == 1
        assert sample(b, "gpugate_balancer_allocation_only") == 0
        assert sample(b, "gpugate_balancer_nodes", tier="congested") == 1
    finally:
        prom.stop()
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("8", "idle"), what="allocation-only fallback")
    assert sample(b, "gpugate_balancer_prometheus_up") == 0
    assert sample(b, "gpugate_balancer_allocation_only") == 1
    assert b.status()["allocation_only"] is True


def test_dry_run_logs_changes_and_writes_nothing(fake_kube: FakeKube, start_balancer, caplog) -> None:
    fake_kube.put(gpu_node("gpu-1"))
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=8))
    caplog.set_level(logging.INFO, logger="gpugate")
    running = start_balancer(fast_settings(dry_run=True))
    wait_for(lambda: sample(running.balancer, "gpugate_balancer_label_writes_total", result="dry_run"),
             what="a dry-run change")
    running.stop()
    assert node_patches(fake_kube) == []
    assert not [r for r in fake_kube.requests if "leases" in r.path]
    record = next(r for r in caplog.records if r.getMessage() == "dry run: would patch node")
    assert record.fields["node"] == "gpu-1"
    assert record.fields["changes"] == {GPU_FREE_LABEL: [None, "0"], GPU_LOAD_LABEL: [None, "congested"]}
    line = json.loads(JSONFormatter().format(record))
    assert line["event"] == "dry run: would patch node" and line["level"] == "info" and line["node"] == "gpu-1"


def test_healthz_and_metrics_report_tiers_writes_errors_sync_and_leadership(
        fake_kube: FakeKube, start_balancer) -> None:
    fake_kube.put(gpu_node("gpu-1"))
    fake_kube.put(gpu_node("gpu-2"))
    fake_kube.put(gpu_pod("a", "gpu-2", gpus=8))
    running = start_balancer(serve_health=True)
    wait_for(lambda: marks(fake_kube, "gpu-2") == ("0", "congested") and marks(fake_kube, "gpu-1")[0] == "8",
             what="labels")
    wait_for(lambda: running.balancer.health is not None and running.balancer.status()["leader"], what="leader")
    base = f"http://127.0.0.1:{running.balancer.health.port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    health = json.loads(opener.open(f"{base}/healthz", timeout=5).read())
    assert health["ok"] is True and health["synced"] is True and health["leader"] is True
    text = opener.open(f"{base}/metrics", timeout=5).read().decode()
    for line in ('gpugate_balancer_nodes{tier="idle"} 1.0', 'gpugate_balancer_nodes{tier="congested"} 1.0',
                 'gpugate_balancer_label_writes_total{result="ok"} 2.0', "gpugate_balancer_leader 1.0",
                 "gpugate_balancer_allocation_only 1.0", "gpugate_balancer_prometheus_up -1.0"):
        assert line in text, line
    assert "gpugate_balancer_seconds_since_last_full_sync" in text
    since = float(next(x for x in text.splitlines() if x.startswith("gpugate_balancer_seconds_since_last_full_sync "))
                  .split()[1])
    assert 0 <= since < 10
    assert "gpugate_balancer_api_errors_total" in text or "gpugate_balancer_api_errors" in text
    with pytest.raises(urllib.error.HTTPError):
        opener.open(f"{base}/nope", timeout=5)
