"""The extender's state: fed by watch events, answering ExtenderArgs; caches never change an answer."""

from __future__ import annotations

import random

import pytest

from webhook.kube.demand import PodDemand
from webhook.placement import scoring
from webhook.placement.extender import ExtenderSettings, ExtenderState, candidate_names, host_priorities
from webhook.placement.shapes import Shape, ShapeMix

MIX = ShapeMix((Shape(2000, 500, 1), Shape(4000, 1000, 1), Shape(1000)), (0.5, 0.25, 0.25))
PODS = (PodDemand(cpu=2000, memory_bytes=2**30, share_milli=500), PodDemand(cpu=4000, memory_bytes=2**31, gpus=1),
        PodDemand(cpu=1000, memory_bytes=2**29), PodDemand(cpu=3000, share_milli=250), PodDemand(cpu=8000, gpus=2))


def cluster(settings: ExtenderSettings) -> ExtenderState:
    state = ExtenderState(settings)
    for i in range(12):
        state.set_node(f"n{i}", cpu=32_000 * (1 + i % 3), memory=2**37, product="T4" if i % 2 else "A10",
                       gpus=(8, 4, 2)[i % 3])
    return state


@pytest.mark.parametrize("warm", [True, False])
def test_the_cached_answer_is_the_pure_function_of_the_views(warm: bool) -> None:
    """Memos, warming and the per-node cache only save work: scores equal scoring.prioritize on the views."""
    state = cluster(ExtenderSettings(mix=MIX, warm_keys=warm, assume=False))
    state.refresh()
    names = sorted(state.nodes)
    rng = random.Random(7)
    for step in range(150):
        pod = rng.choice(PODS)
        got = state.prioritize(f"p{step}", pod, names)
        views = [state.view(name) for name in names]
        assert got == scoring.prioritize(pod, views, state.fragmenter, where=state.context)
        best = names[got.index(max(got))]
        if max(got) > 0:
            state.bind(f"p{step}", best, pod)


def test_a_scored_pod_is_assumed_on_its_best_node_until_the_watch_shows_it_bound() -> None:
    state = cluster(ExtenderSettings(mix=MIX, assume_ttl=10))
    names = sorted(state.nodes)
    pod = PodDemand(cpu=4000, gpus=1)
    first = state.prioritize("a", pod, names, now=0)
    chosen = names[first.index(10)]
    assert state.assumed == 1 and state.view(chosen).gpu_free == state.nodes[chosen].gpu_free - 1000
    state.prioritize("b", pod, names, now=1)        # scored against the assumed view, not the stale one
    assert state.assumed == 2
    state.bind("a", chosen, pod)                    # the watch catches up
    assert state.assumed == 1 and "a" in {b.key for b in state.nodes[chosen].pods}
    state.expire(now=20)                            # "b" never bound: forgotten after the ttl
    assert state.assumed == 0 and state.view(chosen) is state.nodes[chosen]


def test_without_assumption_a_stale_view_scores_the_same_node_again() -> None:
    state = cluster(ExtenderSettings(mix=MIX, assume=False))
    names = sorted(state.nodes)
    pod = PodDemand(cpu=4000, gpus=1)
    assert state.prioritize("a", pod, names) == state.prioritize("b", pod, names)
    assert state.assumed == 0


def test_unbind_and_node_changes_keep_the_accounting_exact() -> None:
    state = cluster(ExtenderSettings(mix=MIX, assume=False))
    pod = PodDemand(cpu=4000, memory_bytes=2**30, share_milli=500)
    before = state.nodes["n0"]
    state.bind("x", "n0", pod)
    state.bind("x", "n0", pod)                      # a repeated event is harmless
    assert state.nodes["n0"].cpu_left == before.cpu_left - 4000 and len(state.nodes["n0"].pods) == 1
    state.set_node("n0", cpu=before.cpu, memory=before.memory, product=before.product, gpus=4)
    assert state.nodes["n0"].gpus == 4 and state.nodes["n0"].gpu_free == 3500
    state.unbind("x")
    assert state.nodes["n0"].gpu_free == 4000 and not state.nodes["n0"].pods
    state.remove_node("n0")
    assert state.prioritize("y", pod, ["n0", "n1"])[0] == 0   # unknown node: 0


def test_the_learned_mix_follows_the_pods_seen() -> None:
    state = cluster(ExtenderSettings(window=50, refresh=5))
    for _ in range(40):
        state.seen(PodDemand(cpu=4000, gpus=1))
    assert state.fragmenter.mix.shapes == (Shape(4000, 1000, 1),)
    state.seen(PodDemand(extended=(("nvidia.com/mig-1g.10gb", 1),)))     # MIG pods are not shapes
    assert state.fragmenter.mix.shapes == (Shape(4000, 1000, 1),)


def test_the_wire_shapes_are_kube_schedulers() -> None:
    assert candidate_names({"NodeNames": ["a", "b"]}) == ["a", "b"]
    assert candidate_names({"Nodes": {"items": [{"metadata": {"name": "c"}}]}, "NodeNames": None}) == ["c"]
    assert host_priorities(["a", "b"], [10, 0]) == [{"Host": "a", "Score": 10}, {"Host": "b", "Score": 0}]


def test_a_configured_mix_is_used_from_the_start_and_pods_seen_do_not_replace_it() -> None:
    state = cluster(ExtenderSettings(mix=MIX, window=50, refresh=5))
    assert state.fragmenter.mix == MIX
    for _ in range(40):
        state.seen(PodDemand(cpu=4000, gpus=1))
    state.refresh()
    assert state.fragmenter.mix == MIX
