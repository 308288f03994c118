"""Per-node accounting and the one patch per node: never touch what the balancer does not own."""

from __future__ import annotations

import pytest

from webhook.balancer import marks
from webhook.balancer.state import ClusterState, node_info, pod_key, pod_usage
from webhook.balancer.tiers import TierThresholds
from webhook.names import CONGESTED_TAINT_KEY, GPU_FREE_LABEL, GPU_LOAD_LABEL

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
    state = ClusterState()
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


def test_free_gpus_and_allocation_share() -> None:
    load = marks.node_load(node_info(node()), {"nvidia.com/gpu": 6}, None)
    assert (load.free_gpus, load.allocated) == (2, 0.75)
    sliced = node_info(node(alloc={"nvidia.com/gpu": "16"}, labels={"nvidia.com/gpu.replicas": "4"}))
    assert marks.node_load(sliced, {"nvidia.com/gpu": 5}, None).free_gpus == 2  # 11 slots / 4 per GPU
    mig = node_info(node(alloc={"nvidia.com/mig-1g.10gb": "7"}))
    load = marks.node_load(mig, {"nvidia.com/mig-1g.10gb": 7}, None)
    assert (load.free_gpus, load.allocated) == (0, 1.0)
    empty = node_info(node(alloc={"nvidia.com/gpu": "0"}))
    assert marks.node_load(empty, {}, None).allocated == 1.0


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
