"""The sharing worlds (``--sharing timeslice|dra``): what a share is in each, and what the extender sees."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from webhook import names
from webhook.cli import main
from webhook.kube import claims, nodedevices
from webhook.kube.demand import PodDemand
from webhook.placement import devices as device_plugin
from webhook.placement import dra as placement_dra
from webhook.placement.extender import ExtenderState
from webhook.placement.inputs import NodeView
from webhook.replay import arms, demand, runner, worlds
from webhook.replay.cluster import ClusterState
from webhook.replay.records import NodeRecord, Trace, TracePod
from webhook.replay.runspec import RunSpec


def small_trace(share_milli: int = 300, shares: int = 40, whole: int = 30) -> Trace:
    nodes = tuple(NodeRecord(f"n{i}", 64_000, 262_144, 4, "T4" if i % 2 else "V100M32") for i in range(12))
    pods = tuple(TracePod(f"s{i}", 2_000, 4_096, 1, share_milli) for i in range(shares)) + \
        tuple(TracePod(f"w{i}", 4_000, 8_192, 1 + i % 2, 1000) for i in range(whole)) + \
        tuple(TracePod(f"c{i}", 1_000, 2_048, 0, 0) for i in range(10))
    return Trace("small", nodes, pods)


# --- timeslice ------------------------------------------------------------------------------------

def test_time_sliced_nodes_follow_the_lists_slot_demand_per_model() -> None:
    trace = small_trace()
    sliced = worlds.sliced_nodes(trace.nodes, trace.pods)
    assert any(sliced) and not all(sliced)
    for model in ("T4", "V100M32"):
        assert any(s for s, n in zip(sliced, trace.nodes, strict=True) if n.model == model)
    assert not any(worlds.sliced_nodes(trace.nodes, tuple(p for p in trace.pods if not p.shares_gpu)))
    assert worlds.sliced_nodes(trace.nodes, trace.pods) == sliced  # one fixed permutation


def test_in_timeslice_whole_gpus_and_slots_live_on_different_nodes() -> None:
    trace = small_trace()
    sliced = worlds.sliced_nodes(trace.nodes, trace.pods)
    state = ClusterState(trace.nodes, sliced=sliced)
    share = PodDemand.of_gpus(1, worlds.slot_milli(), cpu=1, memory_bytes=1)
    whole = PodDemand.of_gpus(1, 1000, cpu=1, memory_bytes=1)
    assert (state.fits(share) == np.array(sliced)).all()
    assert (state.fits(whole) == ~np.array(sliced)).all()


def test_a_slot_is_a_slot_whatever_the_trace_asks_and_larger_asks_are_overcommitted() -> None:
    """The scheduler and the extender never see a share's size: only the overcommit count reads it."""
    trace = small_trace()
    world = runner.World(trace, "timeslice", RunSpec(arm="stock", seed=42))
    seen = set()
    for milli in (100, 250, 900):
        record = TracePod("p", 2_000, 4_096, 1, milli)
        pod = world.pod_for(record)
        view = world.view(pod, record)
        seen.add((view.demand, world.extender_demand(pod, view, record)))
    assert len(seen) == 1 and next(iter(seen))[1].share_milli == worlds.slot_milli()
    for milli, over in ((200, False), (900, True)):
        spec = RunSpec(arm="stock", seed=42, sharing="timeslice", device_policy="packed")
        found = small_trace(share_milli=milli)
        result = runner.run(found, spec)
        shares_placed = sum(1 for step, index in enumerate(_order(found, spec))
                            if result.placed[step] and found.pods[index].shares_gpu)
        assert shares_placed > 0 and result.oversubscribed == (shares_placed if over else 0)


def _order(trace: Trace, spec: RunSpec) -> list[int]:
    from webhook.replay.arrival import arrival_order
    return list(arrival_order(trace.pods, trace.gpu_capacity_milli, spec.seed, tune=spec.tune))


def test_the_timeslice_pod_carries_no_size_and_reads_as_one_slot() -> None:
    pod = worlds.pod_for(TracePod("p", 1000, 1024, 1, 700), "timeslice")
    assert "annotations" not in pod["metadata"]
    view = demand.view(pod, slot_milli=worlds.slot_milli())
    assert (view.demand.num_gpu, view.demand.milli_per_gpu) == (1, 250)


# --- dra ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("milli", [1, 125, 250, 333, 460, 999])
def test_a_dra_share_is_a_claim_of_its_fraction_of_each_products_memory(milli: int) -> None:
    models = ["G2", "T4", "V100M32"]
    pod = worlds.pod_for(TracePod("p", 1000, 1024, 1, milli), "dra")
    resources = pod["spec"]["containers"][0]["resources"]
    assert names.SHARED_GPU_RESOURCE not in resources["requests"] and resources["claims"] == [{"name": "gpu-share"}]
    (ref,) = claims.pod_claim_refs(pod)
    assert ref.template_name == worlds.template_name(milli)
    ask = claims.parse(worlds.share_template(milli, models))
    assert placement_dra.share_milli(ask, worlds.memory_by_subrequest(models)) == milli
    for model in models:  # shares that fill a GPU in thousandths fill its memory, no more
        per_gpu = 1000 // milli
        assert per_gpu * worlds.fraction_bytes(milli, model) <= worlds.memory_bytes(model)
        assert (per_gpu + 1) * worlds.fraction_bytes(milli, model) > worlds.memory_bytes(model)


