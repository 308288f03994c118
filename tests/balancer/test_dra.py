"""The balancer counts GPUs that DRA claims hold: the real client against tests/kubefake.py.

Slices are the ones NVIDIA's DRA driver publishes (tests/e2e/dra_slices.py); claims carry the
``status.allocation.devices.results`` and ``status.reservedFor`` kube-scheduler writes.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.balancer.conftest import fast_settings, wait_for
from tests.balancer.test_controller import gpu_node, gpu_pod, labels_of
from tests.e2e import dra_slices
from tests.kubefake import DRA_TYPES, FakeKube
from webhook.balancer.settings import BalancerSettings, InventorySettings
from webhook.kube import inventory as inventory_doc
from webhook.names import GPU_FREE_LABEL, GPU_LOAD_LABEL


def serve_dra(fk: FakeKube) -> None:
    for spec in DRA_TYPES:
        fk.register(*spec)


def dra_node(name: str, labels: dict | None = None) -> dict:
    """A node the device plugin does not serve: no nvidia.com/gpu in allocatable."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}, "capacity": {"cpu": "64", "memory": "512Gi"}}}


def publish(fk: FakeKube, node: str, count: int = 8, *, mig: bool = False) -> None:
    for body in dra_slices.node_slices(node, dra_slices.gpus(count, node=node, mig=mig)):
        fk.put(body)


def claim(name: str, node: str, *devices: str, reserved: bool = True, namespace: str = "ml") -> dict:
    status: dict = {"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": "gpu.nvidia.com", "pool": node, "device": d} for d in devices]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": f"{name}-pod", "uid": f"uid-{name}"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
            "status": status}


def quick() -> BalancerSettings:
    """Every gpu-free change written at once (the default coalesces them per node for seconds)."""
    return fast_settings(write_interval=0.0)


def free_label(fk: FakeKube, node: str) -> str | None:
    return labels_of(fk, node).get(GPU_FREE_LABEL)


def test_gpu_free_drops_as_claims_hold_gpus_and_comes_back_when_released(fake_kube: FakeKube, start_balancer) -> None:
    serve_dra(fake_kube)
    fake_kube.put(dra_node("dra-1"))
    publish(fake_kube, "dra-1", 8)
    running = start_balancer(quick())
    wait_for(lambda: free_label(fake_kube, "dra-1") == "8", what="a DRA-only node labelled with its 8 GPUs")
    assert labels_of(fake_kube, "dra-1")[GPU_LOAD_LABEL] == "idle"
    fake_kube.put(claim("a", "dra-1", "gpu-0", "gpu-1", "gpu-2"))
    wait_for(lambda: free_label(fake_kube, "dra-1") == "5", what="gpu-free 5 with 3 GPUs held")
    # The resourceclaim controller clears reservedFor when the pod ends; then the claim holds nothing.
    fake_kube.put(claim("a", "dra-1", "gpu-0", "gpu-1", "gpu-2", reserved=False))
    wait_for(lambda: free_label(fake_kube, "dra-1") == "8", what="gpu-free back to 8 once unreserved")
    fake_kube.put(claim("b", "dra-1", *(f"gpu-{i}" for i in range(8))))
    wait_for(lambda: labels_of(fake_kube, "dra-1").get(GPU_LOAD_LABEL) == "congested", what="all 8 held: congested")
    fake_kube.delete("resource.k8s.io/v1", "ResourceClaim", "b", "ml")
    wait_for(lambda: free_label(fake_kube, "dra-1") == "8", what="gpu-free back to 8 once the claim is deleted")
    assert running.balancer.ready()


def test_a_mig_partition_takes_its_gpu_out_of_gpu_free(fake_kube: FakeKube, start_balancer) -> None:
    serve_dra(fake_kube)
    fake_kube.put(dra_node("mig-1"))
    publish(fake_kube, "mig-1", 2, mig=True)
    start_balancer(quick())
    wait_for(lambda: free_label(fake_kube, "mig-1") == "2", what="2 whole GPUs free")
    fake_kube.put(claim("m", "mig-1", "gpu-1-mig-1g10gb-19-3"))
    wait_for(lambda: free_label(fake_kube, "mig-1") == "1", what="a 1g.10gb partition leaves 1 whole GPU")


