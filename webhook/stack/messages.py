"""The structured message of a stack commit: title, changes, checks passed, warnings, trailers. Pure.

``gitrepo`` reads the trailers back (``TRAILER``, ``REVERTS_TRAILER``) to find stack commits and
what a rollback undid.
"""

from __future__ import annotations

from webhook.stack.compat import Check
from webhook.stack.model import Stack
from webhook.stack.plan import ChangePlan

TRAILER = "Gpugate-Stack"
"""The git trailer that marks a stack commit; its value is the action (upgrade, promote, rollback)."""
REVERTS_TRAILER = "Gpugate-Reverts"


def _summary(stack: Stack) -> str:
    pools = " ".join(f"{p.name}={p.driver}" for p in stack.pools)
    return (f"operator={stack.operator_version} kubernetes=1.{stack.kubernetes_minor} "
            f"management={stack.management} {pools}")


def changes(before: Stack, after: Stack) -> list[str]:
    """Human lines ``what: from -> to`` for every declared version that differs."""
    old, new = before.versions(), after.versions()
    lines = [f"{key}: {old.get(key, '(none)')} -> {new.get(key, '(none)')}"
             for key in dict.fromkeys([*old, *new]) if old.get(key) != new.get(key)]
    return lines


def commit_message(plan: ChangePlan, *, files: list[str], extra_checks: tuple[Check, ...] = ()) -> str:
    """The structured message of the plan's first commit: title, changes, checks passed, trailers."""
    step = plan.steps[0]
    body = [f"gpugate stack: {step.title}"[:200], ""]
    if plan.reverts:
        body += [f"This rolls back stack commit {plan.reverts}.", ""]
        if plan.reverts_why:
            body += [f"Chosen: {plan.reverts_why}.", ""]
    if plan.notes:
        body += ["Why:"] + [f"  {line}" for line in plan.notes] + [""]
    body += ["Changes:"]
    body += [f"  {line}" for line in changes(plan.current, step.stack)]
    body += ["", "Files:"] + [f"  {path}" for path in files]
    ran = [c for c in plan.checks + extra_checks if not c.skipped]
    skipped = [c.label for c in plan.checks + extra_checks if c.skipped]
    body += ["", "Checks passed:"]
    body += [f"  {c.label}: {c.reason}" for c in ran]
    if skipped:  # not run: the warnings say what that left unchecked
        body += ["", "Checks skipped:"] + [f"  {label}" for label in skipped]
    warnings = plan.warnings + tuple(c.warning for c in extra_checks if c.warning)
    if warnings:
        body += ["", "Warnings:"] + [f"  {w}" for w in warnings]
    if plan.cannot_undo:
        body += ["", "Cannot undo:"] + [f"  {line}" for line in plan.cannot_undo]
    if len(plan.steps) > 1:
        body += ["", "Next:"] + [f"  {s.title}: {s.note}" for s in plan.steps[1:]]
    body += ["", f"{TRAILER}: {step.action}"]
    if plan.reverts:
        body += [f"{REVERTS_TRAILER}: {plan.reverts}"]
    body += [f"{key}: {value}" for key, value in plan.trailers]
    body += [f"Gpugate-Stack-From: {_summary(plan.current)}", f"Gpugate-Stack-To: {_summary(step.stack)}"]
    return "\n".join(body) + "\n"


