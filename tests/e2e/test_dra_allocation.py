"""DRA on the real control plane: kube-scheduler allocates NVIDIA devices, the balancer counts them.

The harness publishes, for fake nodes, the ResourceSlices NVIDIA's DRA driver would publish
(tests/e2e/dra_slices.py: driver ``gpu.nvidia.com``, one pool per node, ``gpu-<minor>`` devices
with ``productName``/``architecture``/``uuid``/versions and a ``memory`` capacity, and for a
MIG-capable GPU the counter slice and partitions of dynamic MIG), and installs the chart's two
DeviceClasses. Nothing else stands in: kube-scheduler v1.36's DynamicResources plugin allocates,
the controller manager's resourceclaim controller makes claims from templates and releases them,
the API server validates every slice and claim. The balancer runs as its ServiceAccount with
exactly manifests/balancer's RBAC (so its get/list/watch on resourceslices and resourceclaims is
shown to be enough: no API error), and its ``gpugate.io/gpu-free`` label is read from the Node.

The claim template asks two ``gpu.nvidia.com`` devices and nothing else; the product selector on
it is the one the webhook writes: the template goes through the webhook's own mutation core
(``webhook.admission.dra.mutate_claim``) under a policy pinning ``products: [NVIDIA-A100-SXM4-80GB]``
(GFD's spelling), then its verdict (``validate_claim``) must allow it. The HTTP path (the API
server calling the webhook, storing the selectors) is tests/e2e/test_dra_admission.py's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.e2e import dra_slices
from tests.e2e.test_balancer import FREE, balancer_rbac, marks, replicas  # noqa: F401 - fixtures
from tests.e2e.waiting import wait_until
from tests.policy.kit import load, policy
from webhook.admission import dra
from webhook.kube import allocations
from webhook.localcluster.cluster import Cluster, Nodes
from webhook.localcluster.fakekubelet import COMPLETE_AFTER

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
"""``productName`` as NVML reports it (spaces); GFD's ``nvidia.com/gpu.product`` is it with '-'."""
PINNED = load(policy("a100-only", """
    match: {namespaces: ["e2e-*"]}
    gpu: {max: 4, products: [NVIDIA-A100-SXM4-80GB]}
"""))


def shaped(template: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The template as the webhook admits it: the policy's selectors added, and allowed."""
    mutation = dra.mutate_claim(template, namespace=namespace, policies=PINNED)
    assert mutation.policy is not None and mutation.patch, "the policy should shape the template"
    verdict = dra.validate_claim(mutation.desired, namespace=namespace, policies=PINNED)
    assert verdict.allowed, verdict
    return mutation.desired


@pytest.fixture(scope="module")
def device_classes(cluster: Cluster) -> None:
    dra_slices.install_device_classes(cluster.api_client())


@pytest.fixture
def dra_nodes(cluster: Cluster, nodes: Nodes, device_classes: None) -> Iterator[Any]:
    """Make a node the device plugin does not serve (GFD labels, no ``nvidia.com/gpu``) and publish its
    GPUs in ResourceSlices; slices are removed with the test's nodes."""
    made: list[str] = []
    api = cluster.api_client()

    def make(name: str, found: list[dra_slices.Gpu], *, product: str) -> str:
        node = nodes.gpu(name, gpus=len(found), whole_gpus=0, product=product.replace(" ", "-"))
        made.append(node)
        dra_slices.publish(api, node, found)
        return node

    yield make
    for node in made:
        dra_slices.unpublish(api, node)


def raw(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return dict(json.loads(call(*args, _preload_content=False, **kwargs).data))


def claim_pod(name: str, template: str, *, complete_after: int | None = None) -> dict[str, Any]:
    labels = {COMPLETE_AFTER: str(complete_after)} if complete_after is not None else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "main", "image": "trainer",
                                     "resources": {"claims": [{"name": "gpus"}]}}]}}


