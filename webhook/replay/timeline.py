"""``gpugate replay --timeline``: one arm and seed replayed in time, pods leaving and waiting.

The seed's submissions come from ``replay.stream`` (the trace's order and spacing, scaled to the
offered load, starting in its steady state). Each pod is scheduled by the arm's kube-scheduler
model when it is submitted (``runner.KubePlacer``, the extender's profile for the extender arms);
once bound it stays its life, then leaves. A pod that fits nowhere waits, and is tried again, in
submission order as kube-scheduler's queue pops equal-priority pods, whenever a node it could now
fit on changes: a pod left it, or a rebalancer's mark came off it. Only a changed node can turn a
pod that fits nowhere into one that fits somewhere, so asking those nodes first (``cluster.
ClusterState.fits_node``) changes no decision; it saves scheduling pods that would fail again.

With the rebalancer (``replay.rebalancing``), every ``interval`` seconds the balancer's decision
(``webhook.placement.moves``) may evict movable pods for a pod that has waited; their replacements
are submitted at once and the nodes they left are marked, as the balancer marks them.

Measures (``TimelineResult``): time-averaged GPU allocation, pending GPU demand (the trace's GPU
request of waiting pods), offered demand (what would run if every pod were placed on arrival) and
FGD's fragmentation, in % of GPU capacity; the wait of every GPU pod from submission to bind (a pod
still waiting at the end counts what it waited so far); moves and the GPU-hours they cost.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np

from webhook.errors import InputError
from webhook.kube.demand import PodDemand
from webhook.replay import arms as arm_table
from webhook.replay import rebalancing, stream
from webhook.replay.fragmentation import FragmentTracker, typical_pods
from webhook.replay.kubescheduler import Taint
from webhook.replay.records import Trace
from webhook.replay.runner import KubePlacer, record_demand
from webhook.replay.runspec import DRA, RunSpec
from webhook.replay.timelineresult import Recorder, TimelineResult
from webhook.replay.worlds import World

DEPART, UNMARK, TICK = 0, 1, 2


@dataclass(frozen=True, slots=True)
class TimelineSpec:
    """One timeline run: the arm's placement settings, the offered load, the rebalancer's knobs."""

    run: RunSpec
    load: float = 1.0
    rebalance: rebalancing.Knobs = rebalancing.Knobs()


@dataclass(slots=True)
class Live:
    """A submitted pod: which trace pod, when, how long it stays, and where it is once bound."""

    index: int
    submitted: float
    life: float
    node: int = -1
    devices: tuple[int, ...] = ()
    started: float = math.nan
    demand: PodDemand | None = None


class Timeline:
    """The run's cluster, scheduler and queue; ``run`` replays a ``stream.Stream`` once."""

    def __init__(self, trace: Trace, spec: TimelineSpec) -> None:
        arm = arm_table.BY_NAME.get(spec.run.arm)
        if arm is None or arm.kind != "kube":
            kube = ", ".join(arm_table.KUBE_ARMS)
            raise InputError(f"--timeline replays the kube-scheduler arms ({kube}), not {spec.run.arm!r}")
        if spec.run.sharing == DRA:
            raise InputError("--timeline replays the timeslice and published worlds, not dra")
        self.trace, self.spec = trace, spec
        self.world = World(trace, arm.world or spec.run.sharing, spec.run)
        self.cluster = self.world.cluster(trace)
        self.state = self.cluster.state
        self.fits_demand = [record_demand(record, self.world.slot) for record in trace.pods]
        self.tracker = FragmentTracker(self.state, typical_pods(self.fits_demand, self.state))
        self.placer = KubePlacer(arm, spec.run, trace, self.world, self.cluster,
                                 np.random.default_rng((spec.run.seed, 1)))
        self.rebalancer = rebalancing.ReplayRebalancer(self, spec.rebalance) if arm.rebalancer else None
        # The balancer's labels reach the scheduler only through a policy's preferred terms and the
        # congested taint: an arm with neither never reads them, so they are not kept up to date.
        self.relabel = arm.policies or spec.run.taint_congested
        self.stale: set[int] = set()
        """Nodes whose fragment is to be measured again before it is next read."""
        self.live: dict[int, Live] = {}
        self.waiting: dict[PodDemand, set[int]] = {}
        self.events: list[tuple[float, int, int]] = []
        self.changed: set[int] = set()
        self.marks: dict[int, tuple[list[int], Taint]] = {}
        self.mark_serial = 0
        self.now = 0.0
        self.next_uid = 0
        self.pending_milli = 0
        """The trace's GPU request of the pods waiting, in thousandths."""
        self.running_gpu_pods = 0
        self.recorder = Recorder(self.state.capacity_milli)

    # --- the loop ---------------------------------------------------------------------------
    def run(self, found: stream.Stream) -> TimelineResult:
        started = time.perf_counter()
        self.recorder.start(found.window)
        submissions = found.submissions
        self.next_uid = len(submissions)
        if self.rebalancer is not None:
            heapq.heappush(self.events, (self.spec.rebalance.interval, TICK, -1))
        position = 0
        while True:
            next_submit = submissions[position].at if position < len(submissions) else math.inf
            next_event = self.events[0][0] if self.events else math.inf
            at = min(next_submit, next_event)
            if at > found.window:
                break
            self._advance(at)
            if next_event <= next_submit:
                _, kind, uid = heapq.heappop(self.events)
                if kind == DEPART:
                    self._depart(uid)
                    continue
                if kind == UNMARK:
                    self._unmark(uid)
                    continue
                self._flush()
                self._tick()
                continue
            self._flush()
            self._submit(position, submissions[position])
            position += 1
        self._advance(found.window)
        return self.recorder.result(self, found, seconds=time.perf_counter() - started)

    def _advance(self, at: float) -> None:
        """Count the time up to ``at`` with the cluster as it is, then move the clock."""
        if at > self.now:
            self._flush()
            self.recorder.hold(self, at)
            self.now = at

    def _flush(self) -> None:
        """After the departures of one instant: try the waiting pods a changed node may now take."""
        if self.changed:
            changed, self.changed = sorted(self.changed), set()
            self.retry(changed)

    # --- pods -------------------------------------------------------------------------------
    def _submit(self, position: int, submission: stream.Submission) -> None:
        uid = position
        self.live[uid] = Live(index=submission.index, submitted=self.now, life=submission.life)
        self.recorder.submitted(self, uid)
        self.attempt(uid, learn=True)

    def attempt(self, uid: int, *, learn: bool = False, view: object = None) -> bool:
        """Schedule a submitted or waiting pod; True when it was bound."""
        pod = self.live[uid]
        placement = self.placer.place(pod.index, uid, learn=learn, pod_view=view)  # type: ignore[arg-type]
        if placement is None:
            if self.placer.views.get(pod.index) is None:  # denied by the webhook: never waits
                del self.live[uid]
                return False
            self._wait(uid)
            return False
        node, devices = placement
        demand = self.placer.bound(pod.index)
        self.state.bind(node, demand, devices)
        self._changed_node(node)
        self._unwait(uid)
        pod.node, pod.devices, pod.started, pod.demand = node, devices, self.now, demand
        self.running_gpu_pods += bool(demand.num_gpu or demand.extended)
        self.recorder.bound(self, uid)
        if self.rebalancer is not None:
            self.rebalancer.bound(uid, pod)
        if pod.life != math.inf:
            heapq.heappush(self.events, (self.now + pod.life, DEPART, uid))
        return True

    def _depart(self, uid: int) -> None:
        if uid in self.live:  # else it was moved: its replacement has a uid of its own
            self.remove(uid)

    def remove(self, uid: int) -> int:
        """Take a bound pod off its node (it left, or the rebalancer evicted it); returns the node."""
        pod = self.live.pop(uid)
        assert pod.demand is not None
        self.state.release(pod.node, pod.demand, pod.devices)
        self.running_gpu_pods -= bool(pod.demand.num_gpu or pod.demand.extended)
        self._changed_node(pod.node)
        if self.placer.extender is not None:
            self.placer.extender.release(uid)
        if self.rebalancer is not None:
            self.rebalancer.left(uid, pod)
        self.recorder.left(self, pod)
        self.changed.add(pod.node)
        return pod.node

    def _changed_node(self, node: int) -> None:
        self.stale.add(node)
        if self.relabel:
            self.placer.placed(node)

    def fragment(self) -> float:
        """FGD's fragmentation of the cluster now (the nodes changed since the last reading measured again)."""
        for node in self.stale:
            self.tracker.refresh(self.state, node)
        self.stale.clear()
        return self.tracker.cluster_fragment()

    def _wait(self, uid: int) -> None:
        demand = self.fits_demand[self.live[uid].index]
        found = self.waiting.setdefault(demand, set())
        if uid not in found:
            found.add(uid)
            self.pending_milli += demand.gpu_request_milli

    def _unwait(self, uid: int) -> None:
        demand = self.fits_demand[self.live[uid].index]
        found = self.waiting.get(demand)
        if found is not None and uid in found:
            found.discard(uid)
            self.pending_milli -= demand.gpu_request_milli
            if not found:
                del self.waiting[demand]

    def new_uid(self) -> int:
        """A uid for a pod submitted by the run itself (a moved pod's replacement)."""
        self.next_uid += 1
        return self.next_uid - 1

    def submit(self, index: int, life: float) -> int:
        """Submit a pod now (a replacement); returns its uid."""
        uid = self.new_uid()
        self.live[uid] = Live(index=index, submitted=self.now, life=life)
        self.recorder.submitted(self, uid, offered=False)
        self.attempt(uid, learn=True)
        return uid

    def retry(self, nodes: list[int], *, skip: frozenset[int] = frozenset()) -> None:
        """Try again, in submission order, every waiting pod that fits one of ``nodes`` now."""
        taints = self.cluster.taints
        rooms = [self.state.room(n) for n in nodes if not taints[n]]
        fit: dict[PodDemand, bool] = {}

        def fits(demand: PodDemand) -> bool:
            if demand not in fit:
                fit[demand] = any(room.fits(demand) for room in rooms)
            return fit[demand]

        candidates = sorted(uid for demand, uids in self.waiting.items() if fits(demand) for uid in uids)
        for uid in candidates:
            pod = self.live.get(uid)
            # A bind since the list was made may have taken the room: ask the changed nodes again.
            if uid in skip or pod is None or pod.node >= 0 or not fits(self.fits_demand[pod.index]):
                continue
            if self.attempt(uid):
                fit.clear()
                rooms = [self.state.room(n) for n in nodes if not taints[n]]

    def waiting_pods(self) -> list[int]:
        """Uids of the pods waiting, in submission order."""
        return sorted(uid for uids in self.waiting.values() for uid in uids)

    def _tick(self) -> None:
        assert self.rebalancer is not None
        self.rebalancer.tick(self.now)
        heapq.heappush(self.events, (self.now + self.spec.rebalance.interval, TICK, -1))

    def unmark_at(self, at: float, nodes: list[int], taint: Taint) -> None:
        """Take ``taint`` off ``nodes`` at ``at`` (the rebalancer's marks)."""
        self.mark_serial += 1
        number = self.mark_serial
        self.marks[number] = (nodes, taint)
        heapq.heappush(self.events, (at, UNMARK, number))

    def _unmark(self, number: int) -> None:
        nodes, taint = self.marks.pop(number)
        for node in nodes:
            self.cluster.taints[node] = tuple(t for t in self.cluster.taints[node] if t != taint)
            self.changed.add(node)


