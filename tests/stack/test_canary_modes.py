"""The canary's failure modes, one table row each, and the rules no look may break (pure)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.stack.canary import Analysis, Diagnostics, Limits, XidRule
from webhook.stack.canarymodes import (
    MODES,
    CanaryNode,
    Diagnosis,
    DriverPod,
    Look,
    Memory,
    Rollout,
    XidCounts,
    decide,
)

NEW, OLD = "610.57.04", "595.91.07"
ROLLOUT = Rollout(pool="canary", commit="c0ffee", from_driver=OLD, to_driver=NEW, started=1000.0)
LIMITS = Limits(stuck_seconds=30, driver_ready_seconds=20, validation_seconds=25, mig_pending_seconds=15)
ANALYSIS = Analysis(pool="canary", pools=("canary",), window_seconds=10, timeout_seconds=600, limits=LIMITS,
                    xid=XidRule(window_seconds=60, minimum=1), diagnostics=Diagnostics(image="dcgm:4", level=2,
                                                                                       timeout_seconds=40))


def done(name: str = "c1") -> CanaryNode:
    return CanaryNode(name=name, state="upgrade-done", driver=NEW, mig_state="success")


def run(looks: list[Look], analysis: Analysis = ANALYSIS):
    """Every decision over ``looks`` in order, the memory carried from one to the next."""
    memory, decisions = Memory(), []
    for look in looks:
        decision = decide(analysis, ROLLOUT, memory, look)
        memory = decision.memory
        decisions.append(decision)
    return decisions


def test_a_failed_upgrade_rolls_back_at_once_naming_the_node():
    [decision] = run([Look(at=1010, nodes=(CanaryNode("c1", "upgrade-failed"),))])
    assert (decision.action, decision.mode, decision.nodes) == ("rollback", "upgrade-failed", ("c1",))
    assert decision.signal_at == 1010


def test_a_failure_the_library_recorded_rolls_back_even_when_the_node_reads_done_again():
    """NVIDIA/gpu-operator#2549: a relabel walks upgrade-failed to upgrade-done with nothing fixed."""
    [decision] = run([Look(at=1020, nodes=(done(),), failed_events={"c1": 1012.0})])
    assert decision.mode == "upgrade-failed" and decision.signal_at == 1012.0
    assert "now upgrade-done" in decision.evidence[0]


def test_a_failure_seen_once_is_not_forgotten_when_the_node_is_retried():
    decisions = run([Look(at=1010, nodes=(CanaryNode("c1", "upgrade-failed"),)),
                     Look(at=1011, nodes=(done(),))])
    assert [d.mode for d in decisions] == ["upgrade-failed", "upgrade-failed"]


def restarting(name: str, *, created: float, consumers: tuple[str, ...] = (), restarts: int = 3) -> CanaryNode:
    pod = DriverPod(name=f"driver-{name}", ready=False, created=created, restarts=restarts,
                    waiting="CrashLoopBackOff: driver is in use" if restarts else "")
    return CanaryNode(name=name, state="pod-restart-required", driver_pod=pod, consumers=consumers)


CONSUMER = "pod ops/gpu-probe-0 on c1 (hostPath /dev/nvidia0, no GPU request the upgrade deletes it for)"


def test_a_consumer_pinning_the_driver_is_named_in_the_rollback():
    [decision] = run([Look(at=1003, nodes=(restarting("c1", created=1001, consumers=(CONSUMER,)),))])
    assert decision.mode == "gpu-consumer" and "ops/gpu-probe-0" in decision.evidence[0]


def test_a_node_failed_because_of_a_consumer_is_rolled_back_naming_the_consumer():
    failed = CanaryNode("c1", "upgrade-failed", consumers=(CONSUMER,))
    [decision] = run([Look(at=1005, nodes=(failed,))])
    assert decision.mode == "gpu-consumer" and "ops/gpu-probe-0" in decision.evidence[0]


@pytest.mark.parametrize(("looks", "mode", "signal"), [
    # a driver pod that never turns Ready: rolled back once the limit has passed since it was made
    ([Look(at=1005, nodes=(restarting("c1", created=1000, restarts=0),)),
      Look(at=1021, nodes=(restarting("c1", created=1000, restarts=0),))], "driver-not-ready", 1020),
    ([Look(at=1000, nodes=(CanaryNode("c1", "validation-required"),)),
      Look(at=1026, nodes=(CanaryNode("c1", "validation-required"),))], "validation-timeout", 1025),
    ([Look(at=1000, nodes=(CanaryNode("c1", "wait-for-jobs-required"),)),
      Look(at=1031, nodes=(CanaryNode("c1", "wait-for-jobs-required"),))], "stuck-state", 1030),
    ([Look(at=1000, nodes=(dataclasses.replace(done(), mig_state="pending"),)),
      Look(at=1016, nodes=(dataclasses.replace(done(), mig_state="pending"),))], "mig-pending", 1015),
])
def test_a_node_past_its_limit_rolls_back_and_the_signal_is_when_the_limit_passed(looks, mode, signal):
    decisions = run(looks)
    assert decisions[0].action == "wait", "inside the limit nothing is decided"
    assert (decisions[-1].action, decisions[-1].mode, decisions[-1].signal_at) == ("rollback", mode, signal)


