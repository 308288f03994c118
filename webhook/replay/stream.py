"""The timeline's pods in time: who is submitted when, and for how long each stays (pure).

A pod list is a sample of a larger workload: replayed at the trace's own times it keeps about 14 of
the 6,212 GPUs busy. ``build`` keeps the trace's order and its spacing, scaled, so that the offered
load (the time-averaged GPU demand of the stream over capacity) is ``load``:

* Each pod stays ``deletion_time - creation_time`` seconds once bound (at least 1); a pod still
  ``Running`` at the list's last deletion time is long-lived and never leaves.
* The pods created before the list's busy window (before its last silence of more than a day:
  26 pods on the default list, created months earlier, 68% of its GPU-seconds) are the cluster's
  standing pods: submitted at time 0, one copy each, for what was left of their lives.
* The others are the stream, in creation order. Their spacing is divided by ``scale``, chosen so
  that the arrival rate times the mean GPU-seconds per pod, over capacity, is ``load``: the
  time-averaged GPU demand of the stream repeated back to back, which is its steady state.
* The replay starts in that steady state instead of an empty cluster (which, with these lives of
  hours to months, would still be filling when the stream ends): the copies of each stream pod
  that earlier repetitions, one ``window`` apart, left still running at time 0 are submitted then
  (a seeded phase per pod; seeded order), with what is left of their lives. Then the stream arrives
  once over ``window`` (the busy span divided by ``scale``).

The four ``multigpu`` lists carry no times: ``borrow`` gives their pods that come from the default
list that pod's times and QoS class, and the others the times of a default-list pod drawn by seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from webhook.errors import InputError
from webhook.replay.records import PodTimes, Trace, TracePod

SILENCE = 86_400
"""Seconds without a creation that end the trace's sparse head (the busy window starts after it)."""
HEAD, WARM, STREAM = "head", "warm", "stream"
FOREVER = math.inf


@dataclass(frozen=True, slots=True)
class Submission:
    """One pod handed to the scheduler: when (seconds from the window's start), which trace pod, and
    how long it stays once bound (``FOREVER`` for a long-lived pod)."""

    at: float
    index: int
    life: float
    origin: str


@dataclass(frozen=True)
class Stream:
    """A seed's timeline: submissions in order, the window they arrive over, and how it was scaled."""

    submissions: tuple[Submission, ...]
    window: float
    scale: float
    """How many times denser than the trace the stream arrives."""
    load: float
    head: int
    warm: int


def borrow(trace: Trace, default: Trace, seed: int) -> Trace:
    """A list without times (``multigpu``) given the default list's: a pod of the default list (same
    name, same requests) takes its times and QoS class; any other takes the times of a default-list
    pod drawn with the seed (its QoS stays empty: the trace says nothing of it)."""
    if trace.times:
        return trace
    if not default.times:
        raise InputError(f"{default.workload} has no creation and deletion times to lend {trace.workload}")
    same = {(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli): i for i, p in enumerate(default.pods)}
    rng = np.random.default_rng((seed, 5))
    pods: list[TracePod] = []
    times: list[PodTimes] = []
    for record in trace.pods:
        found = same.get((record.name, record.cpu_milli, record.memory_mib, record.num_gpu, record.gpu_milli))
        if found is not None:
            pods.append(dataclasses.replace(record, qos=default.pods[found].qos))
            times.append(default.times[found])
        else:
            pods.append(record)
            times.append(default.times[int(rng.integers(len(default.times)))])
    return dataclasses.replace(trace, pods=tuple(pods), times=tuple(times))


def lives(times: Sequence[PodTimes]) -> list[float]:
    """Seconds each pod stays once bound; ``FOREVER`` for a pod still Running at the list's end."""
    end = max(t.deleted for t in times)
    return [FOREVER if t.phase == "Running" and t.deleted >= end else float(max(1, t.deleted - t.created))
            for t in times]


def busy_start(created: Sequence[int]) -> int:
    """The first creation time after the list's last silence longer than ``SILENCE`` (sorted input)."""
    start = created[0]
    for before, after in zip(created, created[1:], strict=False):
        if after - before > SILENCE:
            start = after
    return start


def build(trace: Trace, *, capacity_milli: int, load: float, seed: int) -> Stream:
    """The seed's submissions (see the module docstring); InputError when the list cannot be timed."""
    if not trace.times or len(trace.times) != len(trace.pods):
        raise InputError(f"{trace.workload}: no creation and deletion times to replay in time")
    if load <= 0:
        raise InputError(f"--load must be above 0, got {load}")
    stays = lives(trace.times)
    order = sorted(range(len(trace.pods)), key=lambda i: (trace.times[i].created, i))
    start = busy_start([trace.times[i].created for i in order])
    head = [i for i in order if trace.times[i].created < start]
    body = [i for i in order if trace.times[i].created >= start]
    span = max(1, trace.times[body[-1]].created - start)
    # Long-lived pods count with the life the trace saw (their deletion_time is the trace's end).
    work = sum(trace.pods[i].gpu_request_milli * max(1, trace.times[i].deleted - trace.times[i].created)
               for i in body)
    if work == 0:
        raise InputError(f"{trace.workload}: no GPU pod in its busy window, so no GPU load to scale to")
    scale = load * span * capacity_milli / work
    window = span / scale
    rng = np.random.default_rng((seed, 4))
    submissions = [Submission(0.0, i, _left(stays[i], start - trace.times[i].created), HEAD) for i in head]
    submissions = [s for s in submissions if s.life > 0]
    warm = _warm(body, trace, stays, window, rng.random(len(body)))
    submissions += [warm[k] for k in rng.permutation(len(warm)).tolist()]
    submissions += [Submission((trace.times[i].created - start) / scale, i, stays[i], STREAM) for i in body]
    return Stream(submissions=tuple(submissions), window=window, scale=scale, load=load,
                  head=len(head), warm=len(warm))


def _left(life: float, age: float) -> float:
    return life if life == FOREVER else life - age


def _warm(body: list[int], trace: Trace, stays: list[float], window: float,
          phases: np.ndarray) -> list[Submission]:
    """The copies earlier repetitions of the stream left running at time 0, pod by pod: a copy that
    arrived ``age`` ago is still there while ``age`` is below its life (the trace's, for a long-lived
    pod, whose copies then stay)."""
    found = []
    for i, phase in zip(body, phases.tolist(), strict=True):
        life = float(max(1, trace.times[i].deleted - trace.times[i].created))
        age = phase * window
        while age < life:
            found.append(Submission(0.0, i, _left(stays[i], age), WARM))
            age += window
    return found
