"""Plan a stack change: the checks it must pass and the commits it takes. Pure: data in, Plan out.

``plan_upgrade`` and ``plan_promote`` never touch files or git; ``webhook.stack.upgrade`` turns a
passing plan into edited files and one commit, and ``gpugate stack plan`` only prints it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.errors import GpugateError
from webhook.stack import compat
from webhook.stack.compat import Check, Matrix, OperatorVersion
from webhook.stack.model import Pool, Stack

TRAILER = "Gpugate-Stack"
"""The git trailer that marks a stack commit; its value is the action (upgrade, promote, rollback)."""
REVERTS_TRAILER = "Gpugate-Reverts"

ExistingDrivers = Mapping[str, Mapping[str, Any]]
"""NVIDIADriver objects already in Git (and so in the cluster), by CR name."""


@dataclass(frozen=True, kw_only=True)
class Request:
    """What the user asked for on the command line."""

    operator: str
    driver: str | None = None
    pool: str | None = None
    kubernetes: str | None = None
    allow_unvalidated_driver: bool = False
    allow_unlisted_driver: bool = False
    allow_driver_downgrade: bool = False
    driver_management: str | None = None


@dataclass(frozen=True, kw_only=True)
class Step:
    """One commit of a plan and the stack.yaml it leaves behind."""

    action: str
    title: str
    stack: Stack
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Plan:
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

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(c.ok for c in self.checks)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(c.warning for c in self.checks if c.warning)

    def with_checks(self, extra: tuple[Check, ...]) -> Plan:
        return dataclasses.replace(self, checks=self.checks + extra)


def _fail(name: str, reason: str, subject: str = "") -> Check:
    return Check(name=name, ok=False, reason=reason, subject=subject)


def _driver_checks(matrix: Matrix, release: compat.Release, stack: Stack, pools: list[str],
                   allow_unvalidated: bool, allow_unlisted: bool) -> list[Check]:
    checks: list[Check] = []
    for name in pools:
        pool = stack.pool(name)
        checks.append(compat.check_driver_published(matrix, release, pool=name, driver=pool.driver,
                                                    use_precompiled=pool.use_precompiled,
                                                    allow_unlisted=allow_unlisted))
        checks.append(compat.check_driver_validated(release, pool=name, driver=pool.driver,
                                                    allow_unvalidated=allow_unvalidated))
        checks.append(compat.check_mig_mixed(matrix, pool=name, driver=pool.driver,
                                             mixes_mig_and_full=pool.mig_and_full_gpus))
    return checks


def _driver_path_checks(current: Stack, final: Stack, allow_downgrade: bool) -> list[Check]:
    """For every pool whose driver changes: an upgrade, or a downgrade that needs --allow-driver-downgrade."""
    before = {p.name: p.driver for p in current.pools}
    return [compat.check_driver_path(pool=p.name, current=before[p.name], target=p.driver,
                                     allow_downgrade=allow_downgrade)
            for p in final.pools if p.name in before and before[p.name] != p.driver]


def _immutable_checks(stack: Stack, existing: ExistingDrivers) -> list[Check]:
    if stack.management != "nvidiadriver":
        return []
    checks = []
    for pool in stack.pools:
        old = existing.get(pool.resource_name)
        if old is None:
            continue
        new = {"driverType": pool.driver_type, "usePrecompiled": pool.use_precompiled}
        checks.append(compat.check_immutable(cr_name=pool.resource_name, old=old.get("spec") or {}, new=new))
    return checks


def _pool_rules(stack: Stack) -> Check:
    try:
        stack.check_pools()
    except GpugateError as err:
        return _fail("pools", str(err))
    return Check(name="pools", ok=True, reason=f"{len(stack.pools)} pool(s) with distinct names and selectors")


def plan_upgrade(matrix: Matrix, current: Stack, request: Request, existing: ExistingDrivers) -> Plan:
    """Check an upgrade of the operator and/or drivers and split it into the commits it needs."""
    checks: list[Check] = []
    try:
        target_version = OperatorVersion.parse(request.operator)
        minor = compat.parse_minor(request.kubernetes) if request.kubernetes else current.kubernetes_minor
        if request.driver is not None:
            compat.driver_branch(request.driver)
    except GpugateError as err:
        return Plan(action="upgrade", current=current, steps=(), checks=(_fail("arguments", str(err)),))
    try:
        release = matrix.release(target_version)
    except GpugateError as err:
        return Plan(action="upgrade", current=current, steps=(), checks=(_fail("release-known", str(err)),))
    try:
        matrix.release(current.operator_version)
    except GpugateError as err:
        return Plan(action="upgrade", current=current, steps=(),
                    checks=(_fail("release-known", f"stack.yaml declares an unknown release: {err}"),))
    target_mode = request.driver_management or current.management

    checks.append(compat.check_release_path(matrix, current.operator_version, target_version))
    checks.append(compat.check_kubernetes(release, minor))

    pools_changed: list[str] = []
    if request.pool is not None:
        scope_problem = ""
        if request.pool not in {p.name for p in current.pools}:
            scope_problem = (f"stack.yaml has no pool {request.pool!r} "
                             f"(pools: {', '.join(p.name for p in current.pools)})")
        elif current.management != "nvidiadriver" or target_mode != "nvidiadriver":
            scope_problem = ("--pool needs per-pool drivers (driver.management nvidiadriver); "
                             "the ClusterPolicy has one driver")
        elif target_version != current.operator_version:
            scope_problem = (f"--pool upgrades only that pool's NVIDIADriver, "
                             f"but --operator {target_version} differs from "
                             f"the stack's {current.operator_version}; upgrade the operator for all pools first")
        elif request.driver is None:
            scope_problem = "--pool needs --driver (the version the pool's NVIDIADriver moves to)"
        if scope_problem:
            checks.append(_fail("pool-scope", scope_problem, request.pool))
            return Plan(action="upgrade", current=current, steps=(), checks=tuple(checks))
        checks.append(Check(name="pool-scope", subject=request.pool, ok=True,
                            reason=f"only NVIDIADriver {current.pool(request.pool).resource_name} changes"))
        pools_changed = [request.pool]
    elif request.driver is not None:
        pools_changed = [p.name for p in current.pools]

    final = current.replace(operator_version=target_version, kubernetes_minor=minor, management=target_mode)
    for name in pools_changed:
        final = final.with_pool(name, driver=request.driver)
    if target_mode == "nvidiadriver" and current.management == "clusterpolicy" and len(final.pools) == 1:
        final = final.with_pool(final.pools[0].name, default=True, node_selector={})

    checks.append(compat.check_driver_management(matrix, current=current.operator_version,
                                                 current_mode=current.management, target=target_version,
                                                 target_mode=target_mode))
    checks.append(_pool_rules(final))
    checks += _driver_path_checks(current, final, request.allow_driver_downgrade)
    driver_pools = [p.name for p in final.pools] if target_version != current.operator_version else pools_changed
    checks += _driver_checks(matrix, release, final, driver_pools, request.allow_unvalidated_driver,
                             request.allow_unlisted_driver)
    checks += _immutable_checks(final, existing)
    if target_version != current.operator_version:
        checks += compat.check_component_overrides(release, final.components)

    count = compat.migration_steps(matrix, current=current.operator_version, current_mode=current.management,
                                   target=target_version, target_mode=target_mode)
    steps: tuple[Step, ...]
    if count == 2:
        first = final.replace(management=current.management)
        if len(first.pools) == 1:
            first = first.with_pool(first.pools[0].name, default=current.pools[0].default,
                                    node_selector=current.pools[0].node_selector)
        steps = (
            Step(action="upgrade", stack=first,
                 title=f"upgrade gpu-operator {current.operator_version} -> {target_version} (step 1 of 2)",
                 note="ClusterPolicy keeps managing the driver; sync and wait for Healthy before step 2"),
            Step(action="upgrade", stack=final,
                 title=f"move the driver to NVIDIADriver per pool at {target_version} (step 2 of 2)",
                 note="made by running the same command again once step 1 is synced and healthy"),
        )
    else:
        steps = (Step(action="upgrade", stack=final, title=_upgrade_title(current, final, request)),)
    return Plan(action="upgrade", current=current, steps=steps, checks=tuple(checks))


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


def is_migration_second_step(plan: Plan) -> bool:
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
    return _fail(name, f"step 1 is not healthy yet ({states}); wait for ClusterPolicy ready before moving the driver")


def plan_sync(matrix: Matrix, current: Stack, edited: Stack, *, allow_unvalidated_driver: bool,
              existing: ExistingDrivers, allow_unlisted_driver: bool = False,
              allow_driver_downgrade: bool = False) -> Plan:
    """Check a hand edit of stack.yaml (``current`` = HEAD, ``edited`` = the working tree) by the same rules.

    For what has no command of its own: a pool's upgradePolicy (pause with autoUpgrade: false),
    a new pool, a new crName. Anything a command can do takes the same checks here.
    """
    checks: list[Check] = []
    try:
        release = matrix.release(edited.operator_version)
        matrix.release(current.operator_version)
    except GpugateError as err:
        return Plan(action="sync", current=current, steps=(), checks=(_fail("release-known", str(err)),))
    checks.append(compat.check_release_path(matrix, current.operator_version, edited.operator_version))
    checks.append(compat.check_kubernetes(release, edited.kubernetes_minor))
    checks.append(compat.check_driver_management(matrix, current=current.operator_version,
                                                 current_mode=current.management, target=edited.operator_version,
                                                 target_mode=edited.management))
    if compat.migration_steps(matrix, current=current.operator_version, current_mode=current.management,
                              target=edited.operator_version, target_mode=edited.management) > 1:
        checks.append(_fail("driver-management", "a hand edit cannot move the driver to NVIDIADriver and upgrade "
                                                 "the operator in one commit; use `gpugate stack upgrade "
                                                 "--driver-management nvidiadriver`, which plans the two commits"))
    checks.append(_pool_rules(edited))
    checks += _driver_path_checks(current, edited, allow_driver_downgrade)
    old = {p.name: p.driver for p in current.pools}
    pools = [p.name for p in edited.pools
             if edited.operator_version != current.operator_version or old.get(p.name) != p.driver]
    checks += _driver_checks(matrix, release, edited, pools, allow_unvalidated_driver, allow_unlisted_driver)
    checks += _immutable_checks(edited, existing)
    step = Step(action="sync", stack=edited,
                title="sync " + _upgrade_title(current, edited, Request(operator="")).removeprefix("upgrade "))
    return Plan(action="sync", current=current, steps=(step,), checks=tuple(checks))


def plan_promote(matrix: Matrix, current: Stack, *, source: str, to: str, allow_unvalidated_driver: bool,
                 existing: ExistingDrivers, allow_unlisted_driver: bool = False,
                 allow_driver_downgrade: bool = False) -> Plan:
    """Carry the ``source`` pool's driver to pool ``to`` (or every other pool with ``all``) in one commit."""
    names = [p.name for p in current.pools]
    if current.management != "nvidiadriver":
        return Plan(action="promote", current=current, steps=(),
                    checks=(_fail("pool-scope", "promote needs per-pool drivers (driver.management nvidiadriver)"),))
    if source not in names:
        return Plan(action="promote", current=current, steps=(),
                    checks=(_fail("pool-scope", f"stack.yaml has no pool {source!r} (pools: {', '.join(names)})"),))
    targets = [n for n in names if n != source] if to == "all" else [to]
    problem = ""
    if to != "all" and to not in names:
        problem = f"stack.yaml has no pool {to!r} (pools: {', '.join(names)})"
    elif to == source:
        problem = f"--from and --to are both {source}"
    elif not targets:
        problem = f"there is no pool other than {source}"
    if problem:
        return Plan(action="promote", current=current, steps=(), checks=(_fail("pool-scope", problem),))
    driver = current.pool(source).driver
    final = current
    for name in targets:
        final = final.with_pool(name, driver=driver)
    release = matrix.release(current.operator_version)
    checks = [Check(name="pool-scope", ok=True, reason=f"driver {driver} from pool {source} to {', '.join(targets)}")]
    checks += _driver_path_checks(current, final, allow_driver_downgrade)
    checks += _driver_checks(matrix, release, final, targets, allow_unvalidated_driver, allow_unlisted_driver)
    checks += _immutable_checks(final, existing)
    lowered = sorted({current.pool(n).driver for n in targets
                      if compat.is_driver_downgrade(current.pool(n).driver, driver)})
    title = f"promote driver {driver} from pool {source} to {'all pools' if to == 'all' else 'pool ' + to}"
    if lowered:
        title += f" (a downgrade from {', '.join(lowered)})"
    step = Step(action="promote", stack=final, title=title)
    return Plan(action="promote", current=current, steps=(step,), checks=tuple(checks))