def test_a_driver_pod_that_never_loads_is_driver_not_ready_even_after_the_stuck_limit():
    """Its node sits in pod-restart-required from before the pod was made: the more precise mode wins."""
    analysis = dataclasses.replace(ANALYSIS, limits=dataclasses.replace(LIMITS, stuck_seconds=20))
    decisions = run([Look(at=1000, nodes=(CanaryNode("c1", "pod-restart-required"),)),
                     Look(at=1001, nodes=(restarting("c1", created=1001, restarts=0),)),
                     Look(at=1020.5, nodes=(restarting("c1", created=1001, restarts=0),)),
                     Look(at=1021.5, nodes=(restarting("c1", created=1001, restarts=0),))], analysis)
    assert [d.action for d in decisions] == ["wait", "wait", "wait", "rollback"]
    assert decisions[-1].mode == "driver-not-ready"


def test_upgrade_required_is_waiting_its_turn_not_stuck():
    decisions = run([Look(at=1000, nodes=(CanaryNode("c2", "upgrade-required"),)),
                     Look(at=1100, nodes=(CanaryNode("c2", "upgrade-required"),))])
    assert [d.action for d in decisions] == ["wait", "wait"]


def test_a_failed_diagnostic_rolls_back_naming_the_job():
    look = Look(at=1050, nodes=(done(),), diagnoses={"c1": Diagnosis("dcgm-diag-c1", "failed", 1040,
                                                                      finished=1048, detail="exit code 1")})
    [decision] = run([look])
    assert decision.mode == "dcgm-diagnostic" and "dcgm-diag-c1" in decision.evidence[0] and decision.signal_at == 1048


def test_more_new_xids_per_canary_node_than_per_baseline_node_rolls_back():
    look = Look(at=1050, nodes=(done(),), xid=XidCounts(canary=2, canary_nodes=1, baseline=1, baseline_nodes=2))
    [decision] = run([look])
    assert decision.mode == "xid-rate" and "0.50 per node" in decision.evidence[0]


def test_the_same_xid_rate_as_the_baseline_does_not_roll_back():
    look = Look(at=1050, nodes=(done(),), xid=XidCounts(canary=1, canary_nodes=1, baseline=2, baseline_nodes=2))
    assert run([look])[0].action == "wait"


def test_a_healthy_canary_is_diagnosed_then_soaked_then_promoted():
    passed = {"c1": Diagnosis("dcgm-diag-c1", "succeeded", 1001, finished=1003)}
    decisions = run([Look(at=1000, nodes=(done(),)),
                     Look(at=1004, nodes=(done(),), diagnoses=passed),
                     Look(at=1011, nodes=(done(),), diagnoses=passed)])
    assert [(d.action, d.diagnose) for d in decisions] == [("wait", True), ("wait", False), ("promote", False)]
    assert "DCGM diagnostics passed: dcgm-diag-c1" in decisions[-1].evidence


def test_an_unfinished_rollout_rolls_back_at_its_timeout():
    analysis = dataclasses.replace(ANALYSIS, timeout_seconds=100)
    [decision] = run([Look(at=1101, nodes=(CanaryNode("c1", "upgrade-required"),))], analysis)
    assert (decision.mode, decision.signal_at) == ("timeout", 1100)


STATES = st.sampled_from(["", "upgrade-required", "cordon-required", "wait-for-jobs-required", "pod-deletion-required",
                          "drain-required", "pod-restart-required", "validation-required", "uncordon-required",
                          "upgrade-done", "upgrade-failed"])
NODES = st.builds(CanaryNode, name=st.sampled_from(["c1", "c2", "c3"]), state=STATES,
                  driver=st.sampled_from([NEW, OLD, None]), mig_state=st.sampled_from(["", "success", "pending"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(NODES, min_size=1, max_size=3, unique_by=lambda n: n.name), min_size=1, max_size=6),
       st.lists(st.floats(min_value=0, max_value=50), min_size=6, max_size=6))
def test_promotion_needs_every_node_done_at_the_new_driver_and_rollback_names_a_mode(nodes_per_look, gaps):
    at, memory = 1000.0, Memory()
    for nodes, gap in zip(nodes_per_look, gaps, strict=False):
        at += gap
        look = Look(at=at, nodes=tuple(nodes), diagnoses={n.name: Diagnosis(f"d-{n.name}", "succeeded", at)
                                                           for n in nodes})
        decision = decide(ANALYSIS, ROLLOUT, memory, look)
        memory = decision.memory
        if decision.action == "promote":
            assert all(n.state == "upgrade-done" and n.driver == NEW for n in nodes)
            assert not memory.failed
        if decision.action == "rollback":
            assert decision.mode in MODES and decision.evidence and decision.signal_at is not None
            assert decision.signal_at <= at
