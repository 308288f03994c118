"""What the extender reads: a Pod's demand, and a node view that binds and releases exactly."""

from __future__ import annotations

from typing import Any

from webhook.kube.demand import PodDemand
from webhook.kube.demand import of_pod as demand_from_pod
from webhook.placement.inputs import NodeView


def pod(requests: dict[str, str], spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "main", "resources": {"requests": requests, "limits": {}}}],
                     **(spec or {})}}


def test_a_pod_reads_into_millicores_bytes_gpus_and_shares() -> None:
    found = demand_from_pod(pod({"cpu": "1500m", "memory": "2Gi", "nvidia.com/gpu": "2"}))
    assert found == PodDemand(cpu=1500, memory_bytes=2 * 2**30, gpus=2, cpu_score=1500, memory_score_bytes=2 * 2**30)
    share = demand_from_pod(pod({"cpu": "1", "nvidia.com/gpu.shared": "1"}), slot_milli=250)
    assert (share.gpus, share.share_milli, share.gpu_request_milli) == (0, 250, 250)
    mig = demand_from_pod(pod({"nvidia.com/mig-1g.10gb": "2"}))
    assert mig.extended == (("nvidia.com/mig-1g.10gb", 2),) and not mig.uses_devices


def test_products_come_from_required_affinity_only_when_every_term_names_them() -> None:
    term = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]}]}
    other = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    affinity = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}}
    assert demand_from_pod(pod({"cpu": "1"}, affinity)).products == {"Tesla-T4"}
    affinity["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] = [
        term, other]
    assert demand_from_pod(pod({"cpu": "1"}, affinity)).products == frozenset()
    assert demand_from_pod(pod({"cpu": "1"}, {"nodeSelector": {"nvidia.com/gpu.product": "A"}})).products == {"A"}


def test_binding_then_releasing_a_pod_gives_the_node_back() -> None:
    empty = NodeView.empty("n", cpu=32_000, memory=64 * 2**30, product="Tesla-T4", gpus=2)
    share = PodDemand(cpu=2000, memory_bytes=2**30, share_milli=300)
    whole = PodDemand(cpu=4000, gpus=1)
    node = empty.bind("a", share).bind("b", whole).bind("c", share)
    assert node.left == (400, 0) and node.signature == (400,)
    assert (node.cpu_left, node.gpu_free) == (32_000 - 8000, 400)
    released = node.release("b")
    assert released.left == (400, 1000) and released.signature == (1000, 400)
    assert released.release("a").release("c").left == empty.left
    assert released.release("nobody") is released


def test_a_pod_the_view_cannot_place_still_counts_its_cpu() -> None:
    full = NodeView.empty("n", cpu=8000, gpus=1).bind("a", PodDemand(cpu=1000, gpus=1))
    behind = full.bind("b", PodDemand(cpu=1000, gpus=1))
    assert behind.cpu_left == 6000 and behind.left == (0,)
    assert behind.release("b") .cpu_left == 7000 and behind.release("b").left == (0,)


def test_resizing_a_node_binds_its_pods_again_in_order() -> None:
    node = NodeView.empty("n", cpu=8000, gpus=1).bind("a", PodDemand(cpu=1000, share_milli=500))
    bigger = node.resized(cpu=16_000, memory=0, product="", gpus=2, policy="packed")
    assert bigger.left == (500, 1000) and bigger.cpu_left == 15_000 and [b.key for b in bigger.pods] == ["a"]
