"""The replay's extender arm: kube-scheduler's extender arithmetic, webhook.placement's scores, a blind view."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from webhook.placement import extender as placement_extender
from webhook.replay import demand, kubescheduler, runner, trace
from webhook.replay.cluster import ClusterState
from webhook.replay.kubescheduler import KubeCluster, Profile
from webhook.replay.nodelabels import NodeLabels
from webhook.replay.records import NodeRecord


def small_cluster(nodes: int = 3) -> KubeCluster:
    records = tuple(NodeRecord(f"n{i}", 32_000, 65_536, 2, "T4") for i in range(nodes))
    state = ClusterState(records)
    return KubeCluster(state=state, labels=NodeLabels(state.names, [{} for _ in range(nodes)]))


def cpu_pod(cpu: str = "1") -> dict:
    return {"metadata": {"name": "p", "namespace": "ml"},
            "spec": {"schedulerName": "x", "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}]}}


@pytest.mark.parametrize(("priorities", "weight", "expected"), [
    ([0, 0, 2], 1, 0),        # 2 x 1 x 10 = 20 points: less than LeastAllocated's lead of node 0 (25)
    ([0, 0, 3], 1, 2),        # 30 points beat it
    ([0, 0, 1], 3, 2),        # weight 3: one level is 30 points
    ([10, 10, 10], 25, 0),    # equal extender scores: the default plugins decide
])
def test_an_extender_score_counts_weight_times_ten_on_top_of_the_plugins(priorities, weight, expected) -> None:
    """schedule_one.go prioritizeNodes: finalscore = score * weight * (MaxNodeScore / MaxExtenderPriority)."""
    cluster = small_cluster()
    cluster.state.cpu_used[:] = cluster.state.cpu_score_used[:] = [0, 16_000, 16_000]  # LeastAllocated: 25 apart
    profile = Profile(name="x", filters=kubescheduler.DEFAULT_FILTERS, scores=((kubescheduler.LEAST_ALLOCATED, 1),),
                      percentage_of_nodes_to_score=100,
                      extenders=((lambda c, p, n: [priorities[i] for i in n.tolist()], weight),))
    kube = kubescheduler.KubeScheduler((profile,), np.random.default_rng(0))
    assert kube.schedule(cluster, demand.view(cpu_pod())) == expected


def test_a_failing_extender_is_ignored_and_one_feasible_node_is_not_prioritized() -> None:
    calls = []

    def failing(cluster, pod, nodes):
        calls.append(len(nodes))
        return None

    cluster = small_cluster()
    profile = Profile(name="x", filters=kubescheduler.DEFAULT_FILTERS, scores=((kubescheduler.LEAST_ALLOCATED, 1),),
                      percentage_of_nodes_to_score=100, extenders=((failing, 25),))
    kube = kubescheduler.KubeScheduler((profile,), np.random.default_rng(0))
    assert kube.schedule(cluster, demand.view(cpu_pod())) is not None and calls == [3]
    cluster.state.cpu_used[:] = cluster.state.cpu_score_used[:] = [32_000, 32_000, 0]
    assert kube.schedule(cluster, demand.view(cpu_pod())) == 2 and calls == [3]


@pytest.mark.parametrize("sharing", ["timeslice", "dra", "published"])
def test_the_extender_arm_scores_with_webhook_placement_from_a_view_that_matches_the_cluster(monkeypatch,
                                                                                             sharing) -> None:
    """With lag 1 the blind view (allocatable, bound requests, the modelled devices; in dra the
    devices the claims hold) is the cluster itself."""
    made: list[runner.BlindExtender] = []
    clusters: list[KubeCluster] = []
    calls = []
    original_cluster = runner.World.cluster
    original_prioritize = placement_extender.ExtenderState.prioritize

    class Recorded(runner.BlindExtender):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    def counted(self, key, pod, names, *, now=0.0):
        calls.append(len(names))
        return original_prioritize(self, key, pod, names, now=now)

    monkeypatch.setattr(runner, "BlindExtender", Recorded)
    monkeypatch.setattr(runner.World, "cluster", lambda w, t: clusters.append(original_cluster(w, t)) or clusters[-1])
    monkeypatch.setattr(placement_extender.ExtenderState, "prioritize", counted)
    synthetic = trace.synthetic(3, nodes=40)
    result = runner.run(synthetic, runner.RunSpec(arm="extender", seed=3, sharing=sharing))
    assert result.placed.sum() > 0 and len(calls) > 0.5 * len(result.placed)
    [blind], [cluster] = made, clusters
    for index, name in enumerate(cluster.state.names):
        view = blind.state.nodes[name]
        assert view.cpu_left == cluster.state.cpu_left[index]
        assert view.left == tuple(cluster.state.gpu_left[index, :view.gpus].tolist())
    assert blind.state.assumed == 0


def test_the_extender_arm_beats_the_stock_scheduler_on_a_synthetic_cluster() -> None:
    synthetic = trace.synthetic(11, nodes=60)
    got = {arm: runner.run(synthetic, runner.RunSpec(arm=arm, seed=11)).alloc_at(100) for arm in ("stock", "extender")}
    assert got["extender"] > got["stock"]


@pytest.mark.slow
def test_on_a_slice_of_openb_the_extender_does_at_least_as_well_as_bestfit(shared_dir: Path) -> None:
    """A cheap fidelity check: 300 nodes of openb, the default pod list, seeds 42-44, medians at 100%;
    the extender in the dra world, where a share has its size as in BestFit's published kubescheduler."""
    full = trace.load_trace(shared_dir / "data" / "alibaba-gpu-v2023")
    sliced = replace(full, nodes=full.nodes[:300])
    medians = {arm: statistics.median(runner.run(sliced, runner.RunSpec(arm=arm, seed=seed, sharing="dra"))
                                      .alloc_at(100) for seed in (42, 43, 44)) for arm in ("bestfit", "extender")}
    assert medians["extender"] >= medians["bestfit"], medians