def claims_of(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return list(raw(client.ResourceV1Api(cluster.api_client()).list_namespaced_resource_claim, namespace)["items"])


def test_a_claim_with_a_product_selector_is_allocated_on_that_product_and_gpu_free_follows(
        cluster: Cluster, dra_nodes: Any, namespace: str, replicas: Any) -> None:
    h100 = dra_nodes("dra-h100", dra_slices.gpus(8, node="dra-h100"), product=H100)
    a100 = dra_nodes("dra-a100", dra_slices.gpus(4, node="dra-a100", product=A100, architecture="Ampere",
                                                 cuda_compute_capability="8.0.0", memory_mib=81920), product=A100)
    replica = replicas("dra-a")
    wait_until(lambda: marks(cluster, a100)[0] == "4" and marks(cluster, h100)[0] == "8",
               what="the balancer labelling DRA-only nodes with their GPUs", timeout=60, explain=cluster.logs_tail)

    resource = client.ResourceV1Api(cluster.api_client())
    template = shaped(dra_slices.claim_template("two-a100", count=2), namespace)
    selectors = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert any("productName" in s["cel"]["expression"] for s in selectors)
    resource.create_namespaced_resource_claim_template(namespace, template)
    core = cluster.core()
    core.create_namespaced_pod(namespace, claim_pod("trainer", "two-a100", complete_after=6))
    wait_until(lambda: (core.read_namespaced_pod("trainer", namespace).spec.node_name or "") != "",
               what="the scheduler binding the pod", timeout=60, explain=cluster.logs_tail)
    assert core.read_namespaced_pod("trainer", namespace).spec.node_name == a100

    (stored,) = claims_of(cluster, namespace)
    claim = allocations.parse(stored)
    # The allocation names the driver, the node's pool and two of its devices; reserved for our pod.
    assert {(r.key.driver, r.key.pool) for r in claim.results} == {("gpu.nvidia.com", a100)}
    assert sorted(r.key.device for r in claim.results) == ["gpu-0", "gpu-1"]
    assert [c.name for c in claim.reserved_for] == ["trainer"]
    assert stored["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [a100]
    wait_until(lambda: marks(cluster, a100)[0] == "2", what="gpu-free 4 -> 2 as the claim holds 2 GPUs",
               timeout=30, explain=cluster.logs_tail)
    assert marks(cluster, h100)[0] == "8"

    # The pod ends: the resourceclaim controller releases the claim (and deletes the one it made).
    wait_until(lambda: core.read_namespaced_pod("trainer", namespace).status.phase == "Succeeded",
               what="the pod to finish", timeout=60)
    wait_until(lambda: marks(cluster, a100)[0] == "4", what="gpu-free back to 4 once the pod ended",
               timeout=60, explain=cluster.logs_tail)
    wait_until(lambda: not claims_of(cluster, namespace), what="the generated claim to be deleted", timeout=60)

    # Extended-resource mapping: the chart's gpu.nvidia.com class names nvidia.com/gpu, so a plain
    # ``nvidia.com/gpu: 1`` pod is served on this DRA-only node by a claim kube-scheduler makes. One GPU
    # held, counted once (the claim), not twice (the claim and the pod's request).
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mapped"},
        "spec": {"terminationGracePeriodSeconds": 0, "nodeSelector": {"kubernetes.io/hostname": a100},
                 "containers": [{"name": "main", "image": "trainer",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    wait_until(lambda: marks(cluster, a100)[0] == "3", what="gpu-free 4 -> 3 for a mapped nvidia.com/gpu: 1",
               timeout=60, explain=cluster.logs_tail)
    pod = raw(core.read_namespaced_pod, "mapped", namespace)
    mapping = pod["status"]["extendedResourceClaimStatus"]
    assert [m["resourceName"] for m in mapping["requestMappings"]] == ["nvidia.com/gpu"]
    (generated,) = claims_of(cluster, namespace)
    assert generated["metadata"]["name"] == mapping["resourceClaimName"]
    assert generated["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
    stays = [marks(cluster, a100)[0] for _ in range(10) if not time.sleep(0.3)]
    assert set(stays) == {"3"}, stays
    core.delete_namespaced_pod("mapped", namespace, grace_period_seconds=0)
    wait_until(lambda: marks(cluster, a100)[0] == "4", what="gpu-free back to 4 once the mapped pod is gone",
               timeout=60, explain=cluster.logs_tail)
    assert replica.api_errors() == 0


def test_a_mig_partition_is_allocated_from_shared_counters_and_takes_its_gpu_out_of_gpu_free(
        cluster: Cluster, dra_nodes: Any, namespace: str, replicas: Any) -> None:
    node = dra_nodes("dra-mig", dra_slices.gpus(2, node="dra-mig", mig=True), product=H100)
    resource = client.ResourceV1Api(cluster.api_client())
    # The API server keeps the partitionable-device fields (a disabled feature would drop them on create).
    stored = raw(resource.list_resource_slice, field_selector=f"spec.nodeName={node}")["items"]
    assert [c["name"] for s in stored for c in s["spec"].get("sharedCounters", ())] == \
        ["gpu-0-counter-set", "gpu-1-counter-set"]
    assert all(d.get("consumesCounters") for s in stored for d in s["spec"].get("devices", ()))
    replica = replicas("dra-mig")
    wait_until(lambda: marks(cluster, node)[0] == "2", what="2 whole GPUs free", timeout=60,
               explain=cluster.logs_tail)
    resource.create_namespaced_resource_claim_template(namespace, dra_slices.claim_template(
        "one-1g", device_class="mig.nvidia.com",
        selector="device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"))
    cluster.core().create_namespaced_pod(namespace, claim_pod("notebook", "one-1g"))
    wait_until(lambda: any((c.get("status") or {}).get("allocation") for c in claims_of(cluster, namespace)),
               what="the MIG claim allocated", timeout=60, explain=cluster.logs_tail)
    (stored,) = claims_of(cluster, namespace)
    (result,) = allocations.parse(stored).results
    assert result.key.pool == node and "-mig-1g10gb-19-" in result.key.device
    wait_until(lambda: marks(cluster, node)[0] == "1", what="one GPU partly taken: gpu-free 2 -> 1",
               timeout=30, explain=cluster.logs_tail)
    assert replica.api_errors() == 0


def test_shared_counters_hold_a_third_3g_partition_back_until_one_is_released(
        cluster: Cluster, dra_nodes: Any, namespace: str, replicas: Any) -> None:
    """Two ``3g.40gb`` partitions use the GPU's eight memory slices: a third waits, Unschedulable, and
    gets a placement once a pod ends; ``gpu-free`` stays 0 (the GPU is partly taken) all along."""
    node = dra_nodes("dra-3g", dra_slices.gpus(1, node="dra-3g", mig=True), product=H100)
    replicas("dra-3g")
    wait_until(lambda: marks(cluster, node)[0] == "1", what="1 whole GPU free", timeout=60,
               explain=cluster.logs_tail)
    core = cluster.core()
    client.ResourceV1Api(cluster.api_client()).create_namespaced_resource_claim_template(
        namespace, dra_slices.claim_template("three-g", device_class="mig.nvidia.com",
                                             selector="device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"))
    core.create_namespaced_pod(namespace, claim_pod("first", "three-g", complete_after=8))
    core.create_namespaced_pod(namespace, claim_pod("second", "three-g"))

    def placements() -> dict[str, str]:
        out = {}
        for stored in claims_of(cluster, namespace):
            owner = stored["metadata"]["ownerReferences"][0]["name"]
            for result in allocations.parse(stored).results:
                out[owner] = result.key.device
        return out

    wait_until(lambda: len(placements()) == 2, what="two 3g.40gb claims allocated", timeout=60,
               explain=cluster.logs_tail)
    first = placements()
    assert sorted(first.values()) == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]
    core.create_namespaced_pod(namespace, claim_pod("third", "three-g"))

    def unschedulable() -> bool:
        conditions = raw(core.read_namespaced_pod, "third", namespace)["status"].get("conditions") or []
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)

    wait_until(unschedulable, what="the third 3g.40gb pod Unschedulable", timeout=30, explain=cluster.logs_tail)
    wait_until(lambda: marks(cluster, node)[0] == "0", what="gpu-free 0 with two partitions held", timeout=30)
    wait_until(lambda: "third" in placements(), what="the third pod's claim allocated once the first ended",
               timeout=60, explain=cluster.logs_tail)
    assert placements()["third"] == first["first"]
    assert raw(core.read_namespaced_pod, "first", namespace)["status"]["phase"] == "Succeeded"
    assert marks(cluster, node)[0] == "0"
