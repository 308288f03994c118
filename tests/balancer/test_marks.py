"""Per-node accounting and the one patch per node: never touch what the balancer does not own."""

from __future__ import annotations

import pytest

from webhook.balancer.state import NodeLedger, pod_key, pod_usage
from webhook.kube.gpunode import node_info
from webhook.names import CONGESTED_TAINT_KEY, GPU_FREE_LABEL, GPU_LOAD_LABEL
from webhook.placement import marks
from webhook.placement.tiers import TierThresholds

T = TierThresholds()


def node(name="gpu-1", alloc=None, labels=None, taints=None, rv="5"):
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": labels or {}},
            "spec": {"taints": taints} if taints is not None else {},
            "status": {"allocatable": {"cpu": "32", **(alloc if alloc is not None else {"nvidia.com/gpu": "8"})}}}


def pod(node_name="gpu-1", gpus="2", phase="Running", init=None, resource="nvidia.com/gpu", use_requests=False):
    res = {"requests" if use_requests else "limits": {resource: gpus, "cpu": "1"}}
    return {"metadata": {"name": "p", "namespace": "ml"},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": res}],
                     "initContainers": init or []},
            "status": {"phase": phase}}


@pytest.mark.parametrize(("text", "count"), [("8", 8), (8, 8), ("1k", 1000), ("2Ki", 2048)])
def test_quantities_read_as_whole_counts(text, count) -> None:
    assert pod_usage(pod(gpus=text)).requests == (("nvidia.com/gpu", count),)


@pytest.mark.parametrize("text", ["x", "-1", "1500m", "9" * 80])
def test_a_quantity_the_api_server_would_refuse_counts_as_nothing(text) -> None:
    """The quantity rule is webhook.kube.quantity's: no second, laxer parser turns "1500m" into 1."""
    assert pod_usage(pod(gpus=text)) is None


def test_pod_usage_counts_bound_running_pods_only() -> None:
    assert pod_usage(pod()).requests == (("nvidia.com/gpu", 2),)
    assert pod_usage(pod(use_requests=True)).requests == (("nvidia.com/gpu", 2),)
    assert pod_usage(pod(node_name="")) is None
    assert pod_usage(pod(phase="Succeeded")) is None
    assert pod_usage(pod(phase="Failed")) is None
    assert pod_usage(pod(gpus="0")) is None
    assert pod_usage(pod(phase="Pending")).node == "gpu-1"  # bound but not started: holds the devices
    assert pod_key(pod()) == "ml/p"


