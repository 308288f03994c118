"""Pacing of node writes, pure: the token bucket and the per-node write schedule."""

from __future__ import annotations

import pytest

from webhook.balancer.backoff import TokenBucket, WriteSchedule


class TestTokenBucket:
    def test_a_full_bucket_lets_a_burst_through_then_spaces_calls_at_the_rate(self) -> None:
        bucket = TokenBucket(rate=5.0, burst=10)
        waits = [bucket.reserve(100.0) for _ in range(12)]
        assert waits[:10] == [0.0] * 10
        assert waits[10:] == pytest.approx([0.2, 0.4])  # client-go's 5 QPS, burst 10

    def test_tokens_come_back_at_the_rate_up_to_the_burst(self) -> None:
        bucket = TokenBucket(rate=5.0, burst=10)
        for _ in range(10):
            bucket.reserve(0.0)
        assert bucket.reserve(1.0) == 0.0          # 5 tokens back after a second
        assert bucket.reserve(1000.0) == 0.0
        assert [bucket.reserve(1000.0) for _ in range(10)][-1] == pytest.approx(0.2)  # never more than burst

    def test_callers_on_many_threads_queue_one_behind_the_other(self) -> None:
        bucket = TokenBucket(rate=100.0, burst=1)
        assert [round(bucket.reserve(0.0), 3) for _ in range(4)] == [0.0, 0.01, 0.02, 0.03]


class TestWriteSchedule:
    def test_the_latest_wanted_value_wins_and_the_first_write_is_due_at_once(self) -> None:
        schedule: WriteSchedule[str] = WriteSchedule(interval=10.0)
        schedule.want("gpu-1", "free=6", urgent=False)
        schedule.want("gpu-1", "free=5", urgent=False)
        assert schedule.due(0.0) == ["gpu-1"]
        assert schedule.take("gpu-1") == "free=5"
        assert schedule.coalesced == 1
        assert schedule.due(0.0) == []                 # busy: never handed out twice

    def test_a_node_is_written_at_most_once_per_interval_unless_urgent(self) -> None:
        schedule: WriteSchedule[str] = WriteSchedule(interval=10.0)
        schedule.want("gpu-1", "free=6", urgent=False)
        schedule.due(0.0)
        schedule.written("gpu-1", "free=6", 0.0)
        schedule.want("gpu-1", "free=5", urgent=False)
        assert schedule.due(9.9) == [] and schedule.next_at() == 10.0
        schedule.want("gpu-1", "free=4", urgent=False)
        assert schedule.due(10.0) == ["gpu-1"] and schedule.take("gpu-1") == "free=4"
        schedule.written("gpu-1", "free=4", 10.0)
        schedule.want("gpu-1", "marks=gone", urgent=True)   # an urgent change (marks.urgent) does not wait
        assert schedule.due(10.1) == ["gpu-1"]

    def test_a_value_that_changed_while_it_was_sent_stays_pending(self) -> None:
        schedule: WriteSchedule[str] = WriteSchedule(interval=10.0)
        schedule.want("gpu-1", "a", urgent=False)
        schedule.due(0.0)
        sent = schedule.take("gpu-1")
        schedule.want("gpu-1", "b", urgent=False)
        schedule.written("gpu-1", sent, 0.5)
        assert schedule.pending() == 1 and schedule.next_at() == 10.5

    def test_failures_retry_no_earlier_than_asked_and_urgent_nodes_go_first(self) -> None:
        schedule: WriteSchedule[str] = WriteSchedule(interval=10.0)
        schedule.want("gpu-2", "x", urgent=False)
        schedule.want("gpu-1", "y", urgent=False)
        schedule.want("gpu-3", "z", urgent=True)
        assert schedule.due(0.0) == ["gpu-3", "gpu-1", "gpu-2"]
        schedule.failed("gpu-1", retry_at=3.0)          # e.g. a 429 with Retry-After: 3
        schedule.release("gpu-2")                       # not sent: this replica stopped leading
        assert schedule.due(1.0) == ["gpu-2"]
        assert schedule.due(3.0) == ["gpu-1"]

    def test_dropped_and_forgotten_nodes_leave_nothing_pending(self) -> None:
        schedule: WriteSchedule[str] = WriteSchedule(interval=10.0)
        schedule.want("gpu-1", "x", urgent=True)
        schedule.drop("gpu-1")
        schedule.want("gpu-2", "x", urgent=False)
        schedule.forget("gpu-2")
        assert schedule.pending() == 0 and schedule.next_at() is None

    def test_a_first_labelling_of_5000_nodes_hands_each_out_once_urgent_first(self) -> None:
        schedule: WriteSchedule[str] = WriteSchedule(interval=10.0)
        names = [f"gpu-{i:05d}" for i in range(5000)]
        for name in reversed(names):
            schedule.want(name, "free=8", urgent=name.endswith("7"))
            schedule.want(name, "free=7", urgent=False)  # a second look before the pass: stale heap entries
        due = schedule.due(0.0)
        urgent = [name for name in names if name.endswith("7")]
        assert due == urgent + [name for name in names if not name.endswith("7")]
        assert schedule.due(0.0) == [] and schedule.pending() == 5000
