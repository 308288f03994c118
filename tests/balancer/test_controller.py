"""The balancer end to end: the real kubernetes client against tests/kubefake.py."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

from tests.balancer.conftest import fast_settings, wait_for
from tests.dcgmexporter import Exporter, whole_gpus
from tests.kubefake import STRATEGIC_PATCH, FakeKube
from tests.promserver import Prometheus
from webhook.balancer.prometheus import PROFILING_METRIC
from webhook.balancer.settings import PrometheusSettings
from webhook.kubeclient import api_client
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


def lists(fk: FakeKube, path: str) -> int:
    """Lists of ``path``: paged (GET without watch) or streamed (a watch with sendInitialEvents)."""
    return sum(1 for r in fk.requests if r.method == "GET" and r.path == path
               and ("watch" not in r.query or r.query.get("sendInitialEvents") == "true"))


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
    lists_before = lists(fake_kube, "/api/v1/pods")
    fake_kube.expire_watches()
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=5))
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("3", "busy"), what="labels after relist")
    lists_after = lists(fake_kube, "/api/v1/pods")
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
        fake_kube: FakeKube, start_balancer, tmp_path: Path) -> None:
    """A real Prometheus scraping a dcgm-exporter page evaluates the balancer's query."""
    exporter = Exporter()
    exporter.show([*whole_gpus("gpu-1", [0.95] * 8), *whole_gpus("gpu-2", [0.1] * 8)])
    try:
        prom = Prometheus(tmp_path / "prometheus", {"nvidia-dcgm-exporter": [exporter.target]}, interval="500ms")
        try:
            prom.wait_for(PROFILING_METRIC)
            fake_kube.put(gpu_node("gpu-1"))
            fake_kube.put(gpu_node("gpu-2"))
            settings = fast_settings(prometheus=PrometheusSettings(url=prom.url, interval=0.1, timeout=0.5,
                                                                   stale_after=0.3))
            running = start_balancer(settings)
            wait_for(lambda: marks(fake_kube, "gpu-1") == ("8", "congested")
                     and marks(fake_kube, "gpu-2") == ("8", "idle"), what="utilization-driven tiers")
            b = running.balancer
            assert sample(b, "gpugate_balancer_prometheus_up") == 1
            assert sample(b, "gpugate_balancer_allocation_only") == 0
            assert sample(b, "gpugate_balancer_nodes", tier="congested") == 1
        finally:
            prom.stop()
    finally:
        exporter.stop()
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


# ---- marks, pacing, fencing, watches, readiness, deletion -----------------------------------------
LEASE_PATH = r"^/apis/coordination.k8s.io/v1/namespaces/gpugate-system/leases/gpugate-balancer$"


def patch_times(fk: FakeKube, name: str | None = None) -> list[float]:
    return sorted(r.at for r in node_patches(fk, name) if r.status == 200)


def test_sriov_functions_are_not_gpus_a_full_node_is_congested_and_a_nic_node_unlabelled(
        fake_kube: FakeKube, start_balancer) -> None:
    """8 GPUs taken next to 16 idle SR-IOV VFs is congested; a CPU node with such NICs is no GPU node."""
    full = gpu_node("gpu-1")
    full["status"]["allocatable"]["nvidia.com/cx7_sriov_rdma"] = "16"
    fake_kube.put(full)
    nics = cpu_node("cpu-1")
    nics["status"]["allocatable"]["nvidia.com/cx7_sriov_rdma"] = "16"
    fake_kube.put(nics)
    pod = gpu_pod("a", "gpu-1", gpus=8)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/cx7_sriov_rdma"] = "1"
    fake_kube.put(pod)
    running = start_balancer()
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("0", "congested"), what="the full GPU node congested")
    wait_for(lambda: sample(running.balancer, "gpugate_balancer_last_full_sync_timestamp_seconds"), what="a pass")
    assert labels_of(fake_kube, "cpu-1") == {} and node_patches(fake_kube, "cpu-1") == []