def test_init_containers_take_the_max_and_sidecars_add() -> None:
    big_init = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]
    assert pod_usage(pod(gpus="2", init=big_init)).requests == (("nvidia.com/gpu", 4),)
    sidecar = [{"name": "s", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    assert pod_usage(pod(gpus="2", init=sidecar)).requests == (("nvidia.com/gpu", 3),)


def test_node_info_keeps_only_nvidia_resources_and_owned_labels() -> None:
    info = node_info(node(labels={"team": "a", GPU_FREE_LABEL: "3", "kubernetes.io/hostname": "h1"}))
    assert info.allocatable == (("nvidia.com/gpu", 8),)
    assert info.owned_labels == ((GPU_FREE_LABEL, "3"),)
    assert info.hostnames == ("gpu-1", "h1")
    assert not node_info(node(alloc={})).is_gpu_node


def test_state_sums_requests_per_node_and_marks_dirty() -> None:
    state = NodeLedger()
    state.replace_nodes({"gpu-1": node_info(node())})
    state.take_dirty()
    state.set_pod("ml/a", pod_usage(pod(gpus="2")))
    state.set_pod("ml/b", pod_usage(pod(gpus="3")))
    assert state.requested == {"gpu-1": {"nvidia.com/gpu": 5}}
    assert state.take_dirty() == ["gpu-1"]
    state.set_pod("ml/a", pod_usage(pod(gpus="2", phase="Succeeded")))
    state.set_pod("ml/b", None)
    assert state.requested == {} and state.pods == {}
    assert state.take_dirty() == ["gpu-1"]
    state.set_pod("ml/c", None)  # a pod that never held anything changes nothing
    assert state.take_dirty() == []


SRIOV = "nvidia.com/cx7_sriov_rdma"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.mark.parametrize(("alloc", "labels", "requested", "free", "allocated"), [
    # whole GPUs: allocatable minus requested
    ({"nvidia.com/gpu": "8"}, H100, {"nvidia.com/gpu": 6}, 2, 0.75),
    # time-slicing, 4 replicas, not renamed: the plugin spreads shares, one per GPU first, so 5
    # shares leave no whole GPU of 4 (free slots // replicas said 11 // 4 = 2)
    ({"nvidia.com/gpu": "16"}, {"nvidia.com/gpu.replicas": "4"}, {"nvidia.com/gpu": 5}, 0, 5 / 16),
    ({"nvidia.com/gpu": "32"}, {"nvidia.com/gpu.replicas": "4"}, {"nvidia.com/gpu": 3}, 5, 3 / 32),
    # renamed shares (nvidia.com/gpu.shared): a pod asking nvidia.com/gpu cannot get them
    ({"nvidia.com/gpu.shared": "32"}, {"nvidia.com/gpu.replicas": "4"}, {}, 0, 0.0),
    # single MIG strategy: nvidia.com/gpu counts slices, which are not GPUs
    ({"nvidia.com/gpu": "56"}, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
                                "nvidia.com/mig.strategy": "single"}, {"nvidia.com/gpu": 14}, 0, 0.25),
    # mixed MIG: 4 whole GPUs taken next to 4 GPUs cut into 28 idle 1g slices is half the node
    ({"nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "28"}, {"nvidia.com/gpu.replicas": "0"},
     {"nvidia.com/gpu": 4}, 0, 0.5),
    ({"nvidia.com/gpu": "4", "nvidia.com/mig-3g.40gb": "8"}, {}, {"nvidia.com/mig-3g.40gb": 4}, 4, 12 / 52),
    # SR-IOV virtual functions are not GPUs
    ({"nvidia.com/gpu": "8", SRIOV: "16"}, H100, {"nvidia.com/gpu": 8, SRIOV: 1}, 0, 1.0),
], ids=["whole", "sliced-spread", "sliced-room", "renamed-shared", "mig-single", "mig-mixed-gpus",
        "mig-mixed-slices", "sriov-vfs"])
def test_gpu_free_counts_whole_gpus_a_gpu_pod_could_get_and_allocation_weighs_gpus(
        alloc, labels, requested, free, allocated) -> None:
    load = marks.node_load(node_info(node(alloc=alloc, labels=labels)), requested, None)
    assert load.free_gpus == free
    assert load.allocated == pytest.approx(allocated)


def test_a_gpu_node_without_room_is_congested_whatever_its_nics_offer() -> None:
    """8 GPUs taken, 16 SR-IOV VFs idle: congested, not idle (they used to count as 24 "GPUs")."""
    info = node_info(node(alloc={"nvidia.com/gpu": "8", SRIOV: "16"}))
    assert info.allocatable == (("nvidia.com/gpu", 8),)
    want = marks.desired(info, marks.node_load(info, {"nvidia.com/gpu": 8}, None), thresholds=T,
                         taint_congested=False)
    assert (want.free, want.load) == ("0", "congested")
    nic_only = node_info(node(alloc={SRIOV: "16", "nvidia.com/bf3_sf": "4"}))
    assert not nic_only.is_gpu_node
    assert marks.node_patch(nic_only, marks.desired(nic_only, None, thresholds=T, taint_congested=True)) is None


def test_an_empty_gpu_node_has_nothing_free() -> None:
    empty = node_info(node(alloc={"nvidia.com/gpu": "0"}))
    assert marks.node_load(empty, {}, None).allocated == 1.0


@pytest.mark.parametrize(("labels", "want", "expected"), [
    ({GPU_FREE_LABEL: "6", GPU_LOAD_LABEL: "idle"}, ("5", "idle", False), False),   # gpu-free only: waits
    ({GPU_FREE_LABEL: "6", GPU_LOAD_LABEL: "idle"}, ("3", "busy", False), False),   # a tier change waits too
    ({GPU_FREE_LABEL: "0", GPU_LOAD_LABEL: "congested"}, ("0", "congested", True), False),  # so does the taint
    ({}, ("8", "idle", False), True),                                              # first marks
    ({GPU_FREE_LABEL: "8"}, ("8", "idle", False), True),                            # a mark missing
    ({GPU_FREE_LABEL: "8", GPU_LOAD_LABEL: "idle"}, (None, None, False), True),     # marks removed
])
def test_only_marks_appearing_or_going_away_are_urgent(labels, want, expected) -> None:
    """At most one Node write per node per write_interval; a tier change is no exception."""
    info = node_info(node(labels=labels))
    assert marks.urgent(info, marks.Marks(*want)) is expected


def test_after_patch_is_the_node_as_the_patch_leaves_it() -> None:
    theirs = {"key": "x", "effect": "NoSchedule"}
    info = node_info(node(labels={"team": "a", GPU_FREE_LABEL: "8"}, taints=[theirs]))
    want = marks.Marks(free="0", load="congested", tainted=True)
    after = marks.after_patch(info, want)
    assert after.owned_labels == ((GPU_FREE_LABEL, "0"), (GPU_LOAD_LABEL, "congested"))
    assert after.taints == (theirs, {"key": CONGESTED_TAINT_KEY, "effect": "PreferNoSchedule"})
    assert marks.node_patch(after, want) is None and after.resource_version == info.resource_version


def desired_for(info, requested, util=None, taint=False):
    return marks.desired(info, marks.node_load(info, requested, util), thresholds=T, taint_congested=taint)


def test_patch_sets_only_our_labels_when_they_change() -> None:
    info = node_info(node(labels={"team": "a"}))
    patch = marks.node_patch(info, desired_for(info, {"nvidia.com/gpu": 2}))
    assert patch == {"metadata": {"labels": {GPU_FREE_LABEL: "6", GPU_LOAD_LABEL: "idle"}}}
    labelled = node_info(node(labels={"team": "a", GPU_FREE_LABEL: "6", GPU_LOAD_LABEL: "idle"}))
    assert marks.node_patch(labelled, desired_for(labelled, {"nvidia.com/gpu": 2})) is None
    changed = marks.node_patch(labelled, desired_for(labelled, {"nvidia.com/gpu": 3}))
    assert changed == {"metadata": {"labels": {GPU_FREE_LABEL: "5"}}}


def test_congested_taint_keeps_every_other_taint_and_pins_the_version() -> None:
    theirs = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}, {"key": "x", "value": "y", "effect": "NoExecute"}]
    info = node_info(node(taints=theirs, rv="42"))
    patch = marks.node_patch(info, desired_for(info, {"nvidia.com/gpu": 8}, taint=True))
    assert patch["spec"]["taints"] == theirs + [{"key": CONGESTED_TAINT_KEY, "effect": "PreferNoSchedule"}]
    assert patch["metadata"]["resourceVersion"] == "42"
    assert patch["metadata"]["labels"][GPU_LOAD_LABEL] == "congested"
    tainted = node_info(node(taints=patch["spec"]["taints"],
                             labels={GPU_FREE_LABEL: "0", GPU_LOAD_LABEL: "congested"}))
    relieved = marks.node_patch(tainted, desired_for(tainted, {"nvidia.com/gpu": 1}, taint=True))
    assert relieved["spec"]["taints"] == theirs
    assert marks.node_patch(info, desired_for(info, {"nvidia.com/gpu": 8}, taint=False)).get("spec") is None


def test_a_node_that_is_no_longer_a_gpu_node_loses_our_marks_only() -> None:
    theirs = {"key": "other", "effect": "NoSchedule"}
    ours = {"key": CONGESTED_TAINT_KEY, "effect": "PreferNoSchedule"}
    info = node_info(node(alloc={}, labels={"team": "a", GPU_FREE_LABEL: "0", GPU_LOAD_LABEL: "congested"},
                          taints=[theirs, ours]))
    patch = marks.node_patch(info, marks.desired(info, None, thresholds=T, taint_congested=True))
    assert patch["metadata"]["labels"] == {GPU_FREE_LABEL: None, GPU_LOAD_LABEL: None}
    assert patch["spec"]["taints"] == [theirs]


def test_a_plain_cpu_node_gets_no_patch() -> None:
    info = node_info(node(alloc={}, labels={"team": "a"}, taints=[{"key": "k", "effect": "NoSchedule"}]))
    assert marks.node_patch(info, marks.desired(info, None, thresholds=T, taint_congested=True)) is None
