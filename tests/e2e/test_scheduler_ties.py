"""Reading kube-scheduler's ties back from its log (tests/e2e/scheduler_ties.py); no cluster needed."""

from __future__ import annotations

import pytest

from tests.e2e.scheduler_ties import Scored, cycles, tie_report


def _score(pod: str, node: str, score: int) -> str:
    return (f'I1206 06:14:51.502177   18591 schedule_one.go:1050] "Calculated node\'s final score for pod" '
            f'pod="{pod}" node="{node}" score={score}')


def _bound(pod: str, node: str) -> str:
    return (f'I1206 06:14:51.555597   18591 schedule_one.go:481] "Successfully bound pod to node" pod="{pod}" '
            f'node="{node}" evaluatedNodes=3 feasibleNodes=3')


def test_cycles_pair_each_scored_list_with_the_host_and_split_a_retry() -> None:
    lines = [_score("ns/p1", "a", 10), _score("ns/p1", "b", 20), "an unrelated line", _bound("ns/p1", "b"),
             _score("ns/p2", "a", 3), _score("ns/p2", "b", 3),  # not bound: retried
             _score("ns/p2", "a", 4), _score("ns/p2", "b", 3), _bound("ns/p2", "a")]
    assert cycles(lines) == [Scored("ns/p1", (("a", 10), ("b", 20)), "b"),
                             Scored("ns/p2", (("a", 3), ("b", 3)), None),
                             Scored("ns/p2", (("a", 4), ("b", 3)), "a")]


def test_the_report_counts_ties_and_which_of_them_won() -> None:
    lines = [_score("ns/p1", "a", 7), _score("ns/p1", "b", 7), _bound("ns/p1", "a"),
             _score("ns/p2", "a", 7), _score("ns/p2", "b", 7), _bound("ns/p2", "b"),
             _score("ns/p3", "a", 1), _score("ns/p3", "b", 7), _bound("ns/p3", "b"),  # no tie
             _score("ns/p4", "a", 2), _score("ns/p4", "b", 5), _score("ns/p4", "c", 5), _bound("ns/p4", "c")]
    report = tie_report(lines)
    assert (report.ties, report.two_way) == (3, [1, 2])
    # p1's host is the heap's top (a); p2's is not (a is); p4's is not: heap.Init takes the left child b of two
    # equal ones over a, so b is on top and c, the host, is not.
    assert report.heap_top == 1
    assert report.first_tied == 1 and report.uniform_first == pytest.approx(1.5)
    assert report.scored == 4 and "4 scored bound pods, 3 with two or more" in report.text()
    assert "1:2 to the earlier node" in report.text()
    assert tie_report(lines[6:9]).text() == "no ties among 1 scored bound pods"
    assert tie_report(["nothing at --v=2"]).text() == "scored no bound pod (is it at --v=10?)"
