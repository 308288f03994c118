"""The stack rules as one list each planner filters: one place to add a rule, one ``Waivers``.

``plan_sync`` promises the checks ``upgrade`` takes; before the list it skipped the component
overrides, so a hand edit that moved the operator past a pinned component said nothing about it.
"""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from tests.stack.conftest import ROOT
from webhook.commands.stack import stack as stack_group
from webhook.commands.stack_options import WAIVER_FLAGS
from webhook.stack import checks, manifests, matrix, releases, rollback
from webhook.stack import plan as planning
from webhook.stack.compat import Check

M = matrix.load()
SHIPPED = manifests.load_stack(ROOT)
OLDER = SHIPPED.replace(operator_version=releases.OperatorVersion.parse("v26.3.3"))


def labels(plan: planning.ChangePlan) -> list[str]:
    return [c.label for c in plan.checks]


def test_a_hand_edit_that_moves_the_operator_takes_the_component_override_check_as_upgrade_does():
    assert SHIPPED.components, "the shipped stack pins a component (the example this test needs)"
    upgrade = planning.plan_upgrade(M, OLDER, planning.Request(operator=str(SHIPPED.operator_version)), {})
    sync = planning.plan_sync(M, OLDER, SHIPPED, existing={})
    assert "component-override[dcgmExporter]" in labels(sync)
    assert labels(sync) == labels(upgrade)
    override = next(c for c in sync.checks if c.name == "component-override")
    assert "stays pinned at 4.6.0-4.8.3-distroless" in override.reason


def test_a_hand_edit_that_keeps_the_operator_takes_no_component_override_check():
    edited = SHIPPED.with_pool("canary", driver="610.57.04")
    assert not [c for c in planning.plan_sync(M, SHIPPED, edited, existing={}).checks
                if c.name == "component-override"]


def plans_of_every_action() -> dict[str, planning.ChangePlan]:
    canary = SHIPPED.with_pool("canary", driver="610.57.04")
    return {
        checks.UPGRADE: planning.plan_upgrade(M, SHIPPED, planning.Request(operator="v26.7.0", driver="610.57.04"), {}),
        checks.SYNC: planning.plan_sync(M, SHIPPED, canary, existing={}),
        checks.PROMOTE: planning.plan_promote(M, canary, source="canary", to="default", existing={}),
        checks.ROLLBACK: rollback.plan_rollback(M, canary, SHIPPED, sha="0" * 40, subject="gpugate stack: x",
                                                existing={}),
    }


def test_a_rule_added_to_the_list_is_run_by_the_planners_it_names_and_only_those(monkeypatch):
    def one_more(change: checks.Change) -> list[Check]:
        return [Check(name="one-more", ok=False, reason=f"{change.action}: {len(change.pools)} pool(s)")]

    monkeypatch.setattr(checks, "CHECKS", (*checks.CHECKS,
                                           checks.StackCheck("one-more", frozenset({checks.SYNC, checks.PROMOTE}),
                                                             one_more)))
    plans = plans_of_every_action()
    ran = {action: [c.reason for c in plan.checks if c.name == "one-more"] for action, plan in plans.items()}
    assert ran == {checks.UPGRADE: [], checks.ROLLBACK: [], checks.SYNC: ["sync: 1 pool(s)"],
                   checks.PROMOTE: ["promote: 1 pool(s)"]}
    assert not plans[checks.SYNC].ok and not plans[checks.PROMOTE].ok and plans[checks.UPGRADE].ok


def test_every_check_a_plan_lists_comes_from_the_list_in_its_order():
    order = [entry.name for entry in checks.CHECKS]
    by_check = {"driver-published": "drivers", "driver-validated": "drivers", "driver-mig-mixed": "drivers"}
    for action, plan in plans_of_every_action().items():
        entries = [by_check.get(c.name, c.name) for c in plan.checks]
        assert entries, action
        positions = [order.index(name) for name in entries]
        assert positions == sorted(positions), (action, entries)
        assert all(action in checks.CHECKS[p].actions for p in positions), action


def test_a_pool_scope_refusal_stops_after_the_scope_check():
    request = planning.Request(operator="v26.7.0", pool="nosuch", driver="610.57.04")
    plan = planning.plan_upgrade(M, SHIPPED, request, {})
    assert labels(plan) == ["release-path", "kubernetes", "pool-scope[nosuch]"] and not plan.ok and not plan.steps


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(checks.Waivers)])
def test_each_waiver_has_one_flag_and_a_command_takes_it(field):
    flag, _ = WAIVER_FLAGS[field]
    taken = [name for name, command in stack_group.commands.items()
             if any(flag in param.opts for param in command.params)]
    assert taken, f"no stack command takes {flag}"
    result = CliRunner().invoke(stack_group, [taken[0], "--help"])
    assert flag in result.output