def test_a_node_served_by_both_stacks_is_counted_once(fake_kube: FakeKube, start_balancer) -> None:
    """8 GPUs advertised by the device plugin and published by the DRA driver are 8 GPUs, not 16: a pod
    taking 2 through the plugin and a claim holding 3 through DRA leave 3."""
    serve_dra(fake_kube)
    fake_kube.put(gpu_node("both-1", gpus=8))
    publish(fake_kube, "both-1", 8)
    start_balancer(quick())
    wait_for(lambda: free_label(fake_kube, "both-1") == "8", what="8 GPUs, counted once")
    fake_kube.put(gpu_pod("plugin-pod", "both-1", gpus=2))
    fake_kube.put(claim("c", "both-1", "gpu-5", "gpu-6", "gpu-7"))
    wait_for(lambda: free_label(fake_kube, "both-1") == "3", what="8 - 2 (plugin) - 3 (claim)")


def test_a_gpu_request_a_claim_serves_is_not_counted_twice(fake_kube: FakeKube, start_balancer) -> None:
    """Extended-resource mapping: kube-scheduler serves ``nvidia.com/gpu: 2`` on a DRA-only node with a claim
    it makes, and says so in the pod's status; the claim counts, the pod's request does not."""
    serve_dra(fake_kube)
    fake_kube.put(dra_node("dra-1"))
    publish(fake_kube, "dra-1", 8)
    pod = gpu_pod("mapped", "dra-1", gpus=2)
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "mapped-extended-resources-x1",
        "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu",
                             "requestName": "container-0-request-0"}]}
    fake_kube.put(pod)
    fake_kube.put(claim("mapped-extended-resources-x1", "dra-1", "gpu-0", "gpu-1"))
    start_balancer(quick())
    wait_for(lambda: free_label(fake_kube, "dra-1") == "6", what="2 GPUs held once")


def test_without_the_resource_api_the_balancer_is_ready_and_counts_the_device_plugin(
        fake_kube: FakeKube, start_balancer) -> None:
    """An older cluster: /apis/resource.k8s.io/v1 answers 404, the DRA caches are empty and synced."""
    fake_kube.put(gpu_node("gpu-1", gpus=8))
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=2))
    running = start_balancer(quick())
    wait_for(lambda: free_label(fake_kube, "gpu-1") == "6", what="device-plugin counting as before")
    assert running.balancer.ready() and running.balancer.dra.available is False
    assert not [r for r in fake_kube.requests if "/resourceslices" in r.path or "/resourceclaims" in r.path]


def test_slices_are_watched_for_nvidia_s_driver_only(fake_kube: FakeKube, start_balancer) -> None:
    serve_dra(fake_kube)
    fake_kube.put(dra_node("dra-1"))
    publish(fake_kube, "dra-1", 2)
    other = dra_slices.node_slices("dra-1", dra_slices.gpus(4, node="dra-1"))[0]
    other["metadata"]["name"] = "dra-1-other"
    other["spec"]["driver"] = other["spec"]["pool"]["name"] = "gpu.example.com"
    fake_kube.put(other)
    start_balancer(quick())
    wait_for(lambda: free_label(fake_kube, "dra-1") == "2", what="only gpu.nvidia.com devices")
    slice_lists = [r for r in fake_kube.requests if r.path == "/apis/resource.k8s.io/v1/resourceslices"]
    assert slice_lists and all(r.query.get("fieldSelector") == "spec.driver=gpu.nvidia.com" for r in slice_lists)


