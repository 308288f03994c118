"""A GPU resource kind is one row of ``webhook.kube.units.KINDS``: a made-up kind registered there,
and nowhere else, is a GPU ask to admission, a load to the balancer, a count to the extender and
the published inventory, and physical GPUs to the replay.

Each check below compares the made-up kind with a resource that is no GPU (an SR-IOV function),
asked the same way: a consumer that kept its own list of GPU names would treat the two alike and
fail here. The fixture patches the one table, so the number of files a new kind touches is
``units.py`` (its row) and this kind of test.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.policy.kit import container, load, pod, policy
from webhook.admission import mutation, validation
from webhook.balancer import placementfeed, state
from webhook.kube import demand as kube_demand
from webhook.kube import units
from webhook.kube.gpunode import node_info
from webhook.placement import gpuinventory, marks
from webhook.placement.extender import ExtenderState
from webhook.replay import sizing

MADE_UP = "example.com/vgpu"
NOT_A_GPU = "example.com/nic"
NS = "ml-a"


@pytest.fixture
def made_up_kind(monkeypatch: pytest.MonkeyPatch) -> units.GpuKind:
    """One row added to the table, the only registration a new kind needs."""
    kind = units.GpuKind("made-up vGPU", MADE_UP, r"example\.com/vgpu", "whole")
    monkeypatch.setattr(units, "KINDS", (*units.KINDS, kind))
    return kind


def gpu_node(name: str, resource: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", resource: str(count)}}}


def bound_pod(resource: str, count: int, node: str = "n1") -> dict[str, Any]:
    body = pod(container("main", gpus=count, resource=resource), namespace=NS)
    body["spec"]["nodeName"] = node
    body["status"] = {"phase": "Running"}
    return body


def test_the_table_itself_knows_the_new_kind(made_up_kind: units.GpuKind) -> None:
    assert units.kind_of(MADE_UP) is made_up_kind and units.kind_of(NOT_A_GPU) is None
    assert units.is_gpu_resource(MADE_UP) and units.by_name(MADE_UP) and not units.pooled(MADE_UP)
    assert units.gpu_share(MADE_UP) == 1.0


def test_admission_counts_it_as_a_gpu_ask(made_up_kind: units.GpuKind) -> None:
    """Validation holds it to the policy's max; mutation settles a GPU-only policy on it."""
    policies = load(policy("capped", "gpu: {max: 1}"))
    asked = validation.validate(pod(container("main", gpus=2, resource=MADE_UP)), namespace=NS, policies=policies)
    assert not asked.allowed and MADE_UP in asked.message
    other = validation.validate(pod(container("main", gpus=2, resource=NOT_A_GPU)), namespace=NS, policies=policies)
    assert other.allowed
    mutated = mutation.mutate(pod(container("main", gpus=1, resource=MADE_UP)), namespace=NS, policies=policies)
    untouched = mutation.mutate(pod(container("main", gpus=1, resource=NOT_A_GPU)), namespace=NS, policies=policies)
    assert mutated.policy is not None and mutated.patch
    assert untouched.policy is None and not untouched.patch


def test_the_balancer_counts_its_load(made_up_kind: units.GpuKind) -> None:
    info = node_info(gpu_node("n1", MADE_UP, 4))
    assert info.is_gpu_node and dict(info.allocatable) == {MADE_UP: 4}
    assert not node_info(gpu_node("n2", NOT_A_GPU, 4)).is_gpu_node
    raw = json.dumps(bound_pod(MADE_UP, 2), separators=(",", ":")).encode()
    assert state.may_hold_gpus(raw)
    assert not state.may_hold_gpus(json.dumps(bound_pod(NOT_A_GPU, 2), separators=(",", ":")).encode())
    usage = state.pod_usage(bound_pod(MADE_UP, 2))
    assert usage is not None and usage.requests == ((MADE_UP, 2),)
    assert state.pod_usage(bound_pod(NOT_A_GPU, 2)) is None
    assert marks.node_load(info, dict(usage.requests), None).allocated == 0.5


def test_the_extender_places_it_by_its_count(made_up_kind: units.GpuKind) -> None:
    """A node with too few units of the kind is no fit; a node with enough is."""
    feed = placementfeed.Feed(ExtenderState())
    feed.replace_nodes({name: node_info(gpu_node(name, MADE_UP, count)) for name, count in (("big", 4), ("small", 1))})
    assert placementfeed.node_shape(node_info(gpu_node("big", MADE_UP, 4))).mig == ((MADE_UP, 4),)
    asking = pod(container("main", gpus=2, resource=MADE_UP), namespace=NS)
    scores = {p["Host"]: p["Score"] for p in feed.prioritize({"Pod": asking, "NodeNames": ["big", "small"]}, now=0.0)}
    assert scores["big"] > scores["small"] == 0


def test_the_inventory_offers_it(made_up_kind: units.GpuKind) -> None:
    nodes = [node_info(gpu_node("n1", MADE_UP, 4)), node_info(gpu_node("n2", NOT_A_GPU, 4))]
    offers = gpuinventory.offers(nodes, {"n1": {MADE_UP: 1}})
    assert [(o.resource, o.allocatable, o.free) for o in offers] == [(MADE_UP, 4, 3)]


def test_the_replay_counts_its_physical_gpus(made_up_kind: units.GpuKind) -> None:
    demand = kube_demand.of_pod(bound_pod(MADE_UP, 2))
    assert demand.extended == ((MADE_UP, 2),)
    assert sizing.taken_milli(demand, 4) == 2 * units.MILLI
    assert sizing.taken_milli(kube_demand.of_pod(bound_pod(NOT_A_GPU, 2)), 4) == 0