def test_a_burst_costs_each_node_one_patch_per_interval_and_a_tier_change_waits_too(
        fake_kube: FakeKube, start_balancer) -> None:
    """Coalescing. Changes wait for the node's interval (the latest wins), a tier
    change as much as one of gpu-free: at most one Node write per node per interval, whatever changed."""
    interval = 3.0
    for i in range(10):
        fake_kube.put(gpu_node(f"gpu-{i}"))
    start_balancer(fast_settings(write_interval=interval))
    wait_for(lambda: all(marks(fake_kube, f"gpu-{i}") == ("8", "idle") for i in range(10)), what="first labels")
    first = {f"gpu-{i}": len(node_patches(fake_kube, f"gpu-{i}")) for i in range(10)}
    for step in range(3):  # three pod waves, 0.2 s apart: gpu-free 8 -> 5, still idle
        fake_kube.put_many(gpu_pod(f"p{step}-{i}", f"gpu-{i}", gpus=1) for i in range(10))
        time.sleep(0.2)
    wait_for(lambda: all(marks(fake_kube, f"gpu-{i}") == ("5", "idle") for i in range(10)), timeout=8,
             what="the latest gpu-free on every node")
    for i in range(10):
        assert len(node_patches(fake_kube, f"gpu-{i}")) - first[f"gpu-{i}"] <= 2, f"gpu-{i} patched per event"
    # One more GPU makes gpu-0 busy (4 of 8): a tier change, which waits out the interval too.
    fake_kube.put(gpu_pod("tip", "gpu-0", gpus=1))
    wait_for(lambda: marks(fake_kube, "gpu-0") == ("4", "busy"), timeout=interval + 3, what="the tier change")
    times = patch_times(fake_kube, "gpu-0")
    assert len(times) >= 2
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) >= interval * 0.95, f"gpu-0 written twice within {interval} s: gaps {gaps}"


def test_node_patches_stay_within_the_token_bucket(fake_kube: FakeKube, start_balancer) -> None:
    """Pacing: 40 first labels at 10 QPS with a burst of 5 take 3.5 s at least, never faster."""
    for i in range(40):
        fake_kube.put(gpu_node(f"gpu-{i:02}"))
    start_balancer(fast_settings(write_qps=10.0, write_burst=5))
    wait_for(lambda: len(patch_times(fake_kube)) == 40, timeout=15, what="40 first labels")
    times = patch_times(fake_kube)
    assert times[-1] - times[0] >= (40 - 5) / 10 - 0.2
    for i, start in enumerate(times):  # any window of w seconds holds at most burst + rate * w (+1 in flight)
        window = [t for t in times[i:] if t - start <= 1.0]
        assert len(window) <= 5 + 10 * 1.0 + 1


def test_a_429_pauses_writes_for_its_retry_after(fake_kube: FakeKube, start_balancer) -> None:
    """Pacing: the API server's Retry-After is obeyed, by every writer, not a 50 ms backoff."""
    for i in range(3):
        fake_kube.put(gpu_node(f"gpu-{i}"))
    fake_kube.fail_next("PATCH", r"^/api/v1/nodes/gpu-0$", 429, retry_after=1, reason="TooManyRequests")
    running = start_balancer(fast_settings(write_concurrency=1))
    wait_for(lambda: all(marks(fake_kube, f"gpu-{i}") == ("8", "idle") for i in range(3)), timeout=10,
             what="labels after the 429")
    patches = [r for r in node_patches(fake_kube)]
    refused = next(r for r in patches if r.status == 429)
    after = [r.at for r in patches if r.at > refused.at]
    assert after and min(after) - refused.at >= 0.95, "a write went out before Retry-After had passed"
    assert sample(running.balancer, "gpugate_balancer_label_writes_total", result="throttled") == 1


def lease_timeline(fk: FakeKube) -> list[tuple[float, str, float]]:
    """(time stored, holder, duration) of every successful write of the balancer's Lease."""
    import re
    out = []
    for r in fk.requests:
        if r.method in ("PUT", "POST") and r.status in (200, 201) and re.search(
                r"/namespaces/gpugate-system/leases(/gpugate-balancer)?$", r.path):
            spec = r.body.get("spec") or {}
            out.append((r.at, spec.get("holderIdentity") or "", float(spec.get("leaseDurationSeconds") or 0)))
    return out


def writes_without_the_lease(fk: FakeKube) -> list[str]:
    """Node patches the API server stored while their sender did not hold a valid Lease."""
    timeline = lease_timeline(fk)
    bad = []
    for r in node_patches(fk):
        if r.status != 200:
            continue
        sender = r.user_agent.split("(")[-1].rstrip(")")
        before = [entry for entry in timeline if entry[0] <= r.at]
        if not before:
            bad.append(f"{r.path} by {sender} before any lease")
            continue
        at, holder, duration = before[-1]
        if holder != sender or r.at > at + duration:
            bad.append(f"{r.path} by {sender} at +{r.at - at:.3f}s while the lease said {holder or 'nobody'}")
    return bad


