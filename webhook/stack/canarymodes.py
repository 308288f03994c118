"""The failure modes of a canary driver rollout, and the decision one more look at a pool makes. Pure.

``gpugate stack canary --watch`` looks at each canary pool every ``intervalSeconds``
(``canary_controller`` gathers a ``Look``: the pool's nodes through NVIDIA's upgrade states, their
driver pods, what pins the driver, the library's upgrade-failed Events, the DCGM diagnostic Jobs,
the XID counts of the canary and baseline pools); ``decide`` turns it into one ``CanaryDecision``:

* **rollback**, naming the first failure mode seen and its evidence, as soon as one holds;
* **promote**, once every node is ``upgrade-done`` at the new driver, the diagnostics passed and
  nothing failed for the whole soak window;
* **wait** otherwise (``diagnose`` set when the Jobs are due).

Time is the caller's wall clock (``Look.at``, the rollout commit's time): how long a node sat in a
state is measured from when a look first saw it there (``Memory``), so a restarted controller
waits a full limit again before it calls a node stuck: late, never wrong. The modes, in the order
they are tried (the first that holds decides): ``gpu-consumer``, a new driver that cannot load on a
node where something the upgrade never frees holds the driver (named: it is the cause);
``upgrade-failed`` on any node, also one that reads upgrade-done again (the library's Events keep
it); ``driver-not-ready``;
``validation-timeout``; ``stuck-state`` (any other in-progress state); ``mig-pending``;
``dcgm-diagnostic``; ``xid-rate`` (more new XIDs per node than the baseline pool); ``condition``
(canary.yaml's PromQL); ``timeout`` (not done within ``timeoutSeconds`` of the rollout commit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from webhook.stack.canary import DONE, FAILED, Analysis, NodeUpgrade, Sample, gate

UPGRADE_FAILED = "upgrade-failed"
GPU_CONSUMER = "gpu-consumer"
DRIVER_NOT_READY = "driver-not-ready"
VALIDATION_TIMEOUT = "validation-timeout"
STUCK = "stuck-state"
MIG_PENDING = "mig-pending"
DIAGNOSTIC = "dcgm-diagnostic"
XID_RATE = "xid-rate"
CONDITION = "condition"
TIMEOUT = "timeout"
MODES = (GPU_CONSUMER, UPGRADE_FAILED, DRIVER_NOT_READY, VALIDATION_TIMEOUT, STUCK, MIG_PENDING, DIAGNOSTIC,
         XID_RATE, CONDITION, TIMEOUT)
"""Every failure mode, in the order ``decide`` tries them."""
VALIDATING = "validation-required"
RESTING = ("", "(none)", "upgrade-required", DONE, FAILED)
"""States a node may sit in for as long as it likes (waiting its turn, done), or that have a mode of their own."""


@dataclass(frozen=True)
class DriverPod:
    """The canary node's driver pod at the rollout's driver version (the one the library restarted)."""

    name: str
    ready: bool
    created: float
    restarts: int = 0
    waiting: str = ""
    """The reason a container waits (``CrashLoopBackOff``), with its message when there is one."""


@dataclass(frozen=True)
class CanaryNode:
    name: str
    state: str
    driver: str | None = None
    mig_state: str = ""
    driver_pod: DriverPod | None = None
    consumers: tuple[str, ...] = ()
    """What holds the GPU driver on the node and NVIDIA's upgrade never frees (``consumers``)."""


@dataclass(frozen=True)
class Diagnosis:
    """One DCGM diagnostic Job: ``running``, ``succeeded`` or ``failed`` (with what it said)."""

    job: str
    phase: str
    started: float
    finished: float | None = None
    detail: str = ""
    """What a failed one said (its pod's exit code and message)."""


@dataclass(frozen=True)
class XidCounts:
    """New XID errors over the window, and GPU nodes, of the canary pool and of the baseline pool."""

    canary: int
    canary_nodes: int
    baseline: int
    baseline_nodes: int


