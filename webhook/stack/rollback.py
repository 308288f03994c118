"""Plan going back one stack commit: the same checks as any change, and what going back cannot undo. Pure.

A rollback is planned and committed like an upgrade (never ``git revert``): ``plan_rollback``
restores stack.yaml as it was before the commit and runs the rules of ``webhook.stack.checks``
that the rollback action takes; ``cannot_undo`` names what the files alone do not bring back.
"""

from __future__ import annotations

from collections.abc import Mapping

from webhook.errors import GpugateError
from webhook.stack import checks
from webhook.stack.checks import NO_CONTEXT, NO_WAIVERS, ROLLBACK, Change, ChangeContext, ExistingDrivers, Waivers
from webhook.stack.model import Stack
from webhook.stack.plan import ChangePlan, Step, fail
from webhook.stack.releases import Matrix


def cannot_undo(current: Stack, target: Stack) -> list[str]:
    """What moving the stack from ``current`` back to ``target`` does not restore (said, never hidden)."""
    lines: list[str] = []
    if target.operator_version < current.operator_version:
        lines.append(f"gpu-operator {current.operator_version} -> {target.operator_version} is a downgrade: NVIDIA "
                     f"supports upgrades only (within a release line or to the next), so this path is untested")
        lines.append(f"the CRDs go back too: the Application renders the chart with --include-crds, so Argo CD "
                     f"applies {target.operator_version}'s crds/ over {current.operator_version}'s "
                     f"(operator.upgradeCRD: false only disables the chart's CRD-upgrade hook); fields only the "
                     f"newer CRDs declare are pruned from ClusterPolicy and NVIDIADriver objects on their next "
                     f"write, and whatever the newer operator stored in them is lost")
    if current.management == "nvidiadriver" and target.management == "clusterpolicy":
        names = ", ".join(p.resource_name for p in current.pools)
        lines.append(f"the NVIDIADriver CRs {names} are pruned and the ClusterPolicy takes the driver back: every "
                     f"GPU node's driver pod is replaced, and the operator's nvidia.com/gpu-operator.driver.owner "
                     f"labels stay on the nodes until it clears them")
    before = {p.name: p for p in current.pools}
    moved = [p.name for p in target.pools if p.name in before and p.driver != before[p.name].driver]
    if moved or target.operator_version != current.operator_version:
        lines.append(f"drivers are replaced through the same node-by-node upgrade state machine "
                     f"(pools {', '.join(moved) or 'all, with the operator'}): GPU pods are evicted again; a node "
                     f"left in upgrade-failed stays there until relabelled upgrade-required")
    gone = [p.name for p in current.pools if p.name not in {q.name for q in target.pools}]
    if gone:
        lines.append(f"pool(s) {', '.join(gone)} disappear: their NVIDIADrivers are pruned and their nodes fall back "
                     f"to the default pool's driver")
    lines.append("node labels and annotations set by hand (nvidia.com/gpu-driver-upgrade.skip, pool labels) and "
                 "changes made outside stack.yaml are not rolled back")
    return lines


def plan_rollback(matrix: Matrix, current: Stack, target: Stack, *, sha: str, subject: str, why: str = "",
                  waivers: Waivers = NO_WAIVERS, existing: ExistingDrivers,
                  context: ChangeContext = NO_CONTEXT) -> ChangePlan:
    """Check going back from ``current`` to ``target`` (stack.yaml before commit ``sha``) like any change.

    The cluster keeps its Kubernetes minor, so ``target`` takes ``current``'s; everything else of
    ``target`` is restored and run through the same checks an upgrade takes, plus the downgrade rule.
    """
    target = target.replace(kubernetes_minor=current.kubernetes_minor)
    title = "rollback " + subject.removeprefix("gpugate stack: ")
    try:
        release = matrix.release(target.operator_version)
        matrix.release(current.operator_version)
    except GpugateError as err:
        return ChangePlan(action="rollback", current=current, steps=(), checks=(fail("release-known", str(err)),),
                    reverts=sha, reverts_why=why)
    change = Change(action=ROLLBACK, matrix=matrix, release=release, current=current, final=target,
                    pools=checks.changed_pools(current, target), existing=existing, waivers=waivers, context=context)
    found = checks.run_checks(change)
    undo = tuple(cannot_undo(current, target))
    step = Step(action="rollback", stack=target, title=title)
    return ChangePlan(action="rollback", current=current, steps=(step,), checks=tuple(found), reverts=sha,
                reverts_why=why, cannot_undo=undo)


def plan_pool_rollback(matrix: Matrix, current: Stack, *, drivers: Mapping[str, str], sha: str, subject: str,
                       existing: ExistingDrivers, context: ChangeContext = NO_CONTEXT) -> ChangePlan:
    """Put pools back on the drivers they ran before commit ``sha`` changed them, checked like any
    rollback: what a canary decision commits when pools failed (the other pools keep their drivers)."""
    target = current
    for pool, driver in drivers.items():
        target = target.with_pool(pool, driver=driver)
    try:
        release = matrix.release(current.operator_version)
    except GpugateError as err:
        return ChangePlan(action="rollback", current=current, steps=(), checks=(fail("release-known", str(err)),),
                    reverts=sha)
    change = Change(action=ROLLBACK, matrix=matrix, release=release, current=current, final=target,
                    pools=tuple(drivers), existing=existing, context=context)
    title = "rollback " + "; ".join(f"pool {p} driver {current.pool(p).driver} -> {d}" for p, d in drivers.items())
    step = Step(action="rollback", stack=target, title=title)
    return ChangePlan(action="rollback", current=current, steps=(step,), checks=tuple(checks.run_checks(change)),
                reverts=sha, reverts_why=f"{sha[:12]} ({subject}) for pool(s) {', '.join(drivers)} only",
                cannot_undo=tuple(cannot_undo(current, target)))
