"""What tests/e2e/test_rebalance.py builds: the balancer with the rebalancer as its ServiceAccount, a
pool of fake GPU nodes of its own, movable Deployments and a pod that waits for GPUs.

Each test's nodes carry a label and a NoSchedule taint naming its namespace (its pool): only the
test's pods select and tolerate them, so no pod of another test can take their GPUs, and the
rebalancer, which watches the whole cluster, finds nothing to do for any other test's pods.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.e2e.balancer_access import LEASE, NAMESPACE, QUICK_CONFIG, BalancerProcess, as_account
from tests.e2e.waiting import wait_until
from webhook.localcluster.cluster import Cluster, Nodes
from webhook.localcluster.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
POOL = "e2e.gpugate.io/rebalance-pool"
MARK = "gpugate.io/rebalance"
ROUND = 1.0
"""Seconds between the rebalancer's rounds here (30 by default)."""
CONFIG = QUICK_CONFIG + f"""inventory: {{enabled: false}}
rebalance: {{enabled: true, policies: POLICIES, interval: {ROUND}, threshold: 2, budget_percent: 100, hold: 2,
            mark_ttl: 60, refusal_backoff: 120}}
"""
"""A round a second, a pod waits two seconds, the budget is every running pod an hour (2% of a handful
is none), marks come off two seconds after their pod binds."""
POLICY = """apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {{name: movable-{namespace}}}
spec:
  priority: 10
  match:
    namespaces: [{namespace}]
    podSelector: {{matchLabels: {{movable: "yes"}}}}
  disruption: {{movable: true}}
"""


class Replica(BalancerProcess):
    """``gpugate balance`` as the balancer's ServiceAccount, in its own process."""

    def evicted(self) -> float:
        return self.metric("gpugate_balancer_rebalance_evictions_total", result="evicted")

    def tail(self) -> str:
        return f"--- {self.identity} (exit {self.process.poll()}):\n" + "\n".join(self.text().splitlines()[-25:])


def start(cluster: Cluster, folder: Path, identity: str, policies: Path, *, dry_run: bool = False) -> Replica:
    config = folder / f"{identity}.yaml"
    config.write_text(CONFIG.replace("POLICIES", str(policies)))
    port, log = free_port(), folder / f"{identity}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "webhook.cli", "balance", *as_account(cluster, folder, identity),
             "--config", str(config), "--identity", identity, "--lease-name", LEASE, "--lease-namespace", NAMESPACE,
             "--health-bind", f"127.0.0.1:{port}", *(["--dry-run"] if dry_run else [])],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return Replica(identity, process, port, log)


def write_policy(folder: Path, namespace: str) -> None:
    """The policy that marks the namespace's ``movable: "yes"`` pods (the folder is re-read every round)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{namespace}.yaml").write_text(POLICY.format(namespace=namespace))


def pool(nodes: Nodes, namespace: str, count: int, gpus: int = 8) -> list[str]:
    return [nodes.gpu(gpus=gpus, labels={POOL: namespace},
                      taints=({"key": POOL, "value": namespace, "effect": "NoSchedule"},)) for _ in range(count)]


def pod_spec(namespace: str, gpus: int, *, pin: str | None = None, spread: str | None = None) -> dict[str, Any]:
    """A container asking ``gpus`` GPUs, on the test's pool (or one node of it), spread by ``spread``'s app."""
    resources = {"cpu": "1", "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.example/job:1", "resources": {"requests": resources,
                                                                                         "limits": resources}}],
        "nodeSelector": {POOL: namespace, **({"kubernetes.io/hostname": pin} if pin else {})},
        "tolerations": [{"key": POOL, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 0}
    if spread:
        spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                              "whenUnsatisfiable": "ScheduleAnyway",
                                              "labelSelector": {"matchLabels": {"app": spread}}}]
    return spec


def deployment(cluster: Cluster, namespace: str, name: str, replicas: int, gpus: int, *,
               labels: dict[str, str] | None = None, pin: str | None = None) -> None:
    """A Deployment of 1-GPU (``gpus``) pods spread over the pool; ``labels`` on its pods."""
    template_labels = {"app": name, **(labels or {})}
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": template_labels},
                                  "spec": pod_spec(namespace, gpus, pin=pin, spread=name)}}}
    client.AppsV1Api(cluster.api_client()).create_namespaced_deployment(namespace, body)


def waiting_pod(cluster: Cluster, namespace: str, name: str, gpus: int) -> None:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": pod_spec(namespace, gpus)}
    cluster.core().create_namespaced_pod(namespace, body)


def running(cluster: Cluster, namespace: str, app: str, count: int) -> dict[str, tuple[str, str]]:
    """Wait until ``count`` pods of ``app`` run (none terminating); pod uid -> (name, node)."""
    def probe() -> dict[str, tuple[str, str]] | None:
        found = cluster.core().list_namespaced_pod(namespace, label_selector=f"app={app}").items
        live = {p.metadata.uid: (p.metadata.name, p.spec.node_name) for p in found
                if p.status.phase == "Running" and not p.metadata.deletion_timestamp}
        return live if len(live) == count and len(found) == count else None
    return wait_until(probe, timeout=60, what=f"{count} running pods of {app} in {namespace}")


def unschedulable(cluster: Cluster, namespace: str, name: str) -> None:
    """Wait until kube-scheduler says the pod does not fit for lack of GPUs."""
    def probe() -> bool:
        pod = cluster.core().read_namespaced_pod(name, namespace)
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" and "nvidia.com/gpu" in (c.message or "")
                   for c in pod.status.conditions or ())
    wait_until(probe, timeout=30, what=f"{namespace}/{name} unschedulable for lack of GPUs")


def node_of(cluster: Cluster, namespace: str, name: str) -> str | None:
    return cluster.core().read_namespaced_pod(name, namespace).spec.node_name


def marked(cluster: Cluster, names: list[str]) -> list[str]:
    """The nodes among ``names`` that carry the rebalancer's mark."""
    return [n for n in names if any(t.key == MARK for t in cluster.core().read_node(n).spec.taints or ())]


def per_node(placed: dict[str, tuple[str, str]]) -> Counter[str]:
    return Counter(node for _, node in placed.values())


def events(cluster: Cluster, namespace: str) -> list[Any]:
    return [e for e in cluster.core().list_namespaced_event(namespace).items if e.reason == "Rebalanced"]