def test_the_dra_allocator_takes_the_first_device_in_name_order_with_room() -> None:
    left = [400, 1000, 100, 700]
    assert device_plugin.share_device(left, 300, "first") == 0
    assert device_plugin.share_device(left, 500, "first") == 1
    assert device_plugin.share_device(left, 500, "packed") == 3
    assert device_plugin.after_sorted((400, 1000, 100, 700), 0, 500, "first") == (700, 500, 400, 100)


def test_claims_on_a_shared_device_leave_its_memory_and_the_extender_reads_it() -> None:
    node = NodeRecord("n0", 64_000, 262_144, 3, "T4")
    held = [worlds.allocated_claim("ns/a", node, (0,), 250), worlds.allocated_claim("ns/b", node, (0,), 500),
            worlds.allocated_claim("ns/c", node, (2,), 1000)]
    found = nodedevices.by_node([worlds.node_slice(node)], nodedevices.held_keys(held),
                                nodedevices.consumed_by_key(held))["n0"]
    gpu0 = found.devices[0]
    assert gpu0.held and not gpu0.free and gpu0.memory_left == worlds.memory_bytes("T4") - \
        worlds.fraction_bytes(250, "T4") - worlds.fraction_bytes(500, "T4")
    assert found.whole_free == 1
    assert placement_dra.taken_milli(found) == (750, 0, 1000)


def test_a_dra_node_view_holds_claims_exactly_and_models_the_rest_first_fit() -> None:
    state = ExtenderState()
    state.set_node("n0", cpu=64_000, memory=2**38, product="Tesla-T4", gpus=3, ordered=True)
    state.hold("dra:n0", "n0", (750, 0, 1000))
    view = state.nodes["n0"]
    assert view.left == (250, 1000, 0) and view.signature == (250, 1000)  # device order kept
    assert view.bind("p", PodDemand(share_milli=200)).left == (50, 1000, 0)  # first fit, not packed/distributed
    state.hold("dra:n0", "n0", (0, 0, 0))
    assert state.nodes["n0"].left == (1000, 1000, 1000)
    plain = NodeView.empty("m", cpu=1, gpus=3)
    assert replace(plain, left=(250, 1000, 0)).signature == (1000, 250)


def test_dra_and_timeslice_runs_say_their_world_and_references_stay_published() -> None:
    trace = small_trace()
    for arm in ("stock", "extender", "fgd", "bestfit-slots"):
        for sharing in ("timeslice", "dra"):
            result = runner.run(trace, RunSpec(arm=arm, seed=43, sharing=sharing))
            assert result.world == arms.world_of(arm, sharing)
    assert arms.world_of("fgd", "dra") == "published" and arms.world_of("bestfit-slots", "dra") == "timeslice"


def test_the_cli_names_the_world_in_the_table_and_summary(tmp_path) -> None:
    out = tmp_path / "out"
    done = CliRunner().invoke(main, ["replay", "--sharing", "dra", "--arms", "stock,fgd", "--seeds", "42",
                                     "--synthetic-nodes", "20", "--workers", "1", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "sharing world dra" in done.output
    data = json.loads((out / "summary.json").read_text())
    assert data["sharing"] == "dra"
    assert data["arms"]["stock"]["world"] == "dra" and data["arms"]["fgd"]["world"] == "published"
    assert "overcommitted" in data["arms"]["stock"] and "overcommitted" not in data["arms"]["fgd"]


def test_every_arm_in_the_table_is_one_the_cli_accepts() -> None:
    from webhook.commands.replay import ALL_ARMS, parse_arms
    assert parse_arms(",".join(arms.NAMES), runner.ARMS) == list(arms.NAMES)
    assert ALL_ARMS.split(",") == list(arms.DEFAULT)


def test_the_balancers_extender_reads_consumable_shares_from_slices_and_claims() -> None:
    """The balancer's path (DraCache -> NodeDevices -> Feed) gives each device its true
    thousandths left, in device order, and a share's assumption lands first fit on top."""
    from webhook.balancer import placementfeed
    from webhook.kube import slices
    from webhook.kube.gpunode import node_info
    from webhook.placement import dracount

    node = NodeRecord("dra-1", 64_000, 262_144, 3, "T4")
    cache = dracount.DraCache()
    cache.set_slice("s", slices.parse(slices.render(worlds.node_slice(node))))
    feed = placementfeed.Feed(ExtenderState())
    feed.node("dra-1", node_info({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "dra-1", "labels": {}},
                                  "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}}))
    for key, gpus, milli in (("ns/a", (0,), 250), ("ns/b", (0,), 500), ("ns/c", (2,), 1000)):
        cache.set_claim(key, worlds.allocated_claim(key, node, gpus, milli))
    feed.dra("dra-1", cache.node("dra-1"))
    view = feed.state.view("dra-1")
    assert view is not None and view.ordered and view.left == (250, 1000, 0)
    feed.state.prioritize("ns/p", PodDemand(cpu=1, share_milli=200), ["dra-1"], now=0.0)
    assumed = feed.state.view("dra-1")
    assert assumed is not None and assumed.left == (50, 1000, 0)  # the assumption: first fit, as the allocator
    cache.set_claim("ns/b", None)
    feed.dra("dra-1", cache.node("dra-1"))
    assert feed.state.nodes["dra-1"].left == (750, 1000, 0)


def test_docs_placement_shows_the_arms_table_as_the_registry_has_it(repo_root) -> None:
    assert arms.markdown_table() in (repo_root / "docs" / "placement.md").read_text()
