"""The replay in time: the stream's load, departures, waiting pods retried in order, the rebalancer's moves."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.errors import InputError
from webhook.replay import rebalancing, stream, timeline, trace
from webhook.replay.records import NodeRecord, PodTimes, Trace, TracePod
from webhook.replay.runspec import RunSpec

DAY = 86_400


def offered(found: stream.Stream, trace_: Trace) -> float:
    """The stream's time-averaged GPU demand once every repetition is counted: what ``load`` sets."""
    body = [s for s in found.submissions if s.origin == stream.STREAM]
    work = sum(trace_.pods[s.index].gpu_request_milli * max(1, trace_.times[s.index].deleted
                                                            - trace_.times[s.index].created) for s in body)
    return work / found.window / trace_.gpu_capacity_milli


class TestStream:
    def test_the_spacing_is_scaled_to_the_offered_load(self) -> None:
        synthetic = trace.synthetic(3, nodes=30)
        for load in (0.5, 1.0, 1.3):
            found = stream.build(synthetic, capacity_milli=synthetic.gpu_capacity_milli, load=load, seed=1)
            assert offered(found, synthetic) == pytest.approx(load)
        slow = stream.build(synthetic, capacity_milli=synthetic.gpu_capacity_milli, load=0.5, seed=1)
        fast = stream.build(synthetic, capacity_milli=synthetic.gpu_capacity_milli, load=1.0, seed=1)
        assert fast.window == pytest.approx(slow.window / 2)

    def test_the_stream_keeps_the_traces_order_and_starts_in_its_steady_state(self) -> None:
        synthetic = trace.synthetic(3, nodes=30)
        found = stream.build(synthetic, capacity_milli=synthetic.gpu_capacity_milli, load=1.0, seed=1)
        body = [s for s in found.submissions if s.origin == stream.STREAM]
        created = [synthetic.times[s.index].created for s in body]
        assert created == sorted(created) and len(body) == len(synthetic.pods) - found.head
        assert [s.at for s in body] == sorted(s.at for s in body) and body[-1].at == pytest.approx(found.window)
        warm = [s for s in found.submissions if s.origin == stream.WARM]
        assert len(warm) == found.warm > 0 and all(s.at == 0 for s in warm)
        # A warm copy has less left to live than its pod's whole life (it started before time 0).
        assert all(s.life <= synthetic.times[s.index].deleted - synthetic.times[s.index].created for s in warm
                   if s.life != math.inf)

    def test_the_sparse_head_is_the_standing_pods(self) -> None:
        nodes = (NodeRecord("n", 8000, 8192, 8, "T4"),)
        pods = tuple(TracePod(f"p{i}", 100, 100, 1, 1000) for i in range(5))
        times = (PodTimes(0, 10 * DAY, "Running"), PodTimes(5 * DAY, 5 * DAY + 100, "Succeeded"),
                 PodTimes(5 * DAY + 50, 5 * DAY + 500, "Succeeded"), PodTimes(5 * DAY + 60, 10 * DAY, "Running"),
                 PodTimes(5 * DAY + 90, 5 * DAY + 95, "Failed"))
        found = stream.build(Trace("t", nodes, pods, times), capacity_milli=8000, load=1.0, seed=0)
        head = [s for s in found.submissions if s.origin == stream.HEAD]
        assert [s.index for s in head] == [0] and head[0].life == math.inf  # still running at the end
        lasting = [s for s in found.submissions if s.index == 3]
        assert lasting and all(s.life == math.inf for s in lasting)

    def test_the_same_seed_gives_the_same_stream_and_another_seed_another(self) -> None:
        synthetic = trace.synthetic(3, nodes=30)
        build = lambda seed: stream.build(synthetic, capacity_milli=synthetic.gpu_capacity_milli,  # noqa: E731
                                          load=1.0, seed=seed)
        assert build(1) == build(1)
        assert build(1).submissions != build(2).submissions

    def test_a_list_without_times_borrows_the_default_lists(self) -> None:
        default = trace.synthetic(3, nodes=30)
        extra = TracePod("new", 8000, 16_384, 8, 1000)
        untimed = Trace("multigpu", default.nodes, tuple(dataclasses.replace(p, qos="") for p in default.pods[:5])
                        + (extra,))
        lent = stream.borrow(untimed, default, seed=7)
        assert lent.times[:5] == default.times[:5]
        assert [p.qos for p in lent.pods[:5]] == [p.qos for p in default.pods[:5]]
        assert lent.times[5] in default.times and lent.pods[5].qos == ""
        assert stream.borrow(untimed, default, seed=7) == lent

    def test_a_list_that_cannot_be_timed_is_refused_by_name(self) -> None:
        nodes = (NodeRecord("n", 8000, 8192, 8, "T4"),)
        with pytest.raises(InputError, match="no creation and deletion times"):
            stream.build(Trace("untimed", nodes, (TracePod("p", 1, 1, 1, 1000),)), capacity_milli=8000, load=1,
                         seed=0)
        cpu_only = Trace("cpu", nodes, (TracePod("p", 1, 1, 0, 0),), (PodTimes(0, 10),))
        with pytest.raises(InputError, match="no GPU pod"):
            stream.build(cpu_only, capacity_milli=8000, load=1, seed=0)


