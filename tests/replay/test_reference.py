"""The published schedulers and the fragmentation measure, checked against their definitions."""

from __future__ import annotations

import numpy as np
import pytest

from webhook.kube.demand import PodDemand
from webhook.replay import arrival, fragmentation, reference
from webhook.replay.cluster import ClusterState
from webhook.replay.records import NodeRecord, TracePod

NODES = (NodeRecord("a", 96_000, 400_000, 8, "G2"), NodeRecord("b", 104_000, 500_000, 2, "T4"),
         NodeRecord("c", 16_000, 100_000, 2, "P100"), NodeRecord("d", 64_000, 250_000, 4, "V100M16"))
SHAPES = [PodDemand.of_gpus(1, 1000, cpu=4000, cpu_score=4000, memory_bytes=2**20)] * 5 + \
         [PodDemand.of_gpus(1, 500, cpu=2000, cpu_score=2000, memory_bytes=2**20)] * 3 + \
         [PodDemand.of_gpus(0, 0, cpu=8000, cpu_score=8000, memory_bytes=2**20)] * 2


def demand(cpu: int, milli: int = 0, num: int = 0) -> PodDemand:
    return PodDemand.of_gpus(num, milli, cpu=cpu, cpu_score=cpu, memory_bytes=2**20)


def brute_force_fragment(state: ClusterState, typical: fragmentation.TypicalPods) -> np.ndarray:
    """The definition, node by node and shape by shape."""
    out = np.zeros(state.size)
    for n in range(state.size):
        left = state.gpu_left[n]
        for m in range(len(typical.prob)):
            fits_gpu = (left >= typical.milli[m]).sum() >= typical.num[m]
            satisfied = (typical.milli[m] > 0 and fits_gpu and state.cpu_left[n] >= typical.cpu[m]
                         and typical.access[n, m])
            frag = left[left < typical.milli[m]].sum() if satisfied else left.sum()
            out[n] += typical.prob[m] * frag
    return out


def test_typical_pods_take_the_most_common_shapes_until_they_cover_95_percent() -> None:
    state = ClusterState(NODES)
    typical = fragmentation.typical_pods(SHAPES * 19 + [demand(1234, 100, 1)], state)
    assert len(typical.prob) == 3  # the rare shape falls outside 95%
    assert typical.milli.tolist() == [1000, 500, 0] and typical.prob.sum() == pytest.approx(1.0)


def test_fragment_tracker_matches_the_definition_as_pods_are_bound() -> None:
    state = ClusterState(NODES)
    typical = fragmentation.typical_pods(SHAPES, state)
    tracker = fragmentation.FragmentTracker(state, typical)
    # An empty cluster: CPU-only shapes see every idle GPU as fragment.
    assert tracker.fragment.sum() == pytest.approx(0.2 * 16_000)
    for node, gpus, pod in ((0, (0,), demand(4000, 700, 1)), (2, (0, 1), demand(14_000, 1000, 2)),
                            (1, (1,), demand(1000, 300, 1))):
        state.bind(node, pod, gpus)
        tracker.refresh(state, node)
        assert tracker.fragment == pytest.approx(brute_force_fragment(state, typical))


@pytest.mark.parametrize("seed", range(5))
def test_fgd_picks_the_steepest_fragment_descent(seed: int) -> None:
    """The vectorized FGD equals trying every node and GPU by hand and keeping the best score."""
    rng = np.random.default_rng(seed)
    state = ClusterState(NODES * 3)
    typical = fragmentation.typical_pods(SHAPES, state)
    for n in range(state.size):  # a random partly used cluster
        state.gpu_left[n, : state.gpu_count[n]] = rng.choice([0, 200, 500, 800, 1000], size=state.gpu_count[n])
        state.cpu_used[n] = rng.integers(0, state.cpu_cap[n] // 2)
    tracker = fragmentation.FragmentTracker(state, typical)
    fgd = reference.FragmentationGradientDescent(np.arange(state.size))
    for pod in (demand(2000, 500, 1), demand(4000, 1000, 1), demand(8000), demand(1000, 1000, 2)):
        feasible = np.flatnonzero(state.fits(pod))
        node, gpus = fgd.place(state, pod, feasible, rng, tracker)
        best = {}
        for n in feasible:
            options = ([g for g in range(state.max_gpus) if state.gpu_left[n, g] >= pod.milli_per_gpu]
                       if pod.shares_gpu else [None])
            for g in options:
                after = ClusterState(NODES * 3)
                after.gpu_left[:], after.cpu_used[:] = state.gpu_left, state.cpu_used
                after.bind(n, pod, (g,) if g is not None else after.first_free(n, pod.num_gpu))
                drop = tracker.fragment[n] - brute_force_fragment(after, typical)[n]
                best[(n, g)] = int(100 / (1 + np.exp(-drop / 1000)))
        top = max(best.values())
        assert best[(node, gpus[0] if pod.shares_gpu else None)] == top
        assert node == min(n for (n, _), s in best.items() if s == top)  # ties: first in the run's node order


def test_bestfit_prefers_the_tightest_node_and_the_fullest_gpu() -> None:
    state = ClusterState(NODES)
    state.gpu_left[0, :] = [1000] * 7 + [600]
    state.gpu_left[3, :4] = [1000, 1000, 1000, 600]
    pod = demand(2000, 500, 1)
    node, gpus = reference.BestFit(np.arange(4)).place(state, pod, np.flatnonzero(state.fits(pod)), None, None)
    assert (node, gpus) == (2, (0,))  # the small P100 node leaves least cpu and GPU behind
    node, gpus = reference.BestFit(np.arange(4)).place(state, pod, np.array([0, 3]), None, None)
    assert (node, gpus) == (3, (3,))


def test_random_stays_within_the_feasible_nodes() -> None:
    state = ClusterState(NODES)
    rng = np.random.default_rng(1)
    chosen = {reference.RandomFit(np.arange(4)).place(state, demand(2000, 1000, 4), np.array([0, 3]), rng, None)[0]
              for _ in range(50)}
    assert chosen == {0, 3}


def test_inflation_samples_with_replacement_up_to_the_target_and_keeps_every_original_pod() -> None:
    pods = tuple(TracePod(f"p{i:02d}", 1000, 1, 1, 1000 if i % 3 else 400) for i in range(30))
    order = arrival.arrival_order(pods, 20_000, seed=5, tune=1.3)
    assert sorted(order[:30]) == list(range(30))
    total = sum(pods[i].gpu_request_milli for i in order)
    assert 26_000 - 1000 < total <= 26_000
    assert order == arrival.arrival_order(pods, 20_000, seed=5, tune=1.3)
    assert order != arrival.arrival_order(pods, 20_000, seed=6, tune=1.3)
    cut = arrival.arrival_order(pods, 10_000, seed=5, tune=1.3)
    assert sum(pods[i].gpu_request_milli for i in cut) <= 13_000 and len(set(cut)) == len(cut)