# ---------------------------------------------------------------------------- commit messages


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


def commit_message(plan: Plan, *, files: list[str], extra_checks: tuple[Check, ...] = ()) -> str:
    """The structured message of the plan's first commit: title, changes, checks passed, trailers."""
    step = plan.steps[0]
    body = [f"gpugate stack: {step.title}"[:200], ""]
    if plan.reverts:
        body += [f"This rolls back stack commit {plan.reverts}.", ""]
        if plan.reverts_why:
            body += [f"Chosen: {plan.reverts_why}.", ""]
    body += ["Changes:"]
    body += [f"  {line}" for line in changes(plan.current, step.stack)]
    body += ["", "Files:"] + [f"  {path}" for path in files]
    body += ["", "Checks passed:"]
    body += [f"  {c.label}: {c.reason}" for c in plan.checks + extra_checks]
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
    body += [f"Gpugate-Stack-From: {_summary(plan.current)}", f"Gpugate-Stack-To: {_summary(step.stack)}"]
    return "\n".join(body) + "\n"


# ---------------------------------------------------------------------------- rollback


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
                  allow_operator_downgrade: bool, allow_unvalidated_driver: bool, allow_unlisted_driver: bool,
                  existing: ExistingDrivers) -> Plan:
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
        return Plan(action="rollback", current=current, steps=(), checks=(_fail("release-known", str(err)),),
                    reverts=sha, reverts_why=why)
    checks: list[Check] = [
        compat.check_rollback_path(matrix, current.operator_version, target.operator_version,
                                   allow_downgrade=allow_operator_downgrade),
        compat.check_kubernetes(release, current.kubernetes_minor),
        compat.check_driver_management(matrix, current=current.operator_version,
                                       current_mode=current.management, target=target.operator_version,
                                       target_mode=target.management),
        _pool_rules(target),
    ]
    before = {p.name: p.driver for p in current.pools}
    pools = [p.name for p in target.pools
             if target.operator_version != current.operator_version or before.get(p.name) != p.driver]
    checks += _driver_checks(matrix, release, target, pools, allow_unvalidated_driver, allow_unlisted_driver)
    checks += _immutable_checks(target, existing)
    undo = tuple(cannot_undo(current, target))
    step = Step(action="rollback", stack=target, title=title)
    return Plan(action="rollback", current=current, steps=(step,), checks=tuple(checks), reverts=sha,
                reverts_why=why, cannot_undo=undo)
