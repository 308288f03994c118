"""The extender's fragment measure is FGD's: the same numbers as the replay's reference (numpy) measure."""

from __future__ import annotations

import random

import numpy as np
import pytest

from webhook.kube.demand import PodDemand
from webhook.placement.fragment import Fragmenter, fgd_points
from webhook.placement.inputs import NodeView
from webhook.placement.shapes import Shape, ShapeMix, ShapeWindow, distance
from webhook.replay import workload
from webhook.replay.cluster import ClusterState
from webhook.replay.fragmentation import node_fragment, shape_stats, typical_pods
from webhook.replay.records import NodeRecord

NODES = (NodeRecord("g2", 96_000, 393_216, 8, "G2"), NodeRecord("t4", 104_000, 524_288, 2, "T4"),
         NodeRecord("p100", 16_000, 122_880, 2, "P100"), NodeRecord("v100", 32_000, 131_072, 4, "V100M16"))
# (cpu, milli, gpus, models) rows with repeats, so the 95% cut keeps some and drops others.
ROWS = ([(4000, 1000, 1, ())] * 30 + [(8000, 470, 1, ())] * 20 + [(2000, 0, 0, ())] * 15
        + [(16_000, 1000, 2, ("T4",))] * 10 + [(6000, 810, 1, ("P100", "V100M16"))] * 10
        + [(64_000, 1000, 8, ())] * 3 + [(1000, 250, 1, ())] * 1)


def replay_demand(cpu: int, milli: int, gpus: int, models: tuple[str, ...]) -> PodDemand:
    return PodDemand.of_gpus(gpus, milli, cpu=cpu, cpu_score=cpu, products=frozenset(models))


def placement_demand(cpu: int, milli: int, gpus: int, models: tuple[str, ...]) -> PodDemand:
    products = frozenset(workload.product_of(m) for m in models)
    if gpus == 1 and milli < 1000:
        return PodDemand(cpu=cpu, share_milli=milli, products=products)
    return PodDemand(cpu=cpu, gpus=gpus, products=products)


def test_the_mix_is_fgds_typical_pods() -> None:
    state = ClusterState(NODES)
    typical = typical_pods([replay_demand(*row) for row in ROWS], state)
    mix = ShapeMix.from_demands([placement_demand(*row) for row in ROWS])
    assert [(s.cpu, s.milli, s.gpus) for s in mix.shapes] == list(zip(typical.cpu.tolist(), typical.milli.tolist(),
                                                                      typical.num.tolist(), strict=True))
    assert mix.weights == pytest.approx(typical.prob.tolist())


@pytest.mark.parametrize("seed", range(6))
def test_fragment_and_delta_equal_the_replays_reference_measure(seed: int) -> None:
    rng = random.Random(seed)
    state = ClusterState(NODES)
    typical = typical_pods([replay_demand(*row) for row in ROWS], state)
    fragmenter = Fragmenter(ShapeMix.from_demands([placement_demand(*row) for row in ROWS]))
    for index, node in enumerate(NODES):
        left = [rng.choice([0, 30, 190, 500, 530, 1000, 1000]) for _ in range(node.gpus)]
        state.gpu_left[index, :node.gpus] = left
        cpu_left = rng.choice([0, 1000, 4000, 7000, 16_000, node.cpu_milli])
        state.cpu_used[index] = node.cpu_milli - cpu_left
        view = NodeView(name=node.name, cpu=node.cpu_milli, product=workload.product_of(node.model), gpus=node.gpus,
                        cpu_requested=node.cpu_milli - cpu_left, left=tuple(left))
        count, small = shape_stats(state.gpu_left[index:index + 1], typical)
        expected = node_fragment(count, small, state.gpu_left[index:index + 1].sum(axis=1),
                                 state.cpu_left[index:index + 1], typical.access[index:index + 1], typical)[0]
        got = fragmenter.fragment(view.product, view.signature, fragmenter.cpu_class(view.cpu_left))
        assert got == pytest.approx(expected)
        for cpu, milli, gpus, _ in ROWS[::7]:
            demand = placement_demand(cpu, milli, gpus, ())
            after = view.bind("pod", demand)
            if after.left == view.left and demand.uses_devices or after.cpu_left < 0:
                assert fragmenter.delta(view.product, view.signature, view.cpu_left, cpu, demand.gpus,
                                        demand.share_milli) is None
                continue
            delta = fragmenter.delta(view.product, view.signature, view.cpu_left, cpu, demand.gpus,
                                     demand.share_milli)
            assert delta == pytest.approx(fragmenter.fragment(after.product, after.signature,
                                                              fragmenter.cpu_class(after.cpu_left)) - got)