def test_the_inventory_lists_dra_offers_per_class_and_product(fake_kube: FakeKube, start_balancer) -> None:
    serve_dra(fake_kube)
    fake_kube.register("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False)
    fake_kube.put(dra_node("dra-1"))
    fake_kube.put(dra_node("mig-1"))
    publish(fake_kube, "dra-1", 4)
    publish(fake_kube, "mig-1", 1, mig=True)
    fake_kube.put(claim("a", "dra-1", "gpu-0"))
    fake_kube.put(claim("m", "mig-1", "gpu-0-mig-3g40gb-9-0"))
    settings = fast_settings(write_interval=0.0, inventory=InventorySettings(
        enabled=True, namespace="gpugate-system", min_interval=0.1))
    start_balancer(settings)

    def document() -> inventory_doc.Inventory | None:
        found = fake_kube.get("v1", "ConfigMap", "gpugate-inventory", "gpugate-system")
        if not found:
            return None
        parsed = inventory_doc.parse(next(iter(found["data"].values())))
        return parsed if parsed.dra_offers else None

    doc = wait_for(document, what="a GPUInventory with DRA offers")
    offers = {(o.device_class, o.product): o for o in doc.dra_offers}
    gpu = offers[("gpu.nvidia.com", "NVIDIA H100 80GB HBM3")]
    # 4 + 1 full GPUs; free: 3 on dra-1, none on mig-1 (its GPU is partly taken).
    assert (gpu.devices, gpu.free, gpu.nodes, gpu.memory_mib) == (5, 3, 2, 81559)
    mig = offers[("mig.nvidia.com", "NVIDIA H100 80GB HBM3")]
    # 7 + 3 + 2 + 1 placements; the 3g.40gb at slices 0-3 leaves 1g at 4, 5, 6, 2g at 4, 3g at 4.
    assert (mig.devices, mig.free, mig.nodes, mig.memory_mib) == (13, 5, 1, 9856)
    assert json.loads(next(iter(fake_kube.get("v1", "ConfigMap", "gpugate-inventory", "gpugate-system")["data"]
                                .values())))["draOffers"]


# ---- the extender's node view (pure: placementfeed.Feed) ----------------------------------------
def test_the_extender_sees_dra_held_gpus_and_counts_a_dual_node_once() -> None:
    from webhook.balancer import placementfeed
    from webhook.kube import allocations, nodedevices, slices
    from webhook.kube.gpunode import node_info
    from webhook.placement.extender import ExtenderState

    def devices(node: str, held: tuple[str, ...]) -> nodedevices.NodeDevices:
        found = [slices.parse(s) for s in dra_slices.node_slices(node, dra_slices.gpus(8, node=node))]
        keys = frozenset(allocations.DeviceKey("gpu.nvidia.com", node, d) for d in held)
        return nodedevices.by_node(found, keys)[node]

    feed = placementfeed.Feed(ExtenderState())
    feed.node("dra-1", node_info(dra_node("dra-1")))
    feed.node("both-1", node_info(gpu_node("both-1", gpus=8)))
    feed.node("plain-1", node_info(gpu_node("plain-1", gpus=8)))
    assert feed.state.view("dra-1").gpu_free == 0  # before its slices: no GPUs known
    feed.dra("dra-1", devices("dra-1", ("gpu-0", "gpu-1", "gpu-2")))
    feed.dra("both-1", devices("both-1", ("gpu-7",)))
    # gpu_free is in thousandths of a GPU (placement.devices.MILLI).
    assert (feed.state.view("dra-1").gpus, feed.state.view("dra-1").gpu_free) == (8, 5000)
    assert (feed.state.view("both-1").gpus, feed.state.view("both-1").gpu_free) == (8, 7000)
    assert feed.state.view("plain-1").gpu_free == 8000
    feed.dra("dra-1", devices("dra-1", ()))
    assert feed.state.view("dra-1").gpu_free == 8000
    feed.dra("dra-1", None)  # the slices are gone
    assert feed.state.view("dra-1").gpus == 0


# ---- every consumer agrees on what a DRA unit is (hypothesis) -----------------------------------
PLACEMENTS = [(p, start) for p in dra_slices.H100_PROFILES for start in p.starts]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.data())
def test_label_share_inventory_and_extender_agree_on_dra_held_units(gpus: int, data: st.DataObject) -> None:
    """Whatever partitions claims hold on a DRA node: the allocated share is the units table's share
    (the same as a device-plugin MIG node with the same slices requested, and the replay's thousandths),
    and the gpu-free label, the inventory's free ``gpu.nvidia.com`` devices and the extender's free GPUs
    are one number."""
    from webhook.balancer import placementfeed
    from webhook.kube import allocations, nodedevices, slices, units
    from webhook.kube.gpunode import node_info
    from webhook.placement import dracount, marks
    from webhook.placement import gpuinventory as inventory_mod
    from webhook.placement.extender import ExtenderState
    from webhook.replay import migcluster

    node = "dra-1"
    found = dra_slices.gpus(gpus, node=node, mig=True)
    published = [slices.parse(s) for s in dra_slices.node_slices(node, found)]
    # Hold non-overlapping partitions, GPU by GPU, as the scheduler could allocate them.
    held: list[str] = []
    share = 0.0
    for gpu in found:
        used: set[int] = set()
        for profile, start in data.draw(st.lists(st.sampled_from(PLACEMENTS), max_size=4, unique=True)):
            span = set(range(start, start + profile.memory_slices))
            if used & span:
                continue
            used |= span
            held.append(dra_slices.mig_name(gpu, profile, start))
            share += units.gpu_share(f"nvidia.com/mig-{profile.name}")
    keys = frozenset(allocations.DeviceKey("gpu.nvidia.com", node, d) for d in held)
    devices = nodedevices.by_node(published, keys)[node]
    info = node_info(dra_node(node))
    load = dracount.node_load(info, {}, None, devices)
    assert load.allocated == pytest.approx(min(share / gpus, 1.0))
    for unit, count in devices.held_units:  # a DRA MIG device weighs what the device plugin's slice does
        assert dracount.unit_weight(unit) == marks.gpu_weight(node_info(gpu_node("dp", gpus=0)), unit)
        assert migcluster.physical_milli(unit, count, 1) == count * round(units.MILLI * dracount.unit_weight(unit))
    whole_free = sum(1 for gpu in found if not any(h.startswith(gpu.name + "-") for h in held))
    assert load.free_gpus == devices.whole_free == whole_free
    (offer,) = [o for o in inventory_mod.dra_offers([info], {}, {node: devices}) if o.device_class == "gpu.nvidia.com"]
    assert offer.free == whole_free
    feed = placementfeed.Feed(ExtenderState())
    feed.node(node, info)
    feed.dra(node, devices)
    assert feed.state.view(node).gpu_free == whole_free * units.MILLI


