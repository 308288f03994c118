"""Plan a stack change: the checks it must pass and the commits it takes. Pure: data in, ChangePlan out.

``plan_upgrade``, ``plan_sync`` and ``plan_promote`` (and ``rollback.plan_rollback``) work out the
stack a change leaves behind and run the rules of ``webhook.stack.checks`` their action takes; they
never touch files or git. ``webhook.stack.upgrade`` turns a passing plan into edited files and one
commit (its message: ``webhook.stack.messages``), and ``gpugate stack plan`` only prints it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.errors import GpugateError
from webhook.stack import compat
from webhook.stack.checks import (
    NO_CONTEXT,
    NO_WAIVERS,
    PROMOTE,
    SYNC,
    UPGRADE,
    Change,
    ChangeContext,
    ExistingDrivers,
    Waivers,
    changed_pools,
    run_checks,
)
from webhook.stack.compat import Check
from webhook.stack.model import Pool, Stack
from webhook.stack.releases import Matrix, OperatorVersion, driver_branch, parse_minor

__all__ = ["ChangeContext", "ExistingDrivers", "ChangePlan", "Request", "Step", "Waivers", "plan_promote", "plan_sync",
           "plan_upgrade"]


@dataclass(frozen=True, kw_only=True)
class Request:
    """What the user asked for on the command line."""

    operator: str
    driver: str | None = None
    pool: str | None = None
    kubernetes: str | None = None
    waivers: Waivers = NO_WAIVERS
    driver_management: str | None = None


@dataclass(frozen=True, kw_only=True)
class Step:
    """One commit of a plan and the stack.yaml it leaves behind."""

    action: str
    title: str
    stack: Stack
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class ChangePlan:
    action: str
    current: Stack
    steps: tuple[Step, ...]
    checks: tuple[Check, ...]
    reverts: str = ""
    """For a rollback: the sha of the stack commit it undoes (the Gpugate-Reverts trailer)."""
    reverts_why: str = ""
    """For a rollback: why that commit (the newer stack commits it passed over, and why each)."""
    cannot_undo: tuple[str, ...] = ()
    """For a rollback: what going back does not restore, said in the output and the commit."""
    notes: tuple[str, ...] = ()
    """Lines the commit message carries under ``Why:`` (a canary decision's failure mode and evidence)."""
    trailers: tuple[tuple[str, str], ...] = ()
    """Extra git trailers of the commit (the canary decision's pool, rollout and mode)."""

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(c.ok for c in self.checks)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(c.warning for c in self.checks if c.warning)

    def with_checks(self, extra: tuple[Check, ...]) -> ChangePlan:
        return dataclasses.replace(self, checks=self.checks + extra)


def fail(name: str, reason: str, subject: str = "") -> Check:
    """A failed check named ``name``; a planner's refusal before any rule runs."""
    return Check(name=name, ok=False, reason=reason, subject=subject)


def _refused(action: str, current: Stack, check: Check) -> ChangePlan:
    return ChangePlan(action=action, current=current, steps=(), checks=(check,))


def _upgrade_scope(current: Stack, request: Request, target: OperatorVersion, target_mode: str) -> Check | None:
    """The ``--pool`` verdict of an upgrade (None without --pool): only that pool's NVIDIADriver changes."""
    if request.pool is None:
        return None
    problem = ""
    if request.pool not in {p.name for p in current.pools}:
        problem = f"stack.yaml has no pool {request.pool!r} (pools: {', '.join(p.name for p in current.pools)})"
    elif current.management != "nvidiadriver" or target_mode != "nvidiadriver":
        problem = "--pool needs per-pool drivers (driver.management nvidiadriver); the ClusterPolicy has one driver"
    elif target != current.operator_version:
        problem = (f"--pool upgrades only that pool's NVIDIADriver, but --operator {target} differs from "
                   f"the stack's {current.operator_version}; upgrade the operator for all pools first")
    elif request.driver is None:
        problem = "--pool needs --driver (the version the pool's NVIDIADriver moves to)"
    if problem:
        return fail("pool-scope", problem, request.pool)
    return Check(name="pool-scope", subject=request.pool, ok=True,
                 reason=f"only NVIDIADriver {current.pool(request.pool).resource_name} changes")


def _upgrade_final(current: Stack, request: Request, target: OperatorVersion, minor: int,
                   target_mode: str) -> tuple[Stack, list[str]]:
    """The stack an upgrade leaves behind, and the pools whose driver it sets."""
    if request.pool is not None:
        pools_changed = [request.pool]
    else:
        pools_changed = [p.name for p in current.pools] if request.driver is not None else []
    final = current.replace(operator_version=target, kubernetes_minor=minor, management=target_mode)
    for name in pools_changed:
        final = final.with_pool(name, driver=request.driver)
    if target_mode == "nvidiadriver" and current.management == "clusterpolicy" and len(final.pools) == 1:
        final = final.with_pool(final.pools[0].name, default=True, node_selector={})
    return final, pools_changed


def _upgrade_steps(matrix: Matrix, current: Stack, final: Stack, request: Request) -> tuple[Step, ...]:
    """One commit, or two when the driver moves to NVIDIADriver from a release older than the move needs."""
    count = compat.migration_steps(matrix, current=current.operator_version, current_mode=current.management,
                                   target=final.operator_version, target_mode=final.management)
    if count != 2:
        return (Step(action="upgrade", stack=final, title=_upgrade_title(current, final, request)),)
    first = final.replace(management=current.management)
    if len(first.pools) == 1:
        first = first.with_pool(first.pools[0].name, default=current.pools[0].default,
                                node_selector=current.pools[0].node_selector)
    return (
        Step(action="upgrade", stack=first,
             title=f"upgrade gpu-operator {current.operator_version} -> {final.operator_version} (step 1 of 2)",
             note="ClusterPolicy keeps managing the driver; sync and wait for Healthy before step 2"),
        Step(action="upgrade", stack=final,
             title=f"move the driver to NVIDIADriver per pool at {final.operator_version} (step 2 of 2)",
             note="made by running the same command again once step 1 is synced and healthy"),
    )


def plan_upgrade(matrix: Matrix, current: Stack, request: Request, existing: ExistingDrivers,
                 context: ChangeContext = NO_CONTEXT) -> ChangePlan:
    """Check an upgrade of the operator and/or drivers and split it into the commits it needs."""
    try:
        target = OperatorVersion.parse(request.operator)
        minor = parse_minor(request.kubernetes) if request.kubernetes else current.kubernetes_minor
        if request.driver is not None:
            driver_branch(request.driver)
    except GpugateError as err:
        return _refused(UPGRADE, current, fail("arguments", str(err)))
    try:
        release = matrix.release(target)
    except GpugateError as err:
        return _refused(UPGRADE, current, fail("release-known", str(err)))
    try:
        matrix.release(current.operator_version)
    except GpugateError as err:
        return _refused(UPGRADE, current, fail("release-known", f"stack.yaml declares an unknown release: {err}"))
    target_mode = request.driver_management or current.management
    scope = _upgrade_scope(current, request, target, target_mode)
    if scope is not None and not scope.ok:
        change = Change(action=UPGRADE, matrix=matrix, release=release, current=current, scope=scope,
                        final=current.replace(operator_version=target, kubernetes_minor=minor), context=context)
        return ChangePlan(action=UPGRADE, current=current, steps=(), checks=tuple(run_checks(change,
                                                                                             through="pool-scope")))
    final, pools_changed = _upgrade_final(current, request, target, minor, target_mode)
    pools = [p.name for p in final.pools] if target != current.operator_version else pools_changed
    change = Change(action=UPGRADE, matrix=matrix, release=release, current=current, final=final,
                    pools=tuple(pools), existing=existing, waivers=request.waivers, scope=scope, context=context)
    return ChangePlan(action=UPGRADE, current=current, steps=_upgrade_steps(matrix, current, final, request),
                checks=tuple(run_checks(change)))


def _upgrade_title(current: Stack, final: Stack, request: Request) -> str:
    parts = []
    if final.operator_version != current.operator_version:
        parts.append(f"gpu-operator {current.operator_version} -> {final.operator_version}")
    if final.management != current.management:
        parts.append(f"driver management {current.management} -> {final.management}")
    before = {p.name: p for p in current.pools}
    after = {p.name: p for p in final.pools}
    for pool in final.pools:
        if pool.name not in before:
            parts.append(f"add pool {pool.name} (driver {pool.driver})")
    for pool in current.pools:
        if pool.name not in after:
            parts.append(f"remove pool {pool.name}")
    changed = [p for p in final.pools if p.name in before and p.driver != before[p.name].driver]
    raised = [p for p in changed if not compat.is_driver_downgrade(before[p.name].driver, p.driver)]
    lowered = [p for p in changed if compat.is_driver_downgrade(before[p.name].driver, p.driver)]
    if raised:
        parts.append(_drivers_on(raised))
    if final.kubernetes_minor != current.kubernetes_minor:
        parts.append(f"kubernetes 1.{current.kubernetes_minor} -> 1.{final.kubernetes_minor}")
    downgrade = ""
    if lowered:
        was = sorted({before[p.name].driver for p in lowered})
        downgrade = f"downgrade {_drivers_on(lowered)} (from {', '.join(was)})"
    if not parts:
        return downgrade or "upgrade stack.yaml settings (no version change)"
    return "upgrade " + "; ".join(parts) + (f"; {downgrade}" if downgrade else "")


def _drivers_on(pools: Sequence[Pool]) -> str:
    drivers = sorted({p.driver for p in pools})
    names = ", ".join(p.name for p in pools)
    return f"driver {', '.join(drivers)} on {'pool' if len(pools) == 1 else 'pools'} {names}"


def is_migration_second_step(plan: ChangePlan) -> bool:
    """True when this commit hands the driver from the ClusterPolicy to NVIDIADriver CRs (step 2 of 2)."""
    return (len(plan.steps) == 1 and plan.current.management == "clusterpolicy"
            and plan.steps[0].stack.management == "nvidiadriver")


def check_previous_step_healthy(cluster_policies: Sequence[Mapping[str, Any]] | None) -> Check:
    """Step 2 of the migration starts only once step 1 is synced and the ClusterPolicy is ready."""
    name = "previous-step-healthy"
    if cluster_policies is None:
        return Check(name=name, ok=True, reason="not checked against the cluster (no --kube/--server)",
                     warning="make sure Argo CD shows gpu-operator Synced and Healthy (ClusterPolicy ready) "
                             "before this commit; pass --kube to have it checked")
    ready = [p for p in cluster_policies
             if (p.get("status") or {}).get("state") == "ready"
             and any(c.get("type") == "Ready" and c.get("status") == "True"
                     for c in (p.get("status") or {}).get("conditions") or [])]
    if ready:
        return Check(name=name, ok=True, reason=f"ClusterPolicy {ready[0].get('metadata', {}).get('name')} is ready")
    states = ", ".join(f"{(p.get('metadata') or {}).get('name')}={(p.get('status') or {}).get('state', '(no status)')}"
                       for p in cluster_policies) or "no ClusterPolicy"
    return fail(name, f"step 1 is not healthy yet ({states}); wait for ClusterPolicy ready before moving the driver")


def plan_sync(matrix: Matrix, current: Stack, edited: Stack, *, existing: ExistingDrivers,
              waivers: Waivers = NO_WAIVERS, context: ChangeContext = NO_CONTEXT) -> ChangePlan:
    """Check a hand edit of stack.yaml (``current`` = HEAD, ``edited`` = the working tree) by the same rules.

    For what has no command of its own: a pool's upgradePolicy (pause with autoUpgrade: false),
    a new pool, a new crName. Anything a command can do takes the same checks here.
    """
    try:
        release = matrix.release(edited.operator_version)
        matrix.release(current.operator_version)
    except GpugateError as err:
        return _refused(SYNC, current, fail("release-known", str(err)))
    change = Change(action=SYNC, matrix=matrix, release=release, current=current, final=edited,
                    pools=changed_pools(current, edited), existing=existing, waivers=waivers, context=context)
    step = Step(action=SYNC, stack=edited,
                title="sync " + _upgrade_title(current, edited, Request(operator="")).removeprefix("upgrade "))
    return ChangePlan(action=SYNC, current=current, steps=(step,), checks=tuple(run_checks(change)))


def _promote_targets(current: Stack, source: str, to: str) -> tuple[list[str], str]:
    """The pools a promote carries the driver to, or the reason it cannot."""
    names = [p.name for p in current.pools]
    if current.management != "nvidiadriver":
        return [], "promote needs per-pool drivers (driver.management nvidiadriver)"
    if source not in names:
        return [], f"stack.yaml has no pool {source!r} (pools: {', '.join(names)})"
    targets = [n for n in names if n != source] if to == "all" else [t for t in to.split(",") if t]
    unknown = [t for t in targets if t not in names]
    if unknown:
        return [], f"stack.yaml has no pool {unknown[0]!r} (pools: {', '.join(names)})"
    if source in targets:
        return [], f"--from and --to are both {source}"
    if not targets:
        return [], f"there is no pool other than {source}"
    return targets, ""


def plan_promote(matrix: Matrix, current: Stack, *, source: str, to: str, existing: ExistingDrivers,
                 waivers: Waivers = NO_WAIVERS, context: ChangeContext = NO_CONTEXT) -> ChangePlan:
    """Carry the ``source`` pool's driver to pool ``to`` (or every other pool with ``all``) in one commit."""
    targets, problem = _promote_targets(current, source, to)
    if problem:
        return _refused(PROMOTE, current, fail("pool-scope", problem))
    driver = current.pool(source).driver
    final = current
    for name in targets:
        final = final.with_pool(name, driver=driver)
    scope = Check(name="pool-scope", ok=True, reason=f"driver {driver} from pool {source} to {', '.join(targets)}")
    change = Change(action=PROMOTE, matrix=matrix, release=matrix.release(current.operator_version),
                    current=current, final=final, pools=tuple(targets), existing=existing, waivers=waivers,
                    scope=scope, context=context)
    lowered = sorted({current.pool(n).driver for n in targets
                      if compat.is_driver_downgrade(current.pool(n).driver, driver)})
    title = f"promote driver {driver} from pool {source} to {'all pools' if to == 'all' else 'pool ' + to}"
    if lowered:
        title += f" (a downgrade from {', '.join(lowered)})"
    step = Step(action=PROMOTE, stack=final, title=title)
    return ChangePlan(action=PROMOTE, current=current, steps=(step,), checks=tuple(run_checks(change)))