@dataclass(frozen=True)
class Rollout:
    """A canary pool's driver change: the commit that made it, from which driver to which, when."""

    pool: str
    commit: str
    from_driver: str
    to_driver: str
    started: float


@dataclass(frozen=True)
class Look:
    at: float
    nodes: tuple[CanaryNode, ...]
    failed_events: Mapping[str, float] = field(default_factory=dict)
    """Node -> when NVIDIA's library wrote upgrade-failed on it since the rollout began (its Events)."""
    diagnoses: Mapping[str, Diagnosis] = field(default_factory=dict)
    """Node -> its diagnostic Job for this rollout."""
    xid: XidCounts | None = None
    measurements: Mapping[str, tuple[float | Sample, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Memory:
    """What the decision remembers between looks at one rollout."""

    since: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    """Node -> (its upgrade state, when a look first saw it there)."""
    mig_since: Mapping[str, float] = field(default_factory=dict)
    failed: Mapping[str, float] = field(default_factory=dict)
    """Node -> when it was first seen upgrade-failed (kept even after it reads upgrade-done)."""
    gate_since: float | None = None
    measured: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CanaryDecision:
    action: str
    """``wait``, ``promote`` or ``rollback``."""
    memory: Memory
    mode: str = ""
    evidence: tuple[str, ...] = ()
    signal_at: float | None = None
    """When the failure became a fact (a state entered, a limit passed, a Job failed): the decision's
    delay is measured from it."""
    nodes: tuple[str, ...] = ()
    diagnose: bool = False
    """The gate is open and a node has no diagnostic Job yet: the caller starts them."""


def remember(memory: Memory, look: Look) -> Memory:
    since = dict(memory.since)
    mig = dict(memory.mig_since)
    failed = dict(memory.failed)
    for node in look.nodes:
        if since.get(node.name, ("", 0.0))[0] != node.state:
            since[node.name] = (node.state, look.at)
        if node.mig_state == "pending":
            mig.setdefault(node.name, look.at)
        else:
            mig.pop(node.name, None)
        if node.state == FAILED:
            failed.setdefault(node.name, look.at)
    for name, at in look.failed_events.items():
        failed[name] = min(at, failed.get(name, at))
    return dataclasses.replace(memory, since=since, mig_since=mig, failed=failed)


def _rollback(memory: Memory, mode: str, evidence: list[str], signal_at: float, nodes: list[str]) -> CanaryDecision:
    return CanaryDecision("rollback", memory, mode=mode, evidence=tuple(evidence), signal_at=signal_at,
                    nodes=tuple(sorted(set(nodes))))


def _upgrade_failed(analysis: Analysis, rollout: Rollout, memory: Memory, look: Look) -> CanaryDecision | None:
    if not memory.failed:
        return None
    states = {n.name: n.state for n in look.nodes}
    evidence = [f"{node} went {FAILED}" + (f" (now {states[node]}: relabelled or retried, nothing proves the driver "
                                           f"works)" if states.get(node, FAILED) != FAILED else "")
                for node in sorted(memory.failed)]
    return _rollback(memory, UPGRADE_FAILED, evidence, min(memory.failed.values()), list(memory.failed))


def _consumers(analysis: Analysis, rollout: Rollout, memory: Memory, look: Look) -> CanaryDecision | None:
    """A node whose new driver cannot load (crash-looping, or already upgrade-failed) while something the
    upgrade never frees holds the driver: the consumer is the cause, so it is named (before upgrade-failed)."""
    for node in look.nodes:
        pod = node.driver_pod
        crashing = pod is not None and not pod.ready and (pod.restarts > 0 or bool(pod.waiting))
        failing = node.name in memory.failed or crashing
        if node.consumers and failing:
            how = (pod.waiting or f"{pod.restarts} restarts") if pod is not None else FAILED
            name = pod.name if pod is not None else "the driver pod"
            return _rollback(memory, GPU_CONSUMER, [f"{name} on {node.name} cannot load the new driver ({how}): "
                                                    f"held by " + "; ".join(node.consumers)],
                             memory.failed.get(node.name, look.at), [node.name])
    return None


def _driver_pods(analysis: Analysis, rollout: Rollout, memory: Memory, look: Look) -> CanaryDecision | None:
    """A new driver pod not Ready past the limit."""
    for node in look.nodes:
        pod = node.driver_pod
        if pod is None or pod.ready:
            continue
        limit = analysis.limits.driver_ready_seconds
        if look.at - pod.created >= limit:
            return _rollback(memory, DRIVER_NOT_READY,
                             [f"driver pod {pod.name} on {node.name} not Ready {look.at - pod.created:.0f}s after it "
                              f"was created (limit {limit:g}s)"
                              + (f": {pod.waiting}" if pod.waiting else f", {pod.restarts} restarts")],
                             pod.created + limit, [node.name])
    return None


def _states(analysis: Analysis, rollout: Rollout, memory: Memory, look: Look) -> CanaryDecision | None:
    """A node in validation-required, in another in-progress state, or with MIG pending, past its limit."""
    limits = analysis.limits
    for node in look.nodes:
        state, since = memory.since.get(node.name, (node.state, look.at))
        if state == VALIDATING and look.at - since >= limits.validation_seconds:
            return _rollback(memory, VALIDATION_TIMEOUT,
                             [f"{node.name} in {VALIDATING} for {look.at - since:.0f}s (limit "
                              f"{limits.validation_seconds:g}s): the validator did not pass the new driver"],
                             since + limits.validation_seconds, [node.name])
    for node in look.nodes:
        state, since = memory.since.get(node.name, (node.state, look.at))
        loading = node.driver_pod is not None and not node.driver_pod.ready  # driver-not-ready's to call
        if state not in RESTING and state != VALIDATING and not loading and look.at - since >= limits.stuck_seconds:
            return _rollback(memory, STUCK, [f"{node.name} in {state} for {look.at - since:.0f}s (limit "
                                             f"{limits.stuck_seconds:g}s)"], since + limits.stuck_seconds,
                             [node.name])
    for name, since in sorted(memory.mig_since.items()):
        if look.at - since >= limits.mig_pending_seconds:
            return _rollback(memory, MIG_PENDING, [f"{name}: nvidia.com/mig.config.state=pending for "
                                                   f"{look.at - since:.0f}s (limit {limits.mig_pending_seconds:g}s): "
                                                   f"the MIG manager did not apply its layout"],
                             since + limits.mig_pending_seconds, [name])
    return None


def _diagnostics(analysis: Analysis, rollout: Rollout, memory: Memory, look: Look) -> CanaryDecision | None:
    spec = analysis.diagnostics
    for node, diagnosis in sorted(look.diagnoses.items()):
        if diagnosis.phase == "failed":
            return _rollback(memory, DIAGNOSTIC, [f"DCGM diagnostic (level {spec.level if spec else '?'}) Job "
                                                  f"{diagnosis.job} on {node} failed: {diagnosis.detail}"],
                             diagnosis.finished or look.at, [node])
        if spec is not None and diagnosis.phase == "running" and look.at - diagnosis.started >= spec.timeout_seconds:
            return _rollback(memory, DIAGNOSTIC, [f"DCGM diagnostic Job {diagnosis.job} on {node} did not finish in "
                                                  f"{spec.timeout_seconds:g}s"],
                             diagnosis.started + spec.timeout_seconds, [node])
    return None


def _xid(analysis: Analysis, rollout: Rollout, memory: Memory, look: Look) -> CanaryDecision | None:
    rule, counts = analysis.xid, look.xid
    if rule is None or counts is None or counts.canary < rule.minimum or not counts.canary_nodes:
        return None
    canary_rate = counts.canary / counts.canary_nodes
    baseline_rate = counts.baseline / counts.baseline_nodes if counts.baseline_nodes else 0.0
    if canary_rate <= baseline_rate:
        return None
    return _rollback(memory, XID_RATE,
                     [f"{counts.canary} new XID error(s) on {counts.canary_nodes} canary node(s) in the last "
                      f"{rule.window_seconds:g}s ({canary_rate:.2f} per node) against {counts.baseline} on "
                      f"{counts.baseline_nodes} baseline node(s) ({baseline_rate:.2f} per node)"],
                     look.at, [n.name for n in look.nodes])


def _conditions(analysis: Analysis, rollout: Rollout, memory: Memory, look: Look) -> CanaryDecision | None:
    violations = [v for c in analysis.conditions if c.name in look.measurements
                  and (v := c.violation(look.measurements[c.name])) is not None]
    if not violations:
        return None
    return _rollback(memory, CONDITION, violations, look.at, [n.name for n in look.nodes])


FAILURES = (_consumers, _upgrade_failed, _driver_pods, _states, _diagnostics, _xid, _conditions)
"""The failure checks in the order of ``MODES`` (each may hold several modes); the first that holds decides."""


def decide(analysis: Analysis, rollout: Rollout, memory: Memory, look: Look) -> CanaryDecision:
    """The decision over one more look at ``rollout``'s pool."""
    memory = remember(memory, look)
    for failure in FAILURES:
        decision = failure(analysis, rollout, memory, look)
        if decision is not None:
            return decision
    opened = gate(rollout.pool, rollout.to_driver, [_as_upgrade(n) for n in look.nodes])
    if not opened.ok:
        memory = dataclasses.replace(memory, gate_since=None, measured=frozenset())
        if look.at - rollout.started >= analysis.timeout_seconds:
            return _rollback(memory, TIMEOUT, [f"not done {analysis.timeout_seconds:g}s after the rollout commit: "
                                               f"{opened.reason}"], rollout.started + analysis.timeout_seconds,
                             [n.name for n in look.nodes if n.state != DONE])
        return CanaryDecision("wait", memory, evidence=(opened.reason,))
    since = memory.gate_since if memory.gate_since is not None else look.at
    memory = dataclasses.replace(memory, gate_since=since, measured=memory.measured | frozenset(look.measurements))
    if analysis.diagnostics is not None:
        missing = [n.name for n in look.nodes if n.name not in look.diagnoses]
        running = [d.job for d in look.diagnoses.values() if d.phase != "succeeded"]
        if missing or running:
            return CanaryDecision("wait", memory, diagnose=bool(missing),
                            evidence=(f"{opened.reason}; DCGM diagnostics " + (
                                f"to start on {', '.join(missing)}" if missing else f"running: {', '.join(running)}"),))
    held = look.at - since
    unmeasured = sorted(c.name for c in analysis.conditions if c.name not in memory.measured)
    if held >= analysis.window_seconds and not unmeasured:
        evidence = [f"{opened.reason}, for {held:.0f}s (soak {analysis.window_seconds:g}s)"]
        if analysis.diagnostics is not None:
            evidence.append(f"DCGM diagnostics passed: {', '.join(d.job for d in look.diagnoses.values())}")
        evidence += [f"{c.name} held" for c in analysis.conditions]
        return CanaryDecision("promote", memory, evidence=tuple(evidence), nodes=tuple(n.name for n in look.nodes))
    waiting = f"{opened.reason}; {held:.0f}s of the {analysis.window_seconds:g}s soak"
    if unmeasured:
        waiting += f"; not yet measured: {', '.join(unmeasured)}"
    return CanaryDecision("wait", memory, evidence=(waiting,))


def _as_upgrade(node: CanaryNode) -> NodeUpgrade:
    return NodeUpgrade(name=node.name, state=node.state, driver=node.driver)
