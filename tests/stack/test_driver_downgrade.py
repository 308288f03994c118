"""A pool moving to an older driver is a downgrade: named as one, and only with --allow-driver-downgrade.

Why: `stack upgrade --driver 595.91.07` from 610.57.04 passed every check and was
committed as an "upgrade". The rule is pure (``compat.check_driver_path``); the plans of upgrade,
promote and sync apply it, rollback (which goes back by design) does not.
"""

from __future__ import annotations

import pytest

from tests.stack.conftest import ROOT
from webhook.stack import compat, manifests, matrix, messages, releases, rollback
from webhook.stack import plan as planning
from webhook.stack.checks import Waivers
from webhook.stack.model import Stack

M = matrix.load()
SHIPPED = manifests.load_stack(ROOT)


def at(stack: Stack, **drivers: str) -> Stack:
    for name, driver in drivers.items():
        stack = stack.with_pool(name, driver=driver)
    return stack


def failed(plan: planning.ChangePlan) -> list[str]:
    return [c.label for c in plan.checks if not c.ok]


@pytest.mark.parametrize(("current", "target", "down"), [
    ("610.57.04", "595.91.07", True),
    ("595.91.07", "595.71.05", True),
    ("595.91.07", "610.57.04", False),
    ("595.71.05", "595.91.07", False),
    ("595.91.07", "595.91.7", False),   # the same version written unpadded (driver-published refuses it)
    ("595", "595.91.07", False),        # a precompiled branch and a version of it: neither older
    ("610", "595", True),
])
def test_a_driver_is_older_when_its_numbers_are(current, target, down):
    assert compat.is_driver_downgrade(current, target) is down


def test_the_shipped_pins_are_what_the_examples_assume():
    assert str(SHIPPED.operator_version) == "v26.7.0"
    assert {p.name: p.driver for p in SHIPPED.pools} == {"default": "595.91.07", "canary": "595.91.07"}


def test_upgrade_to_an_older_driver_fails_driver_path_and_is_titled_a_downgrade():
    current = at(SHIPPED, default="610.57.04", canary="610.57.04")
    request = planning.Request(operator="v26.7.0", driver="595.91.07")
    plan = planning.plan_upgrade(M, current, request, {})
    assert failed(plan) == ["driver-path[default]", "driver-path[canary]"]
    check = next(c for c in plan.checks if c.label == "driver-path[default]")
    assert "610.57.04 -> 595.91.07 on pool default is a downgrade" in check.reason
    assert "--allow-driver-downgrade" in check.reason
    assert plan.steps[0].title == "downgrade driver 595.91.07 on pools default, canary (from 610.57.04)"

    allowed = planning.plan_upgrade(M, current, planning.Request(operator="v26.7.0", driver="595.91.07",
                                                                 waivers=Waivers(driver_downgrade=True)), {})
    assert allowed.ok and allowed.steps[0].title == plan.steps[0].title
    assert "pool canary: driver downgraded 610.57.04 -> 595.91.07 (--allow-driver-downgrade)" in allowed.warnings
    message = messages.commit_message(allowed, files=[manifests.STACK_FILE])
    assert message.startswith("gpugate stack: downgrade driver 595.91.07 on pools default, canary (from 610.57.04)\n")
    assert "Gpugate-Stack: upgrade" in message  # the command that made it, for rollback to find


def test_an_upgrade_to_a_newer_driver_passes_driver_path_and_keeps_its_title():
    plan = planning.plan_upgrade(M, SHIPPED, planning.Request(operator="v26.7.0", driver="610.57.04"), {})
    assert plan.ok, failed(plan)
    assert [c.reason for c in plan.checks if c.name == "driver-path"] == [
        "driver 595.91.07 -> 610.57.04 on pool default is not a downgrade",
        "driver 595.91.07 -> 610.57.04 on pool canary is not a downgrade"]
    assert plan.steps[0].title == "upgrade driver 610.57.04 on pools default, canary"


def test_an_operator_upgrade_with_an_older_driver_names_both():
    current = at(SHIPPED, default="610.57.04").replace(operator_version=releases.OperatorVersion.parse("v26.3.3"))
    plan = planning.plan_upgrade(M, current, planning.Request(operator="v26.7.0", driver="595.91.07",
                                                              pool=None, waivers=Waivers(driver_downgrade=True)), {})
    assert plan.steps[0].title == ("upgrade gpu-operator v26.3.3 -> v26.7.0; "
                                   "downgrade driver 595.91.07 on pool default (from 610.57.04)")


def test_promoting_an_older_canary_driver_is_a_downgrade():
    current = at(SHIPPED, default="610.57.04")
    plan = planning.plan_promote(M, current, source="canary", to="default", existing={})
    assert failed(plan) == ["driver-path[default]"]
    assert plan.steps[0].title == ("promote driver 595.91.07 from pool canary to pool default "
                                   "(a downgrade from 610.57.04)")
    assert planning.plan_promote(M, current, source="canary", to="default", existing={},
                                 waivers=Waivers(driver_downgrade=True)).ok


def test_a_hand_edit_to_an_older_driver_needs_the_flag_too():
    current = at(SHIPPED, canary="610.57.04")
    plan = planning.plan_sync(M, current, SHIPPED, existing={})
    assert failed(plan) == ["driver-path[canary]"]
    assert plan.steps[0].title == "sync downgrade driver 595.91.07 on pool canary (from 610.57.04)"
    assert planning.plan_sync(M, current, SHIPPED, existing={},
                              waivers=Waivers(driver_downgrade=True)).ok


def test_rollback_goes_back_without_the_driver_flag():
    current = at(SHIPPED, canary="610.57.04")
    plan = rollback.plan_rollback(M, current, SHIPPED, sha="0" * 40, subject="gpugate stack: upgrade driver 610.57.04",
                                  existing={})
    assert plan.ok and not [c for c in plan.checks if c.name == "driver-path"]
