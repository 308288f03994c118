"""What one timeline run measured (``TimelineResult``) and the recorder that integrates it over time.

Every level is held constant between two events and integrated exactly (a time average, not a mean
of samples); the curves for the plot are the levels at ``GRID`` evenly spaced instants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from webhook.replay.stream import Stream

GRID = 241
LEVELS = ("allocation", "pending", "fragment", "running")


@dataclass(frozen=True)
class TimelineResult:
    """One arm and seed in time. Percentages are of GPU capacity; seconds are the replay's."""

    arm: str
    seed: int
    workload: str
    world: str
    load: float
    window: float
    scale: float
    times: np.ndarray
    allocation: np.ndarray
    pending: np.ndarray
    fragment: np.ndarray
    means: dict[str, float]
    """Time averages: allocation, pending (GPU demand of waiting pods), fragment, offered (what would
    run if every pod were placed on arrival), running (GPU pods bound, a count)."""
    waits: np.ndarray
    """Seconds from submission to bind of every GPU pod submitted; a pod still waiting at the end
    counts what it waited so far (``waiting_at_end`` of them)."""
    waiting_at_end: int
    submitted: int
    warm: int
    moves: int = 0
    lost_gpu_hours: float = 0.0
    """GPU-hours the moved pods had run, lost when they restart elsewhere."""
    refused: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def wait(self, quantile: float) -> float:
        return float(np.quantile(self.waits, quantile)) if len(self.waits) else 0.0

    @property
    def moves_per_hour_share(self) -> float:
        """Moves per hour as a % of the running GPU pods (time-averaged)."""
        running = self.means.get("running", 0.0)
        if not running or not self.window:
            return 0.0
        return 100.0 * self.moves / (self.window / 3600.0) / running


class Recorder:
    """Integrates the cluster's levels between events and keeps the waits."""

    def __init__(self, capacity_milli: int) -> None:
        self.capacity = capacity_milli
        self.sums = dict.fromkeys(LEVELS, 0.0)
        self.grid = np.zeros(0)
        self.samples: dict[str, list[float]] = {name: [] for name in LEVELS}
        self.opened: dict[int, float] = {}
        self.waits: list[float] = []
        self.offered: list[tuple[float, float, int]] = []

    def start(self, window: float) -> None:
        self.grid = np.linspace(0.0, window, GRID)

    def levels(self, timeline: Any) -> dict[str, float]:
        return {"allocation": 100.0 * timeline.state.used_milli / self.capacity,
                "pending": 100.0 * timeline.pending_milli / self.capacity,
                "fragment": 100.0 * timeline.fragment() / self.capacity,
                "running": float(timeline.running_gpu_pods)}

    def hold(self, timeline: Any, until: float) -> None:
        """The levels held from the timeline's clock to ``until``."""
        now = timeline.now
        levels = self.levels(timeline)
        for name, value in levels.items():
            self.sums[name] += value * (until - now)
        filled = len(self.samples["allocation"])
        while filled < len(self.grid) and self.grid[filled] < until:
            for name, value in levels.items():
                self.samples[name].append(value)
            filled += 1

    def submitted(self, timeline: Any, uid: int, *, offered: bool = True) -> None:
        """A pod was submitted; ``offered``: it is the stream's (a moved pod's replacement is not: the
        offered load is the same in every arm)."""
        pod = timeline.live[uid]
        milli = timeline.trace.pods[pod.index].gpu_request_milli
        if milli:
            self.opened[uid] = timeline.now
            if offered:
                self.offered.append((timeline.now, pod.life, milli))

    def bound(self, timeline: Any, uid: int) -> None:
        since = self.opened.pop(uid, None)
        if since is not None:
            self.waits.append(timeline.now - since)

    def left(self, timeline: Any, pod: Any) -> None:
        """A bound pod left (nothing to record yet: its wait was counted when it was bound)."""

    def result(self, timeline: Any, found: Stream, *, seconds: float) -> TimelineResult:
        window = max(found.window, 1e-9)
        for name, series in self.samples.items():
            last = self.levels(timeline)[name]
            series.extend([last] * (len(self.grid) - len(series)))
        means = {name: total / window for name, total in self.sums.items()}
        means["offered"] = 100.0 * sum(milli * min(life, window - at) for at, life, milli in self.offered) \
            / window / self.capacity
        censored = [timeline.now - since for since in self.opened.values()]
        rebalancer = timeline.rebalancer
        spec = timeline.spec
        return TimelineResult(
            arm=spec.run.arm, seed=spec.run.seed, workload=timeline.trace.workload, world=timeline.world.sharing,
            load=spec.load, window=found.window, scale=found.scale, times=self.grid,
            allocation=np.array(self.samples["allocation"]), pending=np.array(self.samples["pending"]),
            fragment=np.array(self.samples["fragment"]), means=means,
            waits=np.array(self.waits + censored), waiting_at_end=len(censored), submitted=len(found.submissions),
            warm=found.warm, moves=rebalancer.moves if rebalancer else 0,
            lost_gpu_hours=rebalancer.lost_gpu_hours if rebalancer else 0.0,
            refused=dict(rebalancer.refused) if rebalancer else {}, seconds=seconds)
