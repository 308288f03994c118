"""The quarantine decisions: a pure function of the policy, the ledger, what a pass saw and now."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.balancer.healthpolicy import FATAL_XIDS, NEVER_XIDS, HealthPolicy, Rule
from webhook.balancer.healthsignals import Fault
from webhook.balancer.quarantine import Observed, decide, firing, validation_pod_name
from webhook.balancer.quarantineledger import Ledger, ReleaseRequest

HOLD = 100.0
POLICY = HealthPolicy(enabled=True, hold=HOLD, hold_growth=2.0, hold_max=10_000.0, repeat_window=5_000.0)
GPU = ("n1", "GPU-3")
T0 = 1_000_000.0


def xid(code: int, at: float, node: str = "n1", gpu: str = "GPU-3") -> Fault:
    return Fault(node=node, gpu=gpu, signal="xid", code=code, at=at)


def run(ledger: Ledger, now: float, *faults: Fault, policy: HealthPolicy = POLICY, **seen: object):
    return decide(policy, ledger, Observed(faults=tuple(faults), **seen), now)  # type: ignore[arg-type]


def kinds(decision) -> list[str]:
    return [a.kind for a in decision.actions]


class TestWhatQuarantines:
    @pytest.mark.parametrize("code", [48, 64, 74, 79, 95, 119, 120])
    def test_a_fatal_xid_quarantines_its_gpu_at_once(self, code: int) -> None:
        decision = run(Ledger(), T0, xid(code, T0 - 3))
        (q,) = decision.ledger.quarantines
        assert (q.key, q.rule, q.signal, q.reason, q.slug) == (GPU, "fatal-xid", "xid", f"XID {code}", f"xid-{code}")
        assert (q.effect, q.since, q.hold_until, q.strikes) == ("NoSchedule", T0, T0 + HOLD, 1)
        assert kinds(decision) == ["quarantined"]

    @pytest.mark.parametrize("code", [13, 31, 43, 45, 63, 92, 94])
    def test_application_and_non_fatal_xids_never_quarantine(self, code: int) -> None:
        assert run(Ledger(), T0, xid(code, T0 - 1)).ledger == Ledger()

    def test_an_xid_outside_the_window_is_not_counted(self) -> None:
        assert run(Ledger(), T0, xid(79, T0 - 601)).ledger == Ledger()

    def test_a_rule_counts_events_within_its_window(self) -> None:
        twice = dataclasses.replace(POLICY, rules=(Rule(name="two-dbe", signal="ecc-dbe", count=2, window=60),))
        one = Fault(node="n1", gpu="GPU-3", signal="ecc-dbe", at=T0 - 10, count=1)
        assert run(Ledger(), T0, one, policy=twice).ledger == Ledger()
        two = dataclasses.replace(one, count=2)
        (q,) = run(Ledger(), T0, two, policy=twice).ledger.quarantines
        assert (q.rule, q.reason) == ("two-dbe", "2 double-bit ECC errors")

    @pytest.mark.parametrize(("fault", "rule"), [
        (Fault(node="n1", gpu="GPU-3", signal="row-remap-failure"), "row-remap-failure"),
        (Fault(node="n1", gpu="GPU-3", signal="driver-taint", code=79), "driver-taint"),
        (Fault(node="n1", gpu="GPU-3", signal="driver-taint"), "driver-taint"),  # gpu-lost
        (Fault(node="n1", gpu="", signal="plugin-unhealthy", count=1), "plugin-unhealthy"),
    ])
    def test_conditions_quarantine_while_they_hold(self, fault: Fault, rule: str) -> None:
        (q,) = run(Ledger(), T0, fault).ledger.quarantines
        assert (q.node, q.gpu, q.rule) == (fault.node, fault.gpu, rule)

    def test_a_driver_taint_for_an_application_xid_is_ignored(self) -> None:
        assert run(Ledger(), T0, Fault(node="n1", gpu="GPU-3", signal="driver-taint", code=43)).ledger == Ledger()

    def test_the_strongest_rule_names_the_quarantine(self) -> None:
        policy = dataclasses.replace(POLICY, rules=(
            Rule(name="soft", signal="xid", xids=(79,)),
            Rule(name="hard", signal="xid", xids=(79,), effect="NoExecute")))
        (q,) = run(Ledger(), T0, xid(79, T0), policy=policy).ledger.quarantines
        assert (q.rule, q.effect, q.final_effect) == ("hard", "NoExecute", "NoExecute")

    def test_only_the_faulty_gpu_is_quarantined(self) -> None:
        decision = run(Ledger(), T0, xid(79, T0, gpu="GPU-3"), xid(43, T0, gpu="GPU-4"))
        assert [q.key for q in decision.ledger.quarantines] == [GPU]


class TestEffects:
    def test_a_dry_run_writes_effect_none_and_ends_with_the_hold_without_validation(self) -> None:
        dry = dataclasses.replace(POLICY, dry_run=True)
        (q,) = run(Ledger(), T0, xid(79, T0), policy=dry).ledger.quarantines
        assert (q.effect, q.dry_run, q.escalate_at) == ("None", True, 0.0)
        ledger = run(Ledger(), T0, xid(79, T0), policy=dry).ledger
        assert run(ledger, T0 + HOLD - 1, policy=dry).ledger.quarantines == (q,)
        ended = run(ledger, T0 + HOLD, policy=dry)
        assert ended.ledger.quarantines == () and [a.detail for a in ended.actions] == ["dry run: the hold is over"]

    def test_noschedule_then_noexecute_after_the_policy_delay(self) -> None:
        policy = dataclasses.replace(POLICY, rules=(
            Rule(name="fatal", signal="xid", xids=(79,), effect="NoExecute", no_execute_after=30),))
        ledger = run(Ledger(), T0, xid(79, T0), policy=policy).ledger
        assert ledger.quarantines[0].effect == "NoSchedule"
        assert run(ledger, T0 + 29, policy=policy).ledger == ledger
        later = run(ledger, T0 + 30, policy=policy)
        assert later.ledger.quarantines[0].effect == "NoExecute" and kinds(later) == ["escalated"]


class TestReturn:
    def quarantined(self) -> Ledger:
        return run(Ledger(), T0, xid(79, T0 - 1)).ledger

    def test_nothing_validates_before_the_hold_ends(self) -> None:
        ledger = self.quarantined()
        assert run(ledger, T0 + HOLD - 0.1).ledger == ledger

    def test_after_the_hold_a_validation_pod_is_asked_for_then_its_success_returns_the_gpu(self) -> None:
        started = run(self.quarantined(), T0 + HOLD)
        (q,) = started.ledger.quarantines
        assert (q.validation, q.validation_pod) == ("running", validation_pod_name("n1", "GPU-3", 1, 0))
        assert run(started.ledger, T0 + HOLD + 5, pods={q.validation_pod: "Running"}).ledger == started.ledger
        back = run(started.ledger, T0 + HOLD + 9, pods={q.validation_pod: "Succeeded"})
        assert back.ledger.quarantines == () and kinds(back) == ["returned"]
        (returned,) = back.ledger.returned
        assert (returned.how, returned.strikes, returned.at) == ("validated", 1, T0 + HOLD + 9)

    def test_a_failed_validation_extends_the_hold_and_the_next_attempt_is_a_new_pod(self) -> None:
        started = run(self.quarantined(), T0 + HOLD).ledger
        pod = started.quarantines[0].validation_pod
        failed = run(started, T0 + HOLD + 10, pods={pod: "Failed"})
        (q,) = failed.ledger.quarantines
        assert kinds(failed) == ["validation-failed"]
        assert (q.validation, q.failed_validations, q.hold_until) == ("", 1, T0 + HOLD + 10 + 2 * HOLD)
        again = run(failed.ledger, q.hold_until).ledger.quarantines[0]
        assert again.validation_pod == validation_pod_name("n1", "GPU-3", 1, 1) != pod

    def test_a_validation_that_never_finishes_fails_at_its_timeout(self) -> None:
        started = run(self.quarantined(), T0 + HOLD).ledger
        pod = started.quarantines[0].validation_pod
        timeout = POLICY.validation.timeout
        assert run(started, T0 + HOLD + timeout, pods={pod: "Pending"}).ledger == started
        failed = run(started, T0 + HOLD + timeout + 1, pods={pod: "Pending"})
        assert "did not finish" in failed.actions[0].detail

    def test_nothing_returns_while_prometheus_is_down(self) -> None:
        ledger = self.quarantined()
        assert run(ledger, T0 + HOLD, signals_ok=False).ledger == ledger
        started = run(ledger, T0 + HOLD).ledger
        pod = started.quarantines[0].validation_pod
        assert run(started, T0 + HOLD + 9, signals_ok=False, pods={pod: "Succeeded"}).ledger == started

    def test_a_gpu_a_workload_still_holds_is_not_validated_yet(self) -> None:
        ledger = self.quarantined()
        assert run(ledger, T0 + HOLD, busy=frozenset({GPU})).ledger == ledger

    def test_a_condition_still_present_blocks_the_return(self) -> None:
        remap = Fault(node="n1", gpu="GPU-3", signal="row-remap-failure")
        ledger = run(Ledger(), T0, remap).ledger
        assert run(ledger, T0 + HOLD, remap).ledger == ledger
        started = run(ledger, T0 + HOLD).ledger
        pod = started.quarantines[0].validation_pod
        blocked = run(started, T0 + HOLD + 1, remap, pods={pod: "Succeeded"})
        assert kinds(blocked) == ["blocked"] and blocked.ledger.quarantines[0].validation == ""

    def test_the_xid_that_caused_it_is_not_held_against_the_gpu_after_its_return(self) -> None:
        """The gauge keeps saying 79 (its series stays new for the look-back): the event is the same one."""
        started = run(self.quarantined(), T0 + HOLD).ledger
        pod = started.quarantines[0].validation_pod
        back = run(started, T0 + HOLD + 1, pods={pod: "Succeeded"}).ledger
        assert run(back, T0 + HOLD + 2, xid(79, T0 - 1)).ledger.quarantines == ()


class TestFlapping:
    def cycle(self, ledger: Ledger, now: float, at: float) -> tuple[Ledger, float]:
        """Quarantined by an XID at ``at``, validated after the hold; returns the ledger and the return time."""
        ledger = run(ledger, now, xid(79, at)).ledger
        q = ledger.find(*GPU)
        assert q is not None
        started = run(ledger, q.hold_until).ledger
        pod = started.quarantines[0].validation_pod
        back_at = q.hold_until + 1
        return run(started, back_at, pods={pod: "Succeeded"}).ledger, back_at

    def test_each_relapse_within_the_repeat_window_doubles_the_hold(self) -> None:
        ledger, now, holds = Ledger(), T0, []
        for _ in range(4):
            ledger = run(ledger, now, xid(79, now - 1)).ledger
            q = ledger.quarantines[0]
            holds.append((q.strikes, q.hold_until - q.since))
            ledger, back = self.cycle(Ledger(returned=ledger.returned, quarantines=ledger.quarantines), now, now - 1)
            now = back + 10
        assert holds == [(1, HOLD), (2, 2 * HOLD), (3, 4 * HOLD), (4, 8 * HOLD)]

    def test_the_strikes_are_forgotten_after_the_repeat_window(self) -> None:
        ledger, back = self.cycle(Ledger(), T0, T0 - 1)
        later = back + POLICY.repeat_window + 1
        (q,) = run(ledger, later, xid(79, later - 1)).ledger.quarantines
        assert q.strikes == 1 and q.hold_until - q.since == HOLD

    def test_a_new_xid_while_quarantined_restarts_a_longer_hold_and_drops_the_validation(self) -> None:
        ledger = run(Ledger(), T0, xid(79, T0 - 1)).ledger
        started = run(ledger, T0 + HOLD).ledger
        relapse = run(started, T0 + HOLD + 3, xid(79, T0 - 1), xid(48, T0 + HOLD + 2))
        (q,) = relapse.ledger.quarantines
        assert kinds(relapse) == ["relapsed"] and q.validation == ""
        assert q.hold_until == T0 + HOLD + 3 + 2 * HOLD
        assert run(relapse.ledger, T0 + HOLD + 4, xid(48, T0 + HOLD + 2)).ledger == relapse.ledger  # counted once

    def test_the_hold_never_exceeds_hold_max(self) -> None:
        assert POLICY.hold_for(50) == POLICY.hold_max


class TestOperator:
    def test_an_operator_release_returns_the_gpu_and_is_recorded(self) -> None:
        ledger = run(Ledger(), T0, xid(79, T0 - 1)).ledger
        asked = ledger.with_request(ReleaseRequest(node="n1", gpu="GPU-3", by="alice", reason="RMA done", at=T0 + 1))
        released = run(asked, T0 + 2)
        assert released.ledger.quarantines == () and released.ledger.requests == ()
        assert released.actions[0].detail == "released by an operator by alice: RMA done"
        assert (released.ledger.returned[0].how, released.ledger.returned[0].note) == (
            "operator", "released by alice: RMA done")

    def test_a_release_sticks_while_the_condition_it_was_given_with_lasts(self) -> None:
        taint = Fault(node="n1", gpu="GPU-3", signal="driver-taint", code=79)
        ledger = run(Ledger(), T0, taint).ledger
        asked = ledger.with_request(ReleaseRequest(node="n1", gpu="GPU-3", by="bob", reason="driver fixed", at=T0))
        released = run(asked, T0 + 1, taint).ledger
        assert released.quarantines == ()
        assert run(released, T0 + 2, taint).ledger.quarantines == ()
        cleared = run(released, T0 + 3).ledger
        assert run(cleared, T0 + 4, taint).ledger.quarantines != ()  # it came back: a new fault

    def test_a_request_for_a_gpu_that_is_not_quarantined_is_dropped(self) -> None:
        asked = Ledger().with_request(ReleaseRequest(node="n1", gpu="GPU-9", by="a", reason="b", at=T0))
        decision = run(asked, T0)
        assert decision.ledger == Ledger() and kinds(decision) == ["request-ignored"]


class TestStandingStill:
    def test_nothing_changes_without_faults(self) -> None:
        assert run(Ledger(), T0) == run(Ledger(), T0)
        assert run(Ledger(), T0).ledger == Ledger() and run(Ledger(), T0).actions == ()


codes = st.integers(min_value=1, max_value=200)
moments = st.floats(min_value=T0 - 2000, max_value=T0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(codes, moments, st.sampled_from(["GPU-1", "GPU-2"])), max_size=8))
def test_property_a_gpu_is_quarantined_iff_a_counted_xid_is_in_the_window(events: list[tuple[int, float, str]]) -> None:
    faults = [xid(code, at, gpu=gpu) for code, at, gpu in events]
    decision = run(Ledger(), T0, *faults)
    expected = {("n1", gpu) for code, at, gpu in events if code in FATAL_XIDS and at >= T0 - 600}
    assert {q.key for q in decision.ledger.quarantines} == expected
    assert not any(q.reason == f"XID {c}" for q in decision.ledger.quarantines for c in NEVER_XIDS)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=0, max_value=4000, allow_nan=False),
                          st.sampled_from(["Pending", "Running", "Succeeded", "Failed", ""])), max_size=12))
def test_property_no_gpu_returns_before_its_hold_nor_without_a_passed_validation(
        steps: list[tuple[float, str]]) -> None:
    ledger = run(Ledger(), T0, xid(79, T0 - 1)).ledger
    now = T0
    for delta, phase in steps:
        now += delta
        before = ledger.find(*GPU)
        pods = {before.validation_pod: phase} if before is not None and phase else {}
        decision = run(ledger, now, pods=pods)
        if before is not None and decision.ledger.find(*GPU) is None:
            assert now >= before.hold_until and before.validation == "running"
            assert pods.get(before.validation_pod) == "Succeeded"
        ledger = decision.ledger


def test_firing_lists_the_strongest_rule_first() -> None:
    policy = dataclasses.replace(POLICY, rules=(Rule(name="a", signal="xid", xids=(79,)),
                                                Rule(name="b", signal="xid", xids=(79,), effect="NoExecute")))
    assert [r.name for r, _ in firing(policy, [xid(79, T0)], after=0, now=T0)] == ["b", "a"]