# ---- the incremental cache equals a recount from scratch (hypothesis) -------------------------
EVENT_NODES = ("n-1", "n-2", "n-3")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("slices"), st.sampled_from(EVENT_NODES), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("claim"), st.sampled_from(["a", "b", "c"]), st.sampled_from(EVENT_NODES),
              st.sets(st.integers(0, 3), max_size=2), st.booleans()),
), max_size=25))
def test_the_dra_cache_after_any_events_is_the_recount_from_scratch(events: list[tuple]) -> None:
    from webhook.kube import nodedevices, slices
    from webhook.placement import dracount

    cache = dracount.DraCache()
    for event in events:
        if event[0] == "slices":
            _, node, count, mig = event
            for i in range(3):  # republish: up to 3 slices per node, the ones beyond count removed
                cache.set_slice(f"{node}-{i}", None)
            for i, body in enumerate(dra_slices.node_slices(node, dra_slices.gpus(count, node=node, mig=mig))):
                cache.set_slice(f"{node}-{i}", slices.parse({**body, "metadata": {"name": f"{node}-{i}"}}))
        else:
            _, name, node, gpus, reserved = event
            cache.set_claim(f"ml/{name}", dracount.reduce_claim(claim(name, node, *(f"gpu-{g}" for g in sorted(gpus)),
                                                                      reserved=reserved))[1])
    expected = nodedevices.by_node(cache.resource_slices.values(),
                                   nodedevices.held_keys(cache.resource_claims.values()))
    assert cache.nodes == expected


def test_the_extender_counts_a_mapped_gpu_request_once() -> None:
    """A pod whose ``nvidia.com/gpu: 1`` a claim serves (what the real scheduler did in
    tests/e2e/test_dra_allocation.py) takes one GPU in the extender's view: the claim's, not also its own."""
    from webhook.balancer import placementfeed
    from webhook.kube import allocations, nodedevices, slices
    from webhook.kube.gpunode import node_info
    from webhook.placement.extender import ExtenderState

    node = "dra-1"
    found = [slices.parse(s) for s in dra_slices.node_slices(node, dra_slices.gpus(8, node=node))]
    devices = nodedevices.by_node(found, frozenset({allocations.DeviceKey("gpu.nvidia.com", node, "gpu-0")}))[node]
    pod = gpu_pod("mapped", node, gpus=1)
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "mapped-extended-resources-x1",
        "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu",
                             "requestName": "container-0-request-0"}]}
    feed = placementfeed.Feed(ExtenderState())
    feed.node(node, node_info(dra_node(node)))
    feed.dra(node, devices)
    feed.pod("ml/mapped", placementfeed.feed_pod(pod))
    assert feed.state.view(node).gpu_free == 7000


def test_the_dra_counting_benchmark_runs_in_its_quick_mode() -> None:
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "benchmarks/dra_counting.py", "--quick"], cwd=repo, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "per pool (DraCache)" in done.stdout and "recount from scratch" in done.stdout and "ratio:" in done.stdout