def tiny(pods: list[tuple[int, int, int, str]], *, nodes: int = 2, gpus: int = 4) -> Trace:
    """``pods``: (GPUs, created, life, qos); nodes of ``gpus`` GPUs each."""
    node_list = tuple(NodeRecord(f"n{i}", 64_000, 256 * 1024, gpus, "T4") for i in range(nodes))
    records = tuple(TracePod(f"p{i}", 1000, 1024, g, 1000, (), qos) for i, (g, _, _, qos) in enumerate(pods))
    times = tuple(PodTimes(c, c + life, "Succeeded") for _, c, life, _ in pods)
    return Trace("tiny", node_list, records, times)


def replay(data: Trace, submissions: list[tuple[float, int, float]], arm: str = "stock",
           window: float | None = None) -> timeline.Timeline:
    """A hand-made stream; the budget is a whole hour's pods (2% of a handful is none)."""
    spec = timeline.TimelineSpec(run=RunSpec(arm=arm, seed=1, sharing="published"),
                                 rebalance=rebalancing.Knobs(share=1.0))
    found = stream.Stream(submissions=tuple(stream.Submission(at, i, life, stream.STREAM)
                                            for at, i, life in submissions),
                          window=window or max(at for at, _, _ in submissions) + 1, scale=1.0, load=1.0, head=0,
                          warm=0)
    machine = timeline.Timeline(data, spec)
    machine.result = machine.run(found)  # type: ignore[attr-defined]
    return machine


class TestTimeline:
    def test_a_pod_that_fits_nowhere_waits_and_binds_when_room_is_freed(self) -> None:
        data = tiny([(4, 0, 100, "LS"), (4, 0, 100, "LS"), (2, 0, 100, "LS")])
        machine = replay(data, [(0, 0, 100), (0, 1, 100), (10, 2, 50)], window=400)
        result = machine.result  # type: ignore[attr-defined]
        # The third pod waits from 10 until the first two leave at 100.
        assert sorted(result.waits.tolist()) == [0.0, 0.0, 90.0] and result.waiting_at_end == 0
        assert result.means["pending"] == pytest.approx(100 * 2000 * 90 / 400 / 8000)

    def test_waiting_pods_are_tried_again_in_the_order_they_came(self) -> None:
        data = tiny([(4, 0, 10, "LS"), (4, 0, 100, "LS"), (3, 0, 100, "LS"), (2, 0, 100, "LS")])
        machine = replay(data, [(0, 0, 10), (0, 1, 100), (1, 2, 100), (2, 3, 100)], window=50)
        waits = machine.result.waits.tolist()  # type: ignore[attr-defined]
        # Node n0 frees 4 GPUs at 10: the 3-GPU pod (first in line) binds, the 2-GPU pod keeps waiting.
        assert waits[:2] == [0.0, 0.0] and waits[2] == 9.0 and machine.result.waiting_at_end == 1  # type: ignore
        assert machine.state.used_milli == 7000

    def test_a_run_is_the_same_for_a_seed(self) -> None:
        synthetic = trace.synthetic(4, nodes=30)
        spec = timeline.TimelineSpec(run=RunSpec(arm="extender", seed=3), load=1.1)
        first, second = timeline.run(synthetic, spec), timeline.run(synthetic, spec)
        assert first.means == second.means and np.array_equal(first.waits, second.waits)
        assert np.array_equal(first.allocation, second.allocation)

    def test_arms_outside_the_kube_scheduler_model_are_refused(self) -> None:
        with pytest.raises(InputError, match="kube-scheduler arms"):
            timeline.Timeline(tiny([(1, 0, 1, "LS")]), timeline.TimelineSpec(run=RunSpec(arm="fgd", seed=1)))


