"""The shipped configuration that produces the extender arm binds with one scheduler.

``policies/extender`` (the starter policies with ``schedulerName: gpugate``, plus ``all-pods`` for
every other pod) served by the real webhook, registered as manifests/webhook renders it; the second
scheduler from ``kubectl kustomize manifests/scheduler`` (its extender pointed at a loopback port
where nothing listens: kube-scheduler ignores a failed prioritize call, as
tests/e2e/test_placement.py explains; the extender's own score is tests/e2e/test_extender.py's);
the session's default kube-scheduler running beside it, as in any cluster.

Pods of every shape the starter policies meet (training, inference, a notebook's time-sliced share,
a CPU pod in an ``ml-`` namespace, a GPU and a CPU pod in a team namespace, a CPU pod in a ``web-``
namespace), all limited to this test's nodes: every one is bound by the ``gpugate`` profile
(the Scheduled event's reportingController is the profile's schedulerName), so on these GPU nodes
no second scheduler binds. Then the hazard docs/placement.md describes, shown rather than assumed: a
pod the webhook does not shape (``gpugate.io/skip``) is bound by the default scheduler onto the same
nodes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e.placement_env import webhook
from tests.e2e.test_placement import scheduler_configuration
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import Namespaces, create_pod, read_pod
from webhook import names
from webhook.localcluster.cluster import Cluster, Nodes

ROOT = Path(__file__).resolve().parents[2]
ROUTED = ROOT / "policies" / "extender"
POOL = "e2e.gpugate.io/routing-pool"
GPUGATE = names.EXTENDER_SCHEDULER_NAME


def routed_policies(destination: Path) -> Path:
    """The files policies/extender/kustomization.yaml puts in the ConfigMap, as the Deployment mounts them."""
    destination.mkdir(parents=True)
    generator = yaml.safe_load((ROUTED / "kustomization.yaml").read_text())["configMapGenerator"][0]
    for name in generator["files"]:
        shutil.copy(ROUTED / name, destination / name)
    return destination


@pytest.fixture(scope="module")
def setup(local: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("routing")
    nodes = Nodes(local)
    made = {"gpu-a": nodes.gpu(gpus=8, labels={POOL: "yes"}), "gpu-b": nodes.gpu(gpus=8, labels={POOL: "yes"}),
            "shared": nodes.gpu(gpus=2, replicas=4, labels={POOL: "yes"}), "cpu": nodes.cpu(labels={POOL: "yes"})}
    namespaces = Namespaces(local)
    scheduler = local.start_scheduler(scheduler_configuration(workdir), name="gpugate-routing", leader_elect=False)
    try:
        with webhook(local, workdir, routed_policies(workdir / "policies")):
            yield {"nodes": made, "ns": {p: namespaces.make(p) for p in ("ml", "notebooks", "team", "web")},
                   "scheduler": scheduler}
    finally:
        scheduler.stop()
        namespaces.delete_all()
        nodes.remove_all()


def shaped_pod(name: str, *, labels: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict:
    resources = {"limits": limits, "requests": limits} if limits else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"terminationGracePeriodSeconds": 0, "nodeSelector": {POOL: "yes"},
                     "containers": [{"name": "main", "image": "app", "resources": resources}]}}


def binders(local: Cluster, namespace: str, pod: str) -> set[str]:
    events = client.EventsV1Api(local.api_client()).list_namespaced_event(namespace)
    return {e.reporting_controller for e in events.items
            if e.regarding is not None and e.regarding.name == pod and e.reason == "Scheduled"}


def bound(local: Cluster, namespace: str, pod: str, scheduler: Any) -> tuple[str, set[str]]:
    node = wait_until(lambda: read_pod(local.core(), namespace, pod)["spec"].get("nodeName"), timeout=60,
                      what=f"pod {namespace}/{pod} bound", explain=lambda: scheduler.tail())
    by = wait_until(lambda: binders(local, namespace, pod), timeout=30, what=f"the Scheduled event of {pod}")
    return str(node), by


def test_every_shaped_pod_is_bound_by_the_gpugate_scheduler_and_a_skipped_one_is_not(
        local: Cluster, setup: dict[str, Any]) -> None:
    ns = setup["ns"]
    pods = [
        (ns["ml"], shaped_pod("train", labels={names.PROFILE_LABEL: "training", names.GPUS_LABEL: "2"})),
        (ns["ml"], shaped_pod("serve", labels={names.PROFILE_LABEL: "inference"},
                              limits={names.GPU_RESOURCE: "1"})),
        (ns["notebooks"], shaped_pod("notebook", labels={names.PROFILE_LABEL: "notebook"},
                                     limits={names.SHARED_GPU_RESOURCE: "1"})),
        (ns["ml"], shaped_pod("ml-cpu")),
        (ns["team"], shaped_pod("team-gpu", limits={names.GPU_RESOURCE: "1"})),
        (ns["team"], shaped_pod("team-cpu")),
        (ns["web"], shaped_pod("web-cpu")),
    ]
    on_node: dict[str, set[str]] = {}
    for namespace, body in pods:
        name = body["metadata"]["name"]
        stored = create_pod(local.core(), namespace, body)
        assert stored["spec"]["schedulerName"] == GPUGATE, (name, stored["metadata"].get("annotations"))
        node, by = bound(local, namespace, name, setup["scheduler"])
        assert by == {GPUGATE}, (name, by)
        on_node.setdefault(node, set()).update(by)
    gpu_nodes = {setup["nodes"][k] for k in ("gpu-a", "gpu-b", "shared")}
    assert set(on_node) & gpu_nodes, on_node
    assert all(by == {GPUGATE} for by in on_node.values()), on_node  # one scheduler on every node used

    # Partial opt-in, shown: a pod the webhook does not shape goes to the default scheduler, onto the
    # same pool, which is exactly two schedulers binding onto the same GPU nodes.
    skipped = shaped_pod("skipped", labels={names.SKIP_LABEL: "true"}, limits={names.GPU_RESOURCE: "1"})
    stored = create_pod(local.core(), ns["team"], skipped)
    assert stored["spec"]["schedulerName"] == "default-scheduler"
    node, by = bound(local, ns["team"], "skipped", setup["scheduler"])
    assert by == {"default-scheduler"} and node in gpu_nodes
