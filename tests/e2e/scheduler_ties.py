"""How kube-scheduler v1.36.3 broke ties, read back from its own log at ``--v=10``.

The replay's model picks uniformly at random among the nodes with the best total, which is what
kube-scheduler intends: ``prioritizeNodes`` gives each node a ``Randomizer`` and the heap that
picks the host (pkg/scheduler/schedule_one.go, ``nodeScoreHeap.Less``) orders equal totals by it.
In v1.36.3 the Randomizer is set only for nodes an extender scored (KEP 5598's change, kubernetes
PR #135231; PR #141024 proposes setting it for every node). Without an extender every Randomizer
is 0, ``heap.Init`` leaves equal totals where the list put them, and the host is whichever tied
node the heap brings to the top of the scored list. That list is in the order the parallel filter
finished nodes, which is roughly the scheduler's node list order with jitter, so ties lean
towards nodes early in that list rather than falling uniformly.

``python benchmarks/replay_vs_scheduler.py --pods 288 --pod-files all --ties`` measures it on the
session's kube-scheduler (16 filter threads): at ``--v=10``, each scored pod's "Calculated node's
final score" lines give the scored list in its order and "Successfully bound pod to node" the host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from webhook.replay.kubescheduler import heap_top

_SCORE = re.compile(r'"Calculated node\'s final score for pod" pod="([^"]+)" node="([^"]+)" score=(-?\d+)')
_BOUND = re.compile(r'"Successfully bound pod to node" pod="([^"]+)" node="([^"]+)"')


@dataclass(frozen=True, slots=True)
class Scored:
    """One scheduling cycle that scored nodes: the list in the scheduler's order, and the host."""

    pod: str
    """``namespace/name``."""
    scores: tuple[tuple[str, int], ...]
    host: str | None


def cycles(lines: Iterable[str]) -> list[Scored]:
    """The scored cycles in a kube-scheduler log, in order. A pod scored again (a retry) counts once
    per cycle; a cycle whose pod was never bound keeps ``host`` None."""
    found: list[tuple[str, list[tuple[str, int]]]] = []
    hosts: dict[str, list[str]] = {}
    for line in lines:
        if (score := _SCORE.search(line)) is not None:
            pod, node, value = score.group(1), score.group(2), int(score.group(3))
            if not found or found[-1][0] != pod or any(node == seen for seen, _ in found[-1][1]):
                found.append((pod, []))
            found[-1][1].append((node, value))
        elif (bound := _BOUND.search(line)) is not None:
            hosts.setdefault(bound.group(1), []).append(bound.group(2))
    last_cycle = {pod: index for index, (pod, _) in enumerate(found)}
    return [Scored(pod, tuple(scores), hosts[pod][-1] if pod in hosts and last_cycle[pod] == index else None)
            for index, (pod, scores) in enumerate(found)]


@dataclass
class TieReport:
    """Ties among the best-scored nodes and how they fell."""

    scored: int = 0
    """Bound pods whose cycle scored two or more nodes."""
    ties: int = 0
    heap_top: int = 0
    """Hosts that are the heap's top of the scored list in logged order."""
    first_tied: int = 0
    """Hosts that are the first of the tied nodes in logged order."""
    uniform_first: float = 0.0
    """How many ``first_tied`` uniform picks would give: the sum of 1/(tied nodes)."""
    two_way: list[int] = field(default_factory=lambda: [0, 0])
    """Two-way ties: hosts that were the earlier / the later of the two in logged order."""

    def add(self, cycle: Scored) -> None:
        if cycle.host is None or len(cycle.scores) < 2:
            return
        self.scored += 1
        best = max(score for _, score in cycle.scores)
        tied = [node for node, score in cycle.scores if score == best]
        if len(tied) < 2 or cycle.host not in tied:
            return
        self.ties += 1
        self.heap_top += cycle.scores[heap_top([score for _, score in cycle.scores])][0] == cycle.host
        self.first_tied += tied[0] == cycle.host
        self.uniform_first += 1 / len(tied)
        if len(tied) == 2:
            self.two_way[tied.index(cycle.host)] += 1

    def text(self) -> str:
        if not self.scored:
            return "scored no bound pod (is it at --v=10?)"
        if not self.ties:
            return f"no ties among {self.scored} scored bound pods"
        return (f"{self.scored} scored bound pods, {self.ties} with two or more best nodes; the host was the heap's "
                f"top of the scored list {self.heap_top}/{self.ties} times, the first tied node in that list "
                f"{self.first_tied} times (uniform picks: {self.uniform_first:.0f}); two-way ties went "
                f"{self.two_way[0]}:{self.two_way[1]} to the earlier node")


def tie_report(lines: Iterable[str]) -> TieReport:
    report = TieReport()
    for cycle in cycles(lines):
        report.add(cycle)
    return report
