"""Trace pods through the real webhook code, and the balancer's labels through the balancer's code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from webhook import names
from webhook.kube.demand import PodDemand
from webhook.replay import admitting, arms, demand, kubescheduler, labels, runner, workload
from webhook.replay.records import NodeRecord, Trace, TracePod

WHOLE = TracePod("train", 8000, 32768, 2, 1000, (), "BE")
SHARE = TracePod("share", 4000, 8192, 1, 470, ("T4", "V100M32"), "LS")
CPU = TracePod("cpu", 4000, 8192, 0, 0)
POLICIES = Path(__file__).resolve().parents[2] / "policies"
NODES = (NodeRecord("t4", 104_000, 524_288, 2, "T4"), NodeRecord("v100", 48_000, 376_832, 4, "V100M32"),
         NodeRecord("g2", 96_000, 393_216, 8, "G2"))


def test_trace_rows_become_pods_the_scheduler_reads_back() -> None:
    whole = demand.view(workload.pod_for(WHOLE))
    assert ((whole.demand.num_gpu, whole.demand.milli_per_gpu, whole.demand.cpu, whole.demand.memory_mib)
            == (2, 1000, 8000, 32768))
    share_pod = workload.pod_for(SHARE)
    assert share_pod["metadata"]["labels"][names.PROFILE_LABEL] == workload.SHARED_GPU_PROFILE
    share = demand.view(share_pod)
    assert ((share.demand.num_gpu, share.demand.milli_per_gpu, share.resources >= {names.SHARED_GPU_RESOURCE})
            == (1, 470, True))
    kc = runner.kube_cluster(Trace("t", NODES, (SHARE,)))
    assert kubescheduler.node_affinity_filter(kc, share).tolist() == [True, True, False]  # gpu_spec -> product In [...]
    assert demand.view(workload.pod_for(CPU)).demand.num_gpu == 0


def test_node_labels_are_what_gpu_feature_discovery_would_write() -> None:
    found = workload.node_labels(NODES[1])
    assert found[names.NVIDIA_PRODUCT_LABEL] == "Tesla-V100-SXM2-32GB"
    assert found[names.NVIDIA_MEMORY_LABEL] == "32510" and found[names.NVIDIA_COUNT_LABEL] == "4"
    assert names.NVIDIA_MEMORY_LABEL not in workload.node_labels(NODES[2])  # undisclosed model


def test_the_starter_training_policy_admits_whole_gpu_pods_onto_trace_nodes(repo_root: Path) -> None:
    admission = admitting.CachedAdmission(str(repo_root / "policies"))
    admitted = admission.admit(workload.pod_for(WHOLE))
    assert admitted is not None and admitted["metadata"]["name"] == "train"
    assert admitted["metadata"]["annotations"][names.POLICY_ANNOTATION].startswith("training@")
    view = demand.view(admitted)
    kc = runner.kube_cluster(Trace("t", NODES, (WHOLE,)))
    assert kubescheduler.node_affinity_filter(kc, view).tolist() == [True, True, True]  # no product pin left
    assert {t.key for t in view.tolerations} >= {names.GPU_TAINT_KEY}
    labels.Relabeler(lag=1).start(kc)
    # pack for 2 GPUs (gpu-free Lt 3/4/6/10, weights 40/30/20/10): free 2 -> 100, 4 -> 30, 8 -> 10
    assert kubescheduler.node_affinity_score(kc, view, np.arange(3)).tolist() == [100, 30, 10]


def test_admission_is_computed_once_per_pod_shape(repo_root: Path) -> None:
    admission = admitting.CachedAdmission(str(repo_root / "policies"))
    first = admission.admit(workload.pod_for(TracePod("a", 1000, 10, 1, 1000)))
    second = admission.admit(workload.pod_for(TracePod("b", 1000, 10, 1, 1000)))
    assert first["metadata"]["name"] == "a" and second["metadata"]["name"] == "b"
    assert first["spec"] == second["spec"] and len(admission.cache) == 1
    terms = first["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert {t["preference"]["matchExpressions"][0]["key"] for t in terms} == {names.GPU_FREE_LABEL}


def test_the_starter_cpu_pods_policy_packs_cpu_pods_off_free_gpus(repo_root: Path) -> None:
    admitted = admitting.CachedAdmission(str(repo_root / "policies")).admit(workload.pod_for(CPU))
    assert admitted["metadata"]["annotations"][names.POLICY_ANNOTATION].startswith("cpu-pods@")
    terms = admitted["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0] == {"weight": 100, "preference": {"matchExpressions": [
        {"key": names.GPU_FREE_LABEL, "operator": "DoesNotExist"}]}}
    view = demand.view(admitted)
    assert view.demand.num_gpu == 0 and not view.tolerations  # no GPU injected, no GPU taint tolerated
    nodes = (NodeRecord("cpu-only", 96_000, 393_216, 0, ""),) + NODES
    kc = runner.kube_cluster(Trace("t", nodes, ()))
    kc.state.bind(1, PodDemand.of_gpus(2, 1000, cpu=1, memory_bytes=2**20), (0, 1))
    kc.state.bind(2, PodDemand.of_gpus(1, 1000, cpu=1, memory_bytes=2**20), (0,))
    labels.Relabeler(lag=1).start(kc)
    # no GPUs, then 0 free, then 3 free, then an empty 8-GPU node last
    assert kubescheduler.node_affinity_score(kc, view, np.arange(4)).tolist() == [100, 60, 10, 0]


def test_balancer_labels_follow_allocation_only_every_k_placements() -> None:
    kc = runner.kube_cluster(Trace("t", NODES, ()))
    relabel = labels.Relabeler(lag=2)
    relabel.start(kc)
    assert [kc.labels.value(n, names.GPU_FREE_LABEL) for n in range(3)] == ["2", "4", "8"]
    assert {kc.labels.value(n, names.GPU_LOAD_LABEL) for n in range(3)} == {"idle"}
    kc.state.bind(0, PodDemand.of_gpus(1, 300, cpu=1, memory_bytes=2**20), (0,))
    relabel.placed(kc, 0)
    assert kc.labels.value(0, names.GPU_FREE_LABEL) == "2"  # stale: the balancer has not run yet
    kc.state.bind(0, PodDemand.of_gpus(1, 1000, cpu=1, memory_bytes=2**20), (1,))
    relabel.placed(kc, 0)
    assert kc.labels.value(0, names.GPU_FREE_LABEL) == "0"
    assert kc.labels.value(0, names.GPU_LOAD_LABEL) == "congested"  # every device slot taken


def test_the_congested_taint_is_written_when_asked() -> None:
    kc = runner.kube_cluster(Trace("t", NODES, ()))
    relabel = labels.Relabeler(lag=1, taint_congested=True)
    relabel.start(kc)
    kc.state.bind(0, PodDemand.of_gpus(2, 1000, cpu=1, memory_bytes=2**20), (0, 1))
    relabel.placed(kc, 0)
    assert kc.taints[0] == (labels.CONGESTED,) and kc.taints[1] == ()
    view = demand.view(workload.pod_for(CPU))
    assert kubescheduler.taint_toleration_score(kc, view, np.array([0, 1])).tolist() == [0, 100]


@pytest.mark.parametrize("arm", [a for a in runner.ARMS if a not in arms.TIMELINE_ONLY])
def test_every_arm_runs_and_never_allocates_more_than_arrived(arm: str, repo_root: Path) -> None:
    from webhook.replay import trace

    small = trace.synthetic(3, nodes=30)
    result = runner.run(small, runner.RunSpec(arm=arm, seed=3, policies=str(repo_root / "policies")))
    assert np.all(np.diff(result.arrived) >= 0) and result.arrived[-1] <= 130.0
    # The right-sizing arms and the timeslice world count capacity taken (a whole GPU for a small pod in
    # whole-gpu, a quarter-GPU slot for a 10% share), so there the trace's request of the placed pods is
    # what cannot exceed what arrived.
    placed = result.served if result.served is not None else result.allocated
    assert placed is not None and np.all(placed <= result.arrived + 1e-9) and np.all(result.allocated <= 100 + 1e-9)
    assert np.all(np.diff(result.allocated) >= -1e-9)
    assert result.failed == int((~result.placed).sum()) and 0 < result.alloc_at(100) <= 100



def test_the_gpugate_arm_reads_the_type_pressure_the_balancer_would_publish() -> None:
    """The balancer's extender state, filled from the pod list's history, says which products pinned
    pods need most; the gpugate arm's webhook reads that inventory, so an unpinned whole-GPU pod is
    told to stay off the T4 the pinned pods need, and a list without pins says nothing."""
    pinned = TracePod("pinned", 4000, 8192, 1, 1000, ("T4",), "LS")
    spec = runner.RunSpec(arm="gpugate", seed=42, policies=str(POLICIES))
    published = runner.balancer_inventory(Trace("t", NODES, (pinned, WHOLE) * 10), spec)
    assert dict(published.type_pressure)["Tesla-T4"] >= 0.5 and "ALIBABA-G2" not in dict(published.type_pressure)
    assert runner.balancer_inventory(Trace("t", NODES, (WHOLE, CPU) * 10), spec).type_pressure == ()
    admitted = admitting.CachedAdmission(str(POLICIES)).admit(workload.pod_for(WHOLE), published, "k")
    assert admitted is not None
    terms = admitted["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["Tesla-T4"]} in [
        t["preference"]["matchExpressions"][0] for t in terms]