class TestRebalancer:
    """Two 4-GPU nodes: two 3-GPU pods leave at 100 and each left a best-effort 1-GPU pod behind, so
    at 400 a 4-GPU pod finds 3 free GPUs on each node and fits nowhere; one move frees a node."""

    PODS = [(3, 0, 100, "LS"), (3, 0, 100, "LS"), (1, 0, 10_000, "BE"), (1, 0, 10_000, "BE"), (4, 0, 10_000, "LS")]
    AT = [(0, 0, 100), (0, 1, 100), (1, 2, 10_000), (1, 3, 10_000), (400, 4, 10_000)]

    def test_stock_leaves_the_big_pod_waiting(self) -> None:
        machine = replay(tiny(self.PODS), self.AT, window=2000)
        assert machine.result.waiting_at_end == 1  # type: ignore[attr-defined]

    def test_one_move_lets_it_bind_and_the_replacement_lands_on_the_other_node(self) -> None:
        machine = replay(tiny(self.PODS), self.AT, arm="extender+rebalancer", window=2000)
        result, rebalancer = machine.result, machine.rebalancer  # type: ignore[attr-defined]
        assert rebalancer is not None and result.moves == 1 and result.waiting_at_end == 0
        [(evicted, left, replacement)] = rebalancer.moved
        assert evicted in (2, 3) and rebalancer.landed[replacement] != left
        # It waited the threshold, then the first round after it: 400 + 60, rounded up to 30 s rounds.
        assert sorted(result.waits.tolist())[-1] == pytest.approx(80.0)
        assert result.lost_gpu_hours == pytest.approx((480 - 1) / 3600)

    def test_without_room_for_the_replacement_nothing_moves(self) -> None:
        # A third 1-GPU LS pod takes the free GPUs' last place: no node keeps room for a replacement.
        pods = self.PODS[:4] + [(3, 0, 10_000, "LS"), (4, 0, 10_000, "LS")]
        at = self.AT[:4] + [(200, 4, 10_000), (400, 5, 10_000)]
        machine = replay(tiny(pods), at, arm="extender+rebalancer", window=2000)
        assert machine.result.moves == 0  # type: ignore[attr-defined]

    def test_pods_the_policy_does_not_mark_never_move(self) -> None:
        pods = [(g, c, life, "LS") for g, c, life, _ in self.PODS]
        machine = replay(tiny(pods), self.AT, arm="extender+rebalancer", window=2000)
        assert machine.result.moves == 0 and machine.result.waiting_at_end == 1  # type: ignore[attr-defined]


def test_moved_pods_never_land_back_and_the_budget_holds_on_a_synthetic_cluster() -> None:
    synthetic = trace.synthetic(42, nodes=60)
    spec = timeline.TimelineSpec(run=RunSpec(arm="extender+rebalancer", seed=42), load=0.9)
    machine = timeline.Timeline(synthetic, spec)
    found = stream.build(synthetic, capacity_milli=synthetic.gpu_capacity_milli, load=0.9, seed=42)
    result = machine.run(found)
    rebalancer = machine.rebalancer
    assert rebalancer is not None and result.moves > 0
    assert all(rebalancer.landed.get(replacement, -1) != left for _, left, replacement in rebalancer.moved)
    # Never more than 2% of the running GPU pods in any hour (the budget is taken when a round starts).
    assert result.moves <= 0.02 * result.means["running"] * max(1.0, result.window / 3600) + 1


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.3, 1.5))
def test_a_synthetic_run_keeps_its_books(seed: int, load: float) -> None:
    """Whatever the seed and load: allocation never above capacity, pending never negative, every GPU
    pod's wait within the window, the budget never exceeded."""
    synthetic = trace.synthetic(seed, nodes=12)
    spec = timeline.TimelineSpec(run=RunSpec(arm="extender+rebalancer", seed=seed), load=load)
    result = timeline.run(synthetic, spec)
    assert 0 <= result.allocation.min() and result.allocation.max() <= 100 + 1e-9
    assert result.pending.min() >= 0
    assert result.waits.min() >= 0 and result.waits.max() <= result.window + 1e-6
