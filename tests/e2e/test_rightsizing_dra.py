"""Right-sizing through DRA on the real control plane.

A policy with ``rightsizing.through: dra`` turns ``gpugate.io/gpu-memory: 20Gi`` into a
ResourceClaimTemplate whose ``firstAvailable`` sub-requests are the ladder (webhook/admission/
claimladder.py). What is real here: the API server calling the gpugate webhook (pod and template),
the balancer (``gpugate balance`` as its ServiceAccount with manifests/balancer's RBAC) creating the
template the pod names in the pod's namespace, the controller manager's resourceclaim controller
making each pod's claim from it, and kube-scheduler v1.36's DynamicResources plugin allocating it
from ResourceSlices shaped as NVIDIA's DRA driver publishes them (tests/e2e/dra_slices.py).

One node, three H100s, one of each kind the driver publishes:
- ``gpu-0``: MIG-capable, published as partitionable devices (dynamic MIG: every placement of every
  profile, sharing the GPU's counters);
- ``gpu-1``: a full GPU with consumable shares (``--consumable-shares=memory``:
  ``allowMultipleAllocations`` and a ``memory`` capacity with a requestPolicy);
- ``gpu-2``: a plain full GPU.

The ladder (1g.10gb, 2g.20gb, 3g.40gb, a share of up to 80Gi, a whole GPU) for 20Gi is
``mig-3g-40gb, share, gpu``: 2g.20gb holds 20 GB, less than 20 GiB. Pods come one at a time:
two get the GPU's two 3g.40gb placements (the smallest device that holds 20 GiB), then the 3g.40gb
rung is taken and two fall to 20 GiB shares of ``gpu-1`` (the scheduler records the memory each
consumes), and a 50 GiB pod, which the 40 GiB left on ``gpu-1`` cannot hold, falls to the whole
``gpu-2``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.admission.ladders import rightsizing
from tests.e2e import dra_slices
from tests.e2e.test_balancer import balancer_rbac, replicas  # noqa: F401 - fixtures
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import (
    GpugateServer,
    Namespaces,
    create_pod,
    read_pod,
    shipped_webhook,
)
from tests.policy.kit import policy
from webhook import names
from webhook.kube import allocations, rightsizedclaims
from webhook.localcluster.cluster import Cluster, Nodes

POOL = "e2e.gpugate.io/rightsizing-dra"
POLICY = policy("e2e-rightsizing-dra", 'match: {namespaces: ["rsd-*"]}\ntolerations: auto\n'
                + rightsizing("{resource: nvidia.com/gpu.shared, memory: 80Gi, compute: 1}", through="dra"),
                priority=100)
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def server(local: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpugateServer]:
    # --resolve-claims, as shipped: the webhook admits a right-sized template the balancer creates only
    # when a pod that names it recomputes to it, which needs the pods (webhook/admission/rightsizedtemplate.py).
    with shipped_webhook(local, tmp_path_factory.mktemp("rightsizing-dra"), POLICY, name="rightsizing-dra",
                         resolve_claims=True) as running:
        yield running


@pytest.fixture(scope="module")
def node(local: Cluster) -> Iterator[str]:
    dra_slices.install_device_classes(local.api_client())
    made = Nodes(local)
    name = made.gpu("rsd-h100", gpus=3, whole_gpus=0, product=H100.replace(" ", "-"), labels={POOL: "yes"})
    found = (dra_slices.gpus(1, node=name, mig=True)
             + dra_slices.gpus(1, node=name, first=1, consumable_shares="memory")
             + dra_slices.gpus(1, node=name, first=2))
    dra_slices.publish(local.api_client(), name, found)
    try:
        yield name
    finally:
        dra_slices.unpublish(local.api_client(), name)
        made.remove_all()


@pytest.fixture
def namespace(namespaces: Namespaces) -> str:
    """A ``rsd-*`` namespace the policy matches (conftest's ``namespaces`` deletes it)."""
    return namespaces.make("rsd")


def asking(name: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {names.GPU_MEMORY_LABEL: memory}},
            "spec": {"terminationGracePeriodSeconds": 0, "nodeSelector": {POOL: "yes"},
                     "containers": [{"name": "main", "image": "model"}]}}


def allocation(local: Cluster, namespace: str, pod: str) -> allocations.Claim | None:
    """The pod's claim once allocated (the resourceclaim controller names it in the pod's status)."""
    statuses = read_pod(local.core(), namespace, pod).get("status", {}).get("resourceClaimStatuses") or []
    claim_name = next((s.get("resourceClaimName") for s in statuses if s.get("name") == names.RIGHTSIZED_CLAIM), None)
    if not claim_name:
        return None
    stored = client.ResourceV1Api(local.api_client()).read_namespaced_resource_claim(
        claim_name, namespace, _preload_content=False)
    claim = allocations.parse(json.loads(stored.data))
    return claim if claim.results else None


def test_a_20gi_claim_gets_the_smallest_fitting_device_then_falls_to_the_next_rung(
        local: Cluster, server: GpugateServer, node: str, namespace: str, replicas: Any) -> None:
    replica = replicas("rsd")
    core = local.core()
    resource = client.ResourceV1Api(local.api_client())
    placed: dict[str, allocations.Allocated] = {}
    templates: dict[str, str] = {}
    for pod, memory in (("a", "20Gi"), ("b", "20Gi"), ("c", "20Gi"), ("d", "20Gi"), ("e", "50Gi")):
        create_pod(core, namespace, asking(pod, memory))
        stored = read_pod(core, namespace, pod)
        template = rightsizedclaims.wanted(stored)
        assert template is not None, stored["metadata"]
        templates[pod] = template["metadata"]["name"]
        assert stored["spec"]["resourceClaims"] == [{"name": names.RIGHTSIZED_CLAIM,
                                                     "resourceClaimTemplateName": templates[pod]}]
        found = wait_until(lambda pod=pod: allocation(local, namespace, pod),
                           what=f"pod {pod}'s claim allocated (template made by the balancer)", timeout=60,
                           explain=local.logs_tail)
        (placed[pod],) = found.results
        wait_until(lambda pod=pod: read_pod(core, namespace, pod)["spec"].get("nodeName") == node,
                   what=f"pod {pod} bound to the node", timeout=30, explain=local.logs_tail)

    # One template per ladder and ask, made once by the balancer in the pod's namespace.
    assert templates["a"] == templates["b"] == templates["c"] == templates["d"] != templates["e"]
    made = {t.metadata.name for t in resource.list_namespaced_resource_claim_template(namespace).items
            if t.metadata is not None}
    assert made == {templates["a"], templates["e"]}
    # The smallest device that holds 20 GiB: both 3g.40gb placements of the MIG GPU.
    assert {placed["a"].request, placed["b"].request} == {"gpu/mig-3g-40gb"}
    assert sorted(placed[p].key.device for p in "ab") == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]
    # Those taken, the next rung: a 20 GiB share of the shareable GPU, memory accounted by the scheduler.
    for pod in "cd":
        assert placed[pod].request == "gpu/share" and placed[pod].key.device == "gpu-1", placed[pod]
        assert dict(placed[pod].consumed).get("memory") is not None
    assert placed["c"].share_id != placed["d"].share_id
    # 40 GiB left on gpu-1 cannot hold 50 GiB: the whole plain GPU.
    assert placed["e"].request == "gpu/gpu" and placed["e"].key.device == "gpu-2", placed["e"]
    assert replica.api_errors() == 0