def run(trace: Trace, spec: TimelineSpec, default: Trace | None = None) -> TimelineResult:
    """Replay one arm and seed in time (``default``: the list that lends a ``multigpu`` list its times)."""
    timed = stream.borrow(trace, default or trace, spec.run.seed)
    found = stream.build(timed, capacity_milli=timed.gpu_capacity_milli, load=spec.load, seed=spec.run.seed)
    return Timeline(timed, spec).run(found)


_WORKER: tuple[Trace, Trace | None] | None = None


def _init_worker(trace: Trace, default: Trace | None) -> None:
    global _WORKER  # per worker process, set once before any task: the traces are sent once
    _WORKER = (trace, default)


def _run_in_worker(spec: TimelineSpec) -> TimelineResult:
    assert _WORKER is not None
    return run(_WORKER[0], spec, _WORKER[1])


def run_many(trace: Trace, specs: list[TimelineSpec], *, default: Trace | None, workers: int,
             progress: Callable[[TimelineResult], None] | None = None) -> list[TimelineResult]:
    """Independent runs in separate processes (one when ``workers`` is 1), in the order given."""
    if workers <= 1 or len(specs) <= 1:
        results = []
        for spec in specs:
            results.append(run(trace, spec, default))
            if progress:
                progress(results[-1])
        return results
    done: dict[int, TimelineResult] = {}
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(trace, default)) as pool:
        futures = {pool.submit(_run_in_worker, spec): i for i, spec in enumerate(specs)}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            if progress:
                progress(done[futures[future]])
    return [done[i] for i in range(len(specs))]
