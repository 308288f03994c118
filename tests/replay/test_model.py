"""The kube-scheduler model: filters and scores as kube-scheduler computes them, on real Pod dicts."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from webhook.replay import demand, kubescheduler
from webhook.replay.cluster import ClusterState
from webhook.replay.kubescheduler import KubeCluster, Requirement, SelectorTerm, Taint
from webhook.replay.nodelabels import NodeLabels
from webhook.replay.records import NodeRecord

LABELS = [
    {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "15109", "gpugate.io/gpu-free": "2"},
    {"nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB", "nvidia.com/gpu.memory": "32510", "gpugate.io/gpu-free": "0"},
    {"nvidia.com/gpu.product": "ALIBABA-G2", "gpugate.io/gpu-free": "eight"},
]


def cluster(nodes: int = 3, gpus: int = 2, labels: list[dict[str, str]] | None = None) -> KubeCluster:
    records = tuple(NodeRecord(f"n{i}", 32_000, 65_536, gpus, "T4") for i in range(nodes))
    state = ClusterState(records)
    return KubeCluster(state=state, labels=NodeLabels(state.names, labels or [{} for _ in range(nodes)]))


def pod(*, cpu: str = "1", memory: str = "1Gi", gpus: int = 0, spec: dict[str, Any] | None = None,
        extra: dict[str, str] | None = None) -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": memory, **(extra or {})}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    return {"metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "main", "resources": {"requests": requests}}], **(spec or {})}}


@pytest.mark.parametrize(("key", "operator", "values", "expected"), [
    ("nvidia.com/gpu.product", "In", ["Tesla-T4", "ALIBABA-G2"], [True, False, True]),
    ("nvidia.com/gpu.product", "NotIn", ["Tesla-T4"], [False, True, True]),
    ("nvidia.com/gpu.memory", "NotIn", ["15109"], [False, True, True]),  # absent label: NotIn holds
    ("nvidia.com/gpu.memory", "Exists", [], [True, True, False]),
    ("nvidia.com/gpu.memory", "DoesNotExist", [], [False, False, True]),
    ("nvidia.com/gpu.memory", "Gt", ["23999"], [False, True, False]),
    ("nvidia.com/gpu.memory", "Lt", ["20000"], [True, False, False]),
    ("gpugate.io/gpu-free", "Lt", ["3"], [True, True, False]),  # "eight" is no integer: Gt/Lt never hold
    ("gpugate.io/gpu-free", "Gt", ["not-a-number"], [False, False, False]),
    ("no.such/label", "In", ["x"], [False, False, False]),
])
def test_each_operator_follows_kubernetes_label_semantics(key: str, operator: str, values: list[str],
                                                           expected: list[bool]) -> None:
    labels = NodeLabels(["a", "b", "c"], LABELS)
    assert labels.requirement(Requirement(key, operator, tuple(values))).tolist() == expected


def test_an_empty_term_matches_no_node_and_fields_match_node_names() -> None:
    labels = NodeLabels(["a", "b", "c"], LABELS)
    assert not labels.term(SelectorTerm()).any()
    by_name = SelectorTerm(fields=(Requirement("metadata.name", "In", ("b",)),))
    assert labels.term(by_name).tolist() == [False, True, False]


def test_required_terms_are_ored_and_node_selector_anded() -> None:
    kc = cluster(labels=LABELS)
    spec = {"nodeSelector": {"nvidia.com/gpu.memory": "32510"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]}]},
                {"matchExpressions": [{"key": "gpugate.io/gpu-free", "operator": "Lt", "values": ["1"]}]}]}}}}
    view = demand.view(pod(spec=spec))
    assert kubescheduler.node_affinity_filter(kc, view).tolist() == [False, True, False]
    del spec["nodeSelector"]
    assert kubescheduler.node_affinity_filter(kc, demand.view(pod(spec=spec))).tolist() == [True, True, False]


def test_updating_a_label_changes_later_evaluations() -> None:
    labels = NodeLabels(["a", "b", "c"], LABELS)
    term = SelectorTerm((Requirement("gpugate.io/gpu-free", "Lt", ("1",)),))
    assert labels.term(term).tolist() == [False, True, False]
    labels.update("gpugate.io/gpu-free", {0: "0", 1: "5"})
    assert labels.term(term).tolist() == [True, False, False]


def test_untolerated_no_schedule_taints_filter_and_prefer_no_schedule_only_scores() -> None:
    kc = cluster()
    kc.taints[0] = (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    kc.taints[1] = (Taint("gpugate.io/congested", "", "PreferNoSchedule"),)
    plain = demand.view(pod())
    assert kubescheduler.taint_filter(kc, plain).tolist() == [False, True, True]
    assert kubescheduler.taint_toleration_score(kc, plain, np.array([1, 2])).tolist() == [0, 100]
    tolerant = demand.view(pod(spec={"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"},
                                                     {"operator": "Exists", "effect": "PreferNoSchedule"}]}))
    assert kubescheduler.taint_filter(kc, tolerant).tolist() == [True, True, True]
    assert kubescheduler.taint_toleration_score(kc, tolerant, np.array([0, 1, 2])).tolist() == [100, 100, 100]


def test_preferred_weights_are_normalized_to_the_best_feasible_node() -> None:
    kc = cluster(labels=LABELS)
    terms = [{"weight": 40, "preference": {"matchExpressions": [{"key": "gpugate.io/gpu-free", "operator": "Lt",
                                                                 "values": ["1"]}]}},
             {"weight": 10, "preference": {"matchExpressions": [{"key": "gpugate.io/gpu-free", "operator": "Lt",
                                                                 "values": ["3"]}]}}]
    view = demand.view(pod(spec={"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": terms}}}))
    assert kubescheduler.node_affinity_score(kc, view, np.array([0, 1, 2])).tolist() == [20, 100, 0]
    assert kubescheduler.node_affinity_score(kc, view, np.array([0, 2])).tolist() == [100, 0]
    assert kubescheduler.node_affinity_score(kc, view, np.array([2])).tolist() == [0]


def test_least_allocated_and_balanced_allocation_use_kube_scheduler_arithmetic() -> None:
    kc = cluster(nodes=2)
    kc.state.cpu_used[1] = kc.state.cpu_score_used[1] = 16_000
    view = demand.view(pod(cpu="8", memory="16Gi"))
    nodes = np.array([0, 1])
    # cpu (32-8)/32 -> 75, memory (64-16)/64 -> 75; node 1 cpu (32-24)/32 -> 25: (25+75)//2 = 50
    assert kubescheduler.LEAST_ALLOCATED(kc, view, nodes).tolist() == [75, 50]
    # v1.36 scores the change in balance: 50 + (50 + with - without) // 2. Node 0 is balanced before
    # (100) and after (0.25/0.25 -> 100), node 1 unbalanced before (0.5/0 -> 75) and after
    # (0.75/0.25 -> 75): both 75, where the pre-v1.36 score (balance after only) said 100 and 75.
    assert kubescheduler.balanced_allocation_score(kc, view, nodes).tolist() == [75, 75]
    # A container without requests counts as 100m / 200MB in the fit score.
    bare = demand.view({"spec": {"containers": [{"name": "c"}]}})
    assert (bare.demand.cpu, bare.demand.cpu_score) == (0, 100)


def test_balanced_allocation_rewards_the_node_whose_balance_the_pod_improves() -> None:
    """kube-scheduler v1.36 (noderesources/balanced_allocation.go, balancedResourceScorer) scores
    the change: a node the pod brings into balance 87, an empty node it unbalances 62 (the
    pre-v1.36 balance-after score gave 100 and 75, and 100 to every already balanced node)."""
    kc = cluster(nodes=2)
    kc.state.mem_used[1] = 32 * 2**30                      # node 1: memory 0.5, cpu 0
    view = demand.view(pod(cpu="16", memory="0"))           # cpu 0.5
    scores = kubescheduler.balanced_allocation_score(kc, view, np.array([0, 1])).tolist()
    # node 0: 100 -> 75 (0.5/0): 50 + 25 // 2 = 62; node 1: 75 -> 100 (0.5/0.5): 50 + 75 // 2 = 87
    assert scores == [62, 87]
    # A best-effort pod is skipped (PreScore returns Skip): no score on any node.
    empty = demand.view({"spec": {"containers": [{"name": "c"}]}})
    assert kubescheduler.balanced_allocation_score(kc, empty, np.array([0, 1])).tolist() == [0, 0]


def test_most_allocated_weighs_gpus_only_for_pods_that_request_them() -> None:
    kc = cluster(nodes=2)
    kc.state.gpu_left[1, 0] = 0  # one of node 1's two GPUs is taken
    score = kubescheduler.resources_fit_score("MostAllocated", kubescheduler.BINPACK_WEIGHTS)
    gpu_pod = demand.view(pod(cpu="0", memory="0", gpus=1))
    # node 0: gpu 50%*5, cpu/mem ~0 -> 250//7 = 35; node 1: gpu 100%*5 -> 500//7 = 71
    assert score(kc, gpu_pod, np.array([0, 1])).tolist() == [35, 71]
    cpu_pod = demand.view(pod(cpu="0", memory="0"))
    assert score(kc, cpu_pod, np.array([0, 1])).tolist() == [0, 0]


@pytest.mark.parametrize(("nodes", "percentage", "expected"), [
    (50, 0, 50), (1213, 0, 497), (5000, 0, 500), (20000, 0, 1000), (1213, 100, 1213), (1213, 10, 121), (300, 10, 100),
])
def test_the_adaptive_share_of_nodes_to_score(nodes: int, percentage: int, expected: int) -> None:
    assert kubescheduler.nodes_to_find(nodes, percentage) == expected


def test_the_scan_resumes_where_the_last_cycle_stopped() -> None:
    kc = cluster(nodes=250)
    scheduler = kubescheduler.KubeScheduler((kubescheduler.DEFAULT_PROFILE,), np.random.default_rng(0))
    view = demand.view(pod())
    first = scheduler.schedule(kc, view)
    # 250 nodes: 50 - 250/125 = 48% -> stop after 120 feasible nodes, next scan starts at 120.
    assert first is not None and first < 120 and scheduler.next_start == 120
    second = scheduler.schedule(kc, view)
    assert second is not None and 120 <= second < 240 and scheduler.next_start == 240


def test_equal_nodes_are_chosen_at_random_from_the_seeded_generator() -> None:
    kc = cluster(nodes=20)
    view = demand.view(pod())
    default = (kubescheduler.DEFAULT_PROFILE,)
    picks = {kubescheduler.KubeScheduler(default, np.random.default_rng(seed)).schedule(kc, view) for seed in range(30)}
    assert len(picks) > 5
    again = [kubescheduler.KubeScheduler((kubescheduler.DEFAULT_PROFILE,), np.random.default_rng(3)).schedule(kc, view)
             for _ in range(3)]
    assert len(set(again)) == 1


@pytest.mark.parametrize(("totals", "top"), [
    ([5, 9, 9], 1),
    # heap.Init sifts the last 9 (a leaf) above the 5, then over the 1: the later of two equal totals wins.
    ([1, 5, 9, 9], 3),
    ([9, 9, 9], 0),
    ([1, 2, 3, 4, 5], 4),
    ([7], 0),
])
def test_heap_top_is_where_gos_container_heap_puts_the_best_total(totals: list[int], top: int) -> None:
    assert kubescheduler.heap_top(totals) == top


def test_list_ties_go_to_the_heaps_top_of_the_scan_without_an_extender_and_at_random_with_one() -> None:
    kc = cluster(nodes=20)
    view = demand.view(pod())
    default = (kubescheduler.DEFAULT_PROFILE,)
    picks = {kubescheduler.KubeScheduler(default, np.random.default_rng(seed), ties="list").schedule(kc, view)
             for seed in range(30)}
    assert picks == {kubescheduler.heap_top([1] * 20)} == {0}  # 20 equal empty nodes: the first scanned
    scheduler = kubescheduler.KubeScheduler(default, np.random.default_rng(0), ties="list")
    scheduler.next_start = 7
    assert scheduler.schedule(kc, view) == 7  # the scan, and so the scored list, starts at node 7
    flat = dataclasses.replace(kubescheduler.DEFAULT_PROFILE, extenders=((lambda kc, pod, nodes: [0] * len(nodes), 1),))
    extended = {kubescheduler.KubeScheduler((flat,), np.random.default_rng(seed), ties="list").schedule(kc, view)
                for seed in range(30)}
    assert len(extended) > 5  # an extender's Randomizer breaks the ties
    with pytest.raises(ValueError, match="ties 'first': not one of random, list"):
        kubescheduler.KubeScheduler(default, np.random.default_rng(0), ties="first")


def test_gpus_fit_at_per_gpu_thousandths_and_unknown_profiles_or_resources_never_schedule() -> None:
    kc = cluster(nodes=2)
    kc.state.gpu_left[0] = [600, 0]
    kc.state.gpu_left[1] = [1000, 300]
    share = demand.view(pod(extra={"nvidia.com/gpu.shared": "1"}) | {
        "metadata": {"name": "s", "annotations": {"replay.gpugate.io/gpu-milli": "500"}}})
    assert (share.demand.num_gpu, share.demand.milli_per_gpu) == (1, 500)
    assert kubescheduler.fit_filter(kc, share).tolist() == [True, True]
    assert kubescheduler.fit_filter(kc, demand.view(pod(gpus=2))).tolist() == [False, False]
    assert kubescheduler.fit_filter(kc, demand.view(pod(gpus=1))).tolist() == [False, True]
    mig = demand.view(pod(extra={"nvidia.com/mig-1g.10gb": "1"}))  # an integer resource no node here has
    assert mig.demand.extended == (("nvidia.com/mig-1g.10gb", 1),) and not kubescheduler.fit_filter(kc, mig).any()
    elsewhere = demand.view(pod(spec={"schedulerName": "volcano"}))
    scheduler = kubescheduler.KubeScheduler((kubescheduler.DEFAULT_PROFILE,), np.random.default_rng(0))
    assert scheduler.schedule(kc, elsewhere) is None


def test_a_share_goes_where_the_device_plugin_policy_puts_it() -> None:
    kc = cluster(nodes=1, gpus=3)
    kc.state.gpu_left[0] = [700, 900, 1000]
    share = demand.view(pod(extra={"nvidia.com/gpu.shared": "1"}) | {
        "metadata": {"name": "s", "annotations": {"replay.gpugate.io/gpu-milli": "600"}}})
    assert kubescheduler.KubeScheduler.devices(kc, 0, share.demand, "distributed") == (2,)
    assert kubescheduler.KubeScheduler.devices(kc, 0, share.demand, "packed") == (0,)
    assert kubescheduler.KubeScheduler.devices(kc, 0, demand.view(pod(gpus=1)).demand) == (2,)


def test_init_containers_raise_the_request_to_their_maximum() -> None:
    spec_pod = pod(cpu="1", memory="1Gi")
    spec_pod["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "3", "memory": "512Mi"}}}]
    view = demand.view(spec_pod)
    assert (view.demand.cpu, view.demand.memory_mib) == (3000, 1024)


def test_the_binpack_profile_matches_the_shipped_scheduler_config(repo_root) -> None:
    """The replay's second profile is the one manifests/scheduler deploys (weights, strategy, node share)."""
    import yaml

    path = repo_root / "manifests" / "scheduler" / "scheduler-config.yaml"
    config = yaml.safe_load(path.read_text())
    profile = next(p for p in config["profiles"] if p["schedulerName"] == "gpugate-binpack")
    fit = next(c["args"] for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit")
    assert fit["scoringStrategy"]["type"] == "MostAllocated"
    shipped = {r["name"]: r["weight"] for r in fit["scoringStrategy"]["resources"]}
    assert shipped == dict(kubescheduler.BINPACK_WEIGHTS)
    share = profile.get("percentageOfNodesToScore", config.get("percentageOfNodesToScore", 0))
    assert share == kubescheduler.binpack_profile().percentage_of_nodes_to_score


def test_dynamic_resources_ranks_nodes_by_the_first_available_sub_request_they_give() -> None:
    """v1.36's DynamicResources Score (weight 2): 8 - the index of the sub-request allocated, normalized;
    found by tests/e2e/test_replay_fidelity.py's dra world, where a share's claim lists one
    sub-request per GPU kubescheduler."""
    records = tuple(NodeRecord(f"n{i}", 32_000, 65_536, 2, m) for i, m in enumerate(("T4", "V100M32", "P100", "T4")))
    state = ClusterState(records)
    kube = KubeCluster(state=state, labels=NodeLabels(state.names, [{} for _ in records]))
    view = demand.view(pod(gpus=1))
    nodes = np.arange(4)
    assert kubescheduler.dynamic_resources_score(kube, view, nodes).tolist() == [0, 0, 0, 0]
    listed = dataclasses.replace(view, claim_models=("P100", "T4", "V100M32"))
    ranked = kubescheduler.dynamic_resources_score(kube, listed, nodes)
    assert ranked.tolist() == [87, 75, 100, 87]  # 8-1, 8-2, 8-0, 8-1 over 8, floored
    assert ranked[2:3].tolist() == kubescheduler.dynamic_resources_score(
        kube, dataclasses.replace(view, claim_models=("P100",)), nodes[2:3]).tolist()
    assert (kubescheduler.dynamic_resources_score, 2) in kubescheduler.DEFAULT_PROFILE.scores
