"""The balancer's tiers from DCGM utilization as a real Prometheus evaluates it.

``gpugate balance --prometheus`` runs against Debian's Prometheus, which scrapes two endpoints
writing what dcgm-exporter writes (``tests/dcgmexporter.py``) and the balancer's own /metrics.
Real pods are bound by the real scheduler, so allocation comes from the API server. Shown:

1. a node whose GPUs are busy but not fully allocated (2 of 8 GPUs requested) is ``congested``;
2. a node with whole GPUs and MIG instances is read per physical GPU (``busy``; averaging the
   36 series alike would say ``congested``), and a node all in MIG (``all-1g.10gb``) is read
   from its GPU instances alone (they export no DCGM_FI_DEV_GPU_UTIL);
3. a node reported by the released exporter (``Hostname``) and the upgraded one (``hostname``)
   is one node, its GPUs counted once (``busy``: the mean of both; either alone is another tier);
4. when Prometheus stops, the tiers fall back to allocation and the balancer's metrics say why:
   ``gpugate_balancer_prometheus_up`` 0, ``allocation_only`` 1, the last success older than
   ``stale_after``; the dashboard's nodes-per-tier expression, evaluated by Prometheus on the
   balancer's scraped series before that, counted each tier.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dcgmexporter import mig_gpu, respelled, whole_gpus
from tests.e2e.telemetry_env import STALE_AFTER, Telemetry, telemetry
from tests.e2e.waiting import wait_until
from tests.manifests.dashboard import dashboard_exprs
from webhook.localcluster.cluster import Cluster, Nodes


@pytest.fixture
def env(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Telemetry]:
    with telemetry(cluster, tmp_path, lease_namespace=namespace) as started:
        yield started


def gpu_pod(name: str, node: str, resource: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "main", "image": "registry.example/cuda:12",
                                     "resources": {"limits": {resource: str(count)}}}]}}


def test_tiers_follow_dcgm_utilization_through_prometheus_and_fall_back_when_it_stops(
        cluster: Cluster, nodes: Nodes, namespace: str, env: Telemetry) -> None:
    busy = nodes.gpu(gpus=8)
    mixed = nodes.gpu(gpus=8, whole_gpus=4, mig={"1g.10gb": 28})
    mig = nodes.gpu(gpus=8, mig={"1g.10gb": 56}, mig_config="all-1g.10gb")
    upgrading = nodes.gpu(gpus=8)
    idle = nodes.gpu(gpus=8)
    core = cluster.core()
    core.create_namespaced_pod(namespace, gpu_pod("train", busy, "nvidia.com/gpu", 2))
    core.create_namespaced_pod(namespace, gpu_pod("slice", mig, "nvidia.com/mig-1g.10gb", 7))
    env.released.show([
        *whole_gpus(busy, [0.95] * 8),
        *whole_gpus(mixed, [0.3] * 4), *[r for g in range(4, 8) for r in mig_gpu(mixed, g, "1g.10gb", [1.0] * 7)],
        *[r for g in range(8) for r in mig_gpu(mig, g, "1g.10gb", [0.93] * 7)],
        *whole_gpus(upgrading, [0.5] * 8),
        *whole_gpus(idle, [0.1] * 8)])
    env.upgraded.show(respelled(whole_gpus(upgrading, [0.95] * 8), "hostname"))
    want = {busy: "congested", mixed: "busy", mig: "congested", upgrading: "busy", idle: "idle"}
    why = env.log_tail
    wait_until(lambda: {n: env.tier(n) for n in want} == want, timeout=60, what="tiers from utilization",
               explain=lambda: f"{ {n: env.tier(n) for n in want} }\n{why()}")
    assert env.metric("gpugate_balancer_prometheus_up") == 1
    assert env.metric("gpugate_balancer_allocation_only") == 0

    # The dashboard's nodes-per-tier panel, evaluated on the balancer's series as Prometheus scraped them.
    [per_tier] = [e for e in dashboard_exprs() if "gpugate_balancer_nodes" in e]

    def counted() -> dict[str, float]:
        return {s["metric"]["tier"]: float(s["value"][1]) for s in env.prometheus.query(per_tier)}

    wait_until(lambda: counted() == {"idle": 1, "busy": 2, "congested": 2}, timeout=30,
               what="the dashboard's count per tier", explain=lambda: f"{counted()}\n{why()}")

    env.prometheus.stop()
    stopped = time.time()
    by_allocation = {n: "idle" for n in want}  # 2/8 GPUs, 7/56 slices: under busy_allocated everywhere
    wait_until(lambda: {n: env.tier(n) for n in want} == by_allocation, timeout=30,
               what="tiers from allocation alone once Prometheus is gone",
               explain=lambda: f"{ {n: env.tier(n) for n in want} }\n{why()}")
    assert env.metric("gpugate_balancer_prometheus_up") == 0
    assert env.metric("gpugate_balancer_allocation_only") == 1
    last = env.metric("gpugate_balancer_prometheus_last_success_timestamp_seconds")
    assert last <= stopped and time.time() - last > STALE_AFTER
    assert env.balancer.poll() is None, why()