@pytest.mark.slow
def test_with_a_slow_api_server_no_write_comes_from_a_replica_without_the_lease(
        fake_kube: FakeKube, start_balancer) -> None:
    """Fencing. The leader loses its lease in the middle of a long pass of slow patches; it
    must stop at its renew deadline (counted from the renewal it sent), not at the end of the pass."""
    for i in range(160):
        fake_kube.put(gpu_node(f"gpu-{i:03}"))
    first = start_balancer(fast_settings(write_qps=1000.0, write_burst=1000, write_interval=0.0))
    wait_for(lambda: first.balancer.writes(), what="replica-a leading")
    wait_for(lambda: len(patch_times(fake_kube)) == 160, timeout=20, what="first labels")
    second = start_balancer(fast_settings(lease={"identity": "replica-b"}, write_qps=1000.0, write_burst=1000,
                                          write_interval=0.0))
    wait_for(lambda: second.balancer.synced, what="standby synced")
    # From now on every node patch takes 0.1 s to reach the store, and replica-a cannot renew.
    fake_kube.delay("PATCH", r"^/api/v1/nodes/", 0.1)
    fake_kube.fail_next("PUT", LEASE_PATH, 500, count=1_000_000, user_agent="replica-a")
    fake_kube.put_many(gpu_pod(f"p-{i:03}", f"gpu-{i:03}", gpus=1) for i in range(160))
    wait_for(lambda: second.balancer.writes(), timeout=10, what="replica-b taking over")
    wait_for(lambda: all(marks(fake_kube, f"gpu-{i:03}") == ("7", "idle") for i in range(160)), timeout=30,
             what="every node labelled by one replica or the other")
    fake_kube.clear_delays()
    late = [r for r in node_patches(fake_kube) if "replica-a" in r.user_agent and r.status == 200
            and r.at > lease_timeline(fake_kube)[-1][0]]
    assert not writes_without_the_lease(fake_kube), writes_without_the_lease(fake_kube)[:5]
    assert not late or all("replica-a" not in r.user_agent for r in late)
    assert any("replica-b" in r.user_agent for r in node_patches(fake_kube)), "the test did not hand over"


@pytest.mark.parametrize(("code", "reason", "message", "causes"), [
    (410, "Expired", "too old resource version: 5 (800)", []),
    (504, "Timeout", "Too large resource version: 900, current: 850",
     [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]),
], ids=["410-gone", "504-too-large"])
def test_a_watch_refused_at_http_level_relists_instead_of_retrying_the_same_version(
        fake_kube: FakeKube, start_balancer, code, reason, message, causes) -> None:
    """Watches: a 410 or 504 "too large resource version" answered to the watch request itself."""
    fake_kube.put(gpu_node("gpu-1"))
    running = start_balancer(fast_settings(watch_timeout=1))
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("8", "idle"), what="labels")
    fake_kube.fail_next("GET", r"^/api/v1/pods$", code, count=1, query={"watch": "true", "resourceVersion": "*"},
                        reason=reason, message=message, details={"causes": causes})
    wait_for(lambda: any(r.status == code for r in fake_kube.requests), timeout=5, what="the refused watch")
    refused = next(i for i, r in enumerate(fake_kube.requests) if r.status == code)
    wait_for(lambda: [r for r in fake_kube.requests[refused + 1:] if r.path == "/api/v1/pods"], what="a retry")
    retry = next(r for r in fake_kube.requests[refused + 1:] if r.path == "/api/v1/pods")
    assert "resourceVersion" not in retry.query, f"retried the same resourceVersion: {retry.query}"
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=5))
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("3", "busy"), what="labels after the relist")
    assert sample(running.balancer, "gpugate_balancer_relists_total", resource="pods") >= 1


def test_readyz_waits_for_the_first_full_list(fake_kube: FakeKube, start_balancer) -> None:
    """Readiness: /healthz is alive at once; /readyz is 503 until both caches listed, then 200."""
    fake_kube.put(gpu_node("gpu-1"))
    fake_kube.fail_next("GET", r"^/api/v1/pods$", 500, count=1_000_000)
    running = start_balancer(serve_health=True)
    wait_for(lambda: running.balancer.health is not None, what="the health server")
    base = f"http://127.0.0.1:{running.balancer.health.port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    wait_for(lambda: running.balancer.nodes.synced.is_set(), what="nodes listed")
    assert opener.open(f"{base}/healthz", timeout=5).status == 200
    with pytest.raises(urllib.error.HTTPError) as err:
        opener.open(f"{base}/readyz", timeout=5)
    assert err.value.code == 503
    fake_kube.clear_faults()
    wait_for(lambda: running.balancer.synced, timeout=5, what="pods listed")
    assert opener.open(f"{base}/readyz", timeout=5).status == 200


def test_a_terminating_pod_holds_its_gpus_until_it_is_gone(fake_kube: FakeKube, start_balancer) -> None:
    """Graceful deletion. kube-scheduler counts a terminating pod until it is deleted; so do we."""
    fake_kube.put(gpu_node("gpu-1"))
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=6))
    start_balancer()
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("2", "busy"), what="labels")
    core = client.CoreV1Api(api_client(fake_kube.url))
    core.delete_namespaced_pod("a", "ml")  # graceful: deletionTimestamp, the pod stays
    time.sleep(0.5)
    assert marks(fake_kube, "gpu-1") == ("2", "busy")
    core.delete_namespaced_pod("a", "ml", grace_period_seconds=0)  # what the kubelet does once it stopped
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("8", "idle"), what="labels once the pod is gone")