def test_fgd_points_are_the_artifacts_sigmoid() -> None:
    for delta in (-8000.0, -470.0, 0.0, 250.0, 5000.0, 10**9):
        assert fgd_points(delta) == int(np.trunc(100.0 / (1.0 + np.exp(min(delta, 700_000) / 1000.0))))
    assert fgd_points(0.0) == 50 and fgd_points(-10_000.0) == 99 and fgd_points(10_000.0) == 0


def test_the_window_takes_a_new_mix_only_when_it_moved() -> None:
    window = ShapeWindow(size=100, refresh=10, tolerance=0.1)
    a, b = Shape(1000), Shape(2000, 1000, 1)
    rebuilt = [window.add(a) for _ in range(50)]
    assert rebuilt[0] and not any(rebuilt[1:])          # the same single shape: no new mix
    rebuilt = [window.add(b) for _ in range(50)]
    assert any(rebuilt) and distance(window.mix(), ShapeMix((a, b), (0.5, 0.5))) <= 0.1
    assert len(window) == 100 and window.add(None) is False


def test_shapes_a_node_cannot_take_count_its_idle_gpus_as_fragment() -> None:
    """A time-sliced node (only ``nvidia.com/gpu.shared``) takes shares only, a plain one whole GPUs
    only: the other kind's shapes see all of its idle GPUs as fragment, as a shape pinned to
    another product does, and a share filling a slot no whole-GPU shape could use costs nothing."""
    mix = ShapeMix(shapes=(Shape(4000, 1000, 1), Shape(2000, 250, 1)), weights=(0.5, 0.5))
    fragmenter = Fragmenter(mix, "packed")
    started, empty = (1000, 750), (1000, 1000)  # one slot taken on a GPU; nothing taken
    cpu_class = fragmenter.cpu_class(32_000)
    assert fragmenter.fragment("T4", started, cpu_class, "any") == 0.5 * 750
    assert fragmenter.fragment("T4", started, cpu_class, "shares") == 0.5 * 1750
    assert fragmenter.fragment("T4", started, cpu_class, "whole") == 0.5 * 750 + 0.5 * 1750
    # A share on a sliced node: no whole-GPU shape can use it, so starting a GPU costs no more than
    # filling a started one; the measure that ignored it kept the empty GPU for whole-GPU shapes.
    on = {signature: fragmenter.delta("T4", signature, 32_000, 2000, 0, 250, serves="shares")
          for signature in (started, empty)}
    assert on[started] == on[empty] == -0.5 * 250
    assert fragmenter.delta("T4", empty, 32_000, 2000, 0, 250) == 0.5 * 750


def test_a_share_only_node_counts_the_slots_its_cpu_cannot_serve() -> None:
    """FGD asks whether one share still fits; a time-sliced node has four slots a GPU and runs out of
    cpu first, so its fragment also counts the free slots beyond what its cpu carries at the mix's
    mean cpu per share (here 6 cores). A node that takes whole GPUs or either kind (every DRA device)
    is measured as before."""
    mix = ShapeMix(shapes=(Shape(3000, 250, 1), Shape(9000, 250, 1), Shape(4000, 1000, 1)), weights=(0.25, 0.25, 0.5))
    fragmenter = Fragmenter(mix, "packed")
    full = (1000, 1000)                                       # 8 free slots
    assert fragmenter.slot_need("T4") == (6000.0, ((250, 0.5), (250, 0.5)))
    assert fragmenter.stranded("T4", full, 48_000) == 0.0     # 48 cores carry 8 shares of 6
    assert fragmenter.stranded("T4", full, 24_000) == 4 * 250  # 24 cores carry 4: 4 slots left over
    # A CPU pod of 12 cores on a node whose cpu carries its slots exactly strands two of them; the
    # same pod on a node that takes either kind changes nothing FGD reads.
    assert fragmenter.delta("T4", full, 48_000, 12_000, 0, 0, serves="shares") == 2 * 250
    assert fragmenter.delta("T4", full, 48_000, 12_000, 0, 0, serves="any") == 0.0
    # A large share strands slots where cpu is short and nothing where it is plenty; a small one
    # frees some where cpu is short.
    def share(cpu_left: int, cpu: int) -> float:
        found = fragmenter.delta("T4", full, cpu_left, cpu, 0, 250, serves="shares")
        assert found is not None
        return found

    assert share(24_000, 9000) > share(96_000, 9000) and share(24_000, 3000) < share(96_000, 3000)
    # Scored from the exact cpu, not its class among the mix's thresholds.
    assert fragmenter.points("T4", full, 48_000, 12_000, 0, 0, serves="shares") == fgd_points(500) < \
        fragmenter.points("T4", full, 96_000, 12_000, 0, 0, serves="shares")
