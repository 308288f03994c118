"""The right-sizing arms: the trace's fractional requests as memory asks, through the real webhook, on MIG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from webhook import names
from webhook.kube.quantity import bytes_
from webhook.replay import admitting, demand, kubescheduler, migcluster, nodelabels, report, runner, sizing, trace
from webhook.replay.cluster import ClusterState
from webhook.replay.records import NodeRecord, TracePod

MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_2G = "nvidia.com/mig-2g.20gb"
MIG_3G = "nvidia.com/mig-3g.40gb"


@pytest.mark.parametrize(("milli", "text", "gigabytes"), [(125, "10000M", 10), (250, "20000M", 20),
                                                          (470, "37600M", 37.6), (999, "79920M", 79.92)])
def test_a_share_of_a_gpu_becomes_that_share_of_the_h100s_80_gb(milli: int, text: str, gigabytes: float) -> None:
    assert migcluster.memory_ask(milli) == text
    assert bytes_(text) == round(gigabytes * 10**9)


def test_each_arm_writes_the_fractional_pod_its_own_way_and_leaves_whole_gpu_pods_alone() -> None:
    share = TracePod("s", 4000, 8192, 1, 470, ("T4",), "LS")
    whole = TracePod("w", 8000, 16384, 2, 1000, ("V100M32",), "BE")

    def requests(pod: dict) -> dict:
        return pod["spec"]["containers"][0]["resources"]["requests"]

    sized = migcluster.pod_for(share, "rightsized")
    assert sized["metadata"]["labels"][names.GPU_MEMORY_LABEL] == "37600M"
    assert sized["metadata"]["labels"][names.PROFILE_LABEL] == "inference"
    assert set(requests(sized)) == {"cpu", "memory"} and "affinity" not in sized["spec"]  # gpu_spec dropped
    assert requests(migcluster.pod_for(share, "whole-gpu"))[names.GPU_RESOURCE] == "1"
    assert requests(migcluster.pod_for(share, "shares-only"))[names.SHARED_GPU_RESOURCE] == "1"
    for arm in migcluster.ARMS:
        pod = migcluster.pod_for(whole, arm)
        assert requests(pod)[names.GPU_RESOURCE] == "2" and names.GPU_MEMORY_LABEL not in pod["metadata"]["labels"]


def test_the_twin_advertises_mig_slices_as_the_mixed_strategy_does() -> None:
    nodes = tuple(NodeRecord(f"n{i}", 64_000, 262_144, 8, "G2") for i in range(4)) + (
        NodeRecord("cpu", 64_000, 262_144, 0, ""),)
    twin = migcluster.sized_nodes(nodes, "rightsized", migcluster.parse_mix("all-balanced=0.25,all-1g.10gb=0.25"))
    assert sorted(n.layout for n in twin) == ["all-1g.10gb", "all-balanced", "whole", "whole", "whole"]
    balanced = next(n for n in twin if n.layout == "all-balanced")
    assert dict(balanced.allocatable) == {MIG_1G: 16, MIG_2G: 8, MIG_3G: 8} and balanced.record.gpus == 0
    assert balanced.labels[names.NVIDIA_MIG_CONFIG_LABEL] == "all-balanced"
    assert balanced.physical_gpus == 8
    shared = migcluster.sized_nodes(nodes, "shares-only", migcluster.parse_mix("all-balanced=0.25"))
    assert [dict(n.allocatable) for n in shared if n.allocatable] == [{names.SHARED_GPU_RESOURCE: 32}]
    assert all(n.layout == "whole" for n in migcluster.sized_nodes(nodes, "whole-gpu", migcluster.parse_mix(
        "all-balanced=0.5")))
    with pytest.raises(migcluster.MigMixError):
        migcluster.parse_mix("all-balanced=0.8,all-1g.10gb=0.3")
    with pytest.raises(migcluster.MigMixError):
        migcluster.parse_mix("all-7g.80gb=0.1")


def test_a_node_with_seven_1g_slices_takes_seven_pods_and_refuses_the_eighth() -> None:
    nodes = migcluster.sized_nodes((NodeRecord("mig", 64_000, 262_144, 1, "G2"),), "rightsized",
                                   migcluster.parse_mix("all-1g.10gb=1"))
    state = ClusterState(tuple(n.record for n in nodes), migcluster.extended_allocatable(nodes))
    kc = kubescheduler.KubeCluster(state=state, labels=nodelabels.NodeLabels(state.names, [n.labels for n in nodes]))
    pod = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [{"name": "main", "resources": {
        "requests": {"cpu": "1", "memory": "1Gi", MIG_1G: "1"}, "limits": {MIG_1G: "1"}}}]}}
    view = demand.view(pod)
    scheduler = kubescheduler.KubeScheduler((kubescheduler.DEFAULT_PROFILE,), np.random.default_rng(0))
    for _ in range(7):
        node = scheduler.schedule(kc, view)
        assert node == 0
        state.bind(node, view.demand, ())
    assert scheduler.schedule(kc, view) is None
    assert state.extended_left(MIG_1G).tolist() == [0]
    two = demand.view({**pod, "spec": {"containers": [{"name": "main", "resources": {"requests": {MIG_2G: "1"}}}]}})
    assert not kubescheduler.fit_filter(kc, two).any()  # a resource the node does not have: allocatable 0


def test_a_memory_ask_gets_the_smallest_rung_the_cluster_offers_now(repo_root: Path) -> None:
    nodes = migcluster.sized_nodes((NodeRecord("mig", 64_000, 262_144, 1, "G2"),
                                    NodeRecord("whole", 64_000, 262_144, 1, "G2")), "rightsized",
                                   migcluster.parse_mix("all-balanced=0.5"))
    assert [n.layout for n in nodes].count("all-balanced") == 1
    state = ClusterState(tuple(n.record for n in nodes), migcluster.extended_allocatable(nodes))
    offers = sizing.Offers(nodes, state)
    admission = admitting.CachedAdmission(str(repo_root / "policies"))

    def rung(milli: int) -> str:
        inventory, key = offers.current()
        stored = admission.admit(migcluster.pod_for(TracePod(f"p{milli}", 1000, 1024, 1, milli), "rightsized"),
                                 inventory, key)
        assert stored is not None
        return sizing.gpu_resource(demand.view(stored).demand)

    assert [rung(m) for m in (100, 125, 126, 250, 400, 600)] == [MIG_1G, MIG_1G, MIG_2G, MIG_2G, MIG_3G,
                                                                  names.GPU_RESOURCE]
    mig = [i for i, n in enumerate(nodes) if n.layout == "all-balanced"][0]
    two = demand.view({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "m", "resources": {
        "requests": {MIG_2G: "1"}}}]}})
    state.bind(mig, two.demand, ())  # the only 2g slice is taken: a 20 GB ask now gets the 3g slice
    assert rung(250) == MIG_3G and rung(125) == MIG_1G
    whole = demand.view({"metadata": {"name": "y"}, "spec": {"containers": [{"name": "m", "resources": {
        "requests": {names.GPU_RESOURCE: "1"}}}]}})
    three = demand.view({"metadata": {"name": "z"}, "spec": {"containers": [{"name": "m", "resources": {
        "requests": {MIG_3G: "1"}}}]}})
    state.bind(mig, three.demand, ())
    assert rung(250) == names.GPU_RESOURCE  # no slice of 20 GB or more left: the whole GPU
    state.bind(1 - mig, whole.demand, state.first_free(1 - mig, 1))
    assert rung(250) == MIG_2G  # nothing that fits is free: the ladder's first fitting rung, the pod waits


def test_on_a_synthetic_cluster_right_sizing_serves_more_pods_than_whole_gpus(repo_root: Path) -> None:
    loaded = trace.synthetic(42, nodes=60)
    results = [runner.run(loaded, runner.RunSpec(arm=arm, seed=42, policies=str(repo_root / "policies")))
               for arm in migcluster.ARMS]
    whole, shares, sized = results
    assert sized.placed.sum() > whole.placed.sum() + 50
    failed = [int((~r.placed[r.arrived <= 100]).sum()) for r in results]
    assert failed[2] < failed[0]
    rungs = {resource for resource, placed, _ in sized.rungs if placed}
    assert {MIG_1G, MIG_2G, MIG_3G} <= rungs
    assert [r for r, _, _ in whole.rungs] == [names.GPU_RESOURCE] and whole.oversubscribed == 0
    assert shares.oversubscribed > 0 and sized.oversubscribed == 0
    assert sized.denied == 0 and all(0 < r.alloc_at(100) <= 100 for r in results)
    table = report.sizing_table(results)
    assert "rightsized" in table and "mig-3g.40gb" in table


def test_the_command_prints_the_three_arms_side_by_side_and_refuses_a_bad_mix(tmp_path: Path, repo_root: Path) -> None:
    from click.testing import CliRunner

    from webhook.cli import main

    args = ["replay", "--arms", "whole-gpu,shares-only,rightsized", "--seeds", "7", "--synthetic-nodes", "20",
            "--policies", str(repo_root / "policies"), "--out", str(tmp_path), "--workers", "1"]
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.stderr
    assert "served@100%" in done.stdout and "(MIG mix all-balanced=0.15" in done.stdout
    assert all(arm in done.stdout for arm in migcluster.ARMS)
    bad = CliRunner().invoke(main, [*args, "--mig-mix", "all-7g.80gb=0.1"])
    assert bad.exit_code == 2 and "unknown MIG layout" in bad.stderr
