"""Right-sizing on the real control plane: a memory ask becomes a MIG slice the real
kube-scheduler can place, on nodes that advertise MIG resources the way the device plugin does.

Nodes (fake kubelet, GPU Feature Discovery labels):
- ``mixed``: an H100 node under the mixed MIG strategy: ``nvidia.com/mig-1g.10gb``, ``mig-2g.20gb``
  and ``mig-3g.40gb`` extended resources, no whole ``nvidia.com/gpu``;
- ``single``: an H100 node under the single strategy: every GPU cut into 3g.40gb slices, advertised as
  ``nvidia.com/gpu`` with ``nvidia.com/gpu.memory`` of one slice;
- ``whole``: an H100 node without MIG.
The inventory file is the balancer's GPUInventory as the webhook reads it (written here, so the test
judges the webhook and the scheduler; the balancer's own publishing is tested with the balancer).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from tests.admission.ladders import rightsizing
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import (
    GpugateServer,
    Namespaces,
    Obj,
    api_message,
    create_pod,
    pod_manifest,
    read_pod,
    shipped_webhook,
)
from tests.policy.kit import policy
from webhook.localcluster.cluster import Cluster, Nodes

POLICY = policy("e2e-rightsizing", 'match: {namespaces: ["rs-*"]}\ntolerations: auto\n'
                + rightsizing(mig_strategy="mixed"), priority=100)
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def inventory_file(workdir: Path) -> Path:
    path = workdir / "inventory" / "inventory.json"
    path.parent.mkdir()
    return path


@pytest.fixture(scope="module")
def server(local: Cluster, workdir: Path, inventory_file: Path) -> Iterator[GpugateServer]:
    with shipped_webhook(local, workdir, POLICY, name="rightsizing", inventory=inventory_file) as running:
        yield running


@pytest.fixture(scope="module")
def mig_nodes(local: Cluster) -> Iterator[dict[str, str]]:
    made = Nodes(local)
    names = {
        "mixed": made.gpu(gpus=2, mig={"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2},
                          labels={"nvidia.com/mig.strategy": "mixed"}),
        "single": made.gpu(gpus=2, product=f"{H100}-MIG-3g.40gb", gpu_memory_mib=40448, whole_gpus=4,
                           labels={"nvidia.com/mig.strategy": "single"}),
        "whole": made.gpu(gpus=4, labels={"nvidia.com/mig.strategy": "none"}),
    }
    try:
        yield {kind: node if isinstance(node, str) else node.name for kind, node in names.items()}
    finally:
        made.remove_all()


@pytest.fixture
def namespace(namespaces: Namespaces) -> str:
    """A ``rs-*`` namespace the policy matches (conftest's ``namespaces`` deletes it)."""
    return namespaces.make("rs")


def inventory(path: Path, *offers: tuple[str, str, int]) -> None:
    path.write_text(json.dumps({
        "apiVersion": "gpugate.io/v1alpha1", "kind": "GPUInventory", "generatedAt": datetime.now(UTC).isoformat(),
        "offers": [{"resource": r, "product": p, "free": f, "allocatable": f, "nodes": 1} for r, p, f in offers]}))


def asking(name: str, memory: str) -> Obj:
    return pod_manifest(name, labels={"gpugate.io/gpu-memory": memory})


def bound_node(local: Cluster, namespace: str, name: str) -> str:
    return wait_until(lambda: read_pod(local.core(), namespace, name)["spec"].get("nodeName"),
                      what=f"pod {name} to be scheduled", explain=local.logs_tail)


def limits(pod: Obj) -> Obj:
    return (pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}


def test_without_an_inventory_a_whole_gpu_the_scheduler_places_on_a_whole_gpu_node(
        local: Cluster, server: GpugateServer, mig_nodes: dict[str, str], inventory_file: Path, namespace: str) -> None:
    """Without an inventory nothing says the cluster has MIG slices, and a slice it lacks
    leaves the pod Pending; a whole GPU is what every GPU node offers."""
    inventory_file.unlink(missing_ok=True)
    create_pod(local.core(), namespace, asking("small", "15G"))
    stored = read_pod(local.core(), namespace, "small")
    assert limits(stored) == {"nvidia.com/gpu": "1"}
    assert bound_node(local, namespace, "small") == mig_nodes["whole"], "not on a single-strategy slice"


def test_with_the_inventory_a_free_mixed_slice_is_used_and_the_scheduler_places_it(
        local: Cluster, server: GpugateServer, mig_nodes: dict[str, str], inventory_file: Path, namespace: str) -> None:
    inventory(inventory_file, ("nvidia.com/mig-2g.20gb", H100, 3))
    wait_until(lambda: limits(create_pod(local.core(), namespace, asking("probe", "15G"), dry_run=True))
               == {"nvidia.com/mig-2g.20gb": "1"}, what="the webhook to read the inventory")
    create_pod(local.core(), namespace, asking("slice", "15G"))
    stored = read_pod(local.core(), namespace, "slice")
    assert stored["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/mig-2g.20gb": "1"}
    assert bound_node(local, namespace, "slice") == mig_nodes["mixed"], "only the mixed node has 2g.20gb slices"


def test_with_the_inventory_a_free_single_strategy_slice_is_used_and_lands_on_a_slice(
        local: Cluster, server: GpugateServer, mig_nodes: dict[str, str], inventory_file: Path, namespace: str) -> None:
    inventory(inventory_file, ("nvidia.com/mig-2g.20gb", H100, 0), ("nvidia.com/gpu", f"{H100}-MIG-3g.40gb", 4),
              ("nvidia.com/gpu", H100, 4))
    # the inventory file is re-read at most once a second
    wait_until(lambda: limits(create_pod(local.core(), namespace, asking("probe", "15G"), dry_run=True))
               == {"nvidia.com/gpu": "1"}, what="the webhook to read the inventory")
    create_pod(local.core(), namespace, asking("sliced", "15G"))
    stored = read_pod(local.core(), namespace, "sliced")
    assert limits(stored) == {"nvidia.com/gpu": "1"}
    assert bound_node(local, namespace, "sliced") == mig_nodes["single"], \
        "nvidia.com/gpu alone would also fit the whole-GPU node; the affinity keeps it on a slice"


def test_a_large_ask_gets_a_whole_gpu_never_a_slice(
        local: Cluster, server: GpugateServer, mig_nodes: dict[str, str], inventory_file: Path, namespace: str) -> None:
    inventory_file.unlink(missing_ok=True)
    create_pod(local.core(), namespace, asking("big", "60Gi"))
    assert limits(read_pod(local.core(), namespace, "big")) == {"nvidia.com/gpu": "1"}
    assert bound_node(local, namespace, "big") == mig_nodes["whole"]


def test_an_ask_above_the_largest_rung_is_refused_naming_it(
        local: Cluster, server: GpugateServer, namespace: str) -> None:
    with pytest.raises(ApiException) as refused:
        create_pod(local.core(), namespace, asking("huge", "100Gi"))
    message = api_message(refused.value)
    assert refused.value.status == 403 and "the largest the policy offers is nvidia.com/gpu (80Gi" in message


def test_a_pod_asking_a_larger_slice_than_needed_is_refused_while_a_smaller_is_free(
        local: Cluster, server: GpugateServer, mig_nodes: dict[str, str], inventory_file: Path, namespace: str) -> None:
    inventory(inventory_file, ("nvidia.com/mig-2g.20gb", H100, 3))
    pod = asking("greedy", "15G")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.40gb": "1"}}

    def refused() -> str | None:
        try:
            create_pod(local.core(), namespace, pod, dry_run=True)
        except ApiException as error:
            return api_message(error)
        return None

    message = wait_until(refused, what="the webhook to read the inventory and refuse the larger slice")
    assert "2g.20gb also fits and is free now" in message
