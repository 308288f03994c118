"""Every rule a stack change is checked by, in one ordered list each planner filters. Pure.

A planner (``webhook.stack.plan``) works out the change (the stack before and after, the pools
whose driver the change touches, what the user waived) as a ``Change``, then runs
``run_checks``: every ``StackCheck`` of ``CHECKS`` whose ``actions`` name the planner's action, in
the list's order. Adding a rule is one entry here (its function in ``compat``, or a few lines
below) plus its test; no planner changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.errors import GpugateError
from webhook.stack import compat
from webhook.stack.compat import Check
from webhook.stack.model import Stack
from webhook.stack.releases import Matrix, Release

ExistingDrivers = Mapping[str, Mapping[str, Any]]
"""NVIDIADriver objects already in Git (and so in the cluster), by CR name."""

UPGRADE, SYNC, PROMOTE, ROLLBACK = "upgrade", "sync", "promote", "rollback"


@dataclass(frozen=True)
class Waivers:
    """What the user accepted on the command line (each an ``--allow-...`` flag); all off by default.

    A waived rule still runs: its check passes with a warning that names the flag, and the commit says so.
    """

    unvalidated_driver: bool = False
    """--allow-unvalidated-driver: a driver outside the target release's validated branches."""
    unlisted_driver: bool = False
    """--allow-unlisted-driver: a driver version not in the list of published driver images."""
    driver_downgrade: bool = False
    """--allow-driver-downgrade: a pool moves to an older driver."""
    operator_downgrade: bool = False
    """--allow-operator-downgrade: a rollback lowers the GPU Operator (and its CRDs)."""


NO_WAIVERS = Waivers()
"""Nothing waived: every rule is held to the letter (the default of every planner)."""


@dataclass(frozen=True, kw_only=True)
class Change:
    """A planned change as every check sees it."""

    action: str
    matrix: Matrix
    release: Release
    """The matrix entry of ``final``'s operator version."""
    current: Stack
    final: Stack
    pools: tuple[str, ...] = ()
    """Pools whose driver the driver rules look at (the planner's choice: changed, or all on an operator move)."""
    existing: ExistingDrivers = field(default_factory=dict)
    waivers: Waivers = NO_WAIVERS
    scope: Check | None = None
    """The planner's verdict on which pools a scoped change (``--pool``, promote) touches."""

    @property
    def operator_moves(self) -> bool:
        return self.final.operator_version != self.current.operator_version


@dataclass(frozen=True)
class StackCheck:
    """One rule: its name, the planners (actions) that run it, and what it makes of a change."""

    name: str
    actions: frozenset[str]
    run: Callable[[Change], list[Check]]


def changed_pools(current: Stack, final: Stack) -> tuple[str, ...]:
    """The pools of ``final`` whose driver differs from ``current``'s, or all when the operator moves."""
    before = {p.name: p.driver for p in current.pools}
    moves = final.operator_version != current.operator_version
    return tuple(p.name for p in final.pools if moves or before.get(p.name) != p.driver)


def _release_path(change: Change) -> list[Check]:
    return [compat.check_release_path(change.matrix, change.current.operator_version,
                                      change.final.operator_version)]


def _rollback_path(change: Change) -> list[Check]:
    return [compat.check_rollback_path(change.matrix, change.current.operator_version, change.final.operator_version,
                                       allow_downgrade=change.waivers.operator_downgrade)]


def _kubernetes(change: Change) -> list[Check]:
    return [compat.check_kubernetes(change.release, change.final.kubernetes_minor)]


def _scope(change: Change) -> list[Check]:
    return [change.scope] if change.scope is not None else []


def _driver_management(change: Change) -> list[Check]:
    current, final = change.current, change.final
    return [compat.check_driver_management(change.matrix, current=current.operator_version,
                                           current_mode=current.management, target=final.operator_version,
                                           target_mode=final.management)]


def _one_commit_edit(change: Change) -> list[Check]:
    """A hand edit cannot be the two-commit driver migration: only ``stack upgrade`` plans that."""
    current, final = change.current, change.final
    if compat.migration_steps(change.matrix, current=current.operator_version, current_mode=current.management,
                              target=final.operator_version, target_mode=final.management) <= 1:
        return []
    return [Check(name="driver-management", ok=False,
                  reason="a hand edit cannot move the driver to NVIDIADriver and upgrade the operator in one "
                         "commit; use `gpugate stack upgrade --driver-management nvidiadriver`, which plans the "
                         "two commits")]


def _pool_rules(change: Change) -> list[Check]:
    try:
        change.final.check_pools()
    except GpugateError as err:
        return [Check(name="pools", ok=False, reason=str(err))]
    return [Check(name="pools", ok=True, reason=f"{len(change.final.pools)} pool(s) with distinct names and selectors")]


def _driver_path(change: Change) -> list[Check]:
    """For every pool whose driver changes: an upgrade, or a downgrade that needs --allow-driver-downgrade."""
    before = {p.name: p.driver for p in change.current.pools}
    return [compat.check_driver_path(pool=p.name, current=before[p.name], target=p.driver,
                                     allow_downgrade=change.waivers.driver_downgrade)
            for p in change.final.pools if p.name in before and before[p.name] != p.driver]


def _drivers(change: Change) -> list[Check]:
    """Each looked-at pool's driver: published as an image, validated for the release, not known bad with MIG."""
    checks: list[Check] = []
    for name in change.pools:
        pool = change.final.pool(name)
        checks.append(compat.check_driver_published(change.matrix, change.release, pool=name, driver=pool.driver,
                                                    use_precompiled=pool.use_precompiled,
                                                    allow_unlisted=change.waivers.unlisted_driver))
        checks.append(compat.check_driver_validated(change.release, pool=name, driver=pool.driver,
                                                    allow_unvalidated=change.waivers.unvalidated_driver))
        checks.append(compat.check_mig_mixed(change.matrix, pool=name, driver=pool.driver,
                                             mixes_mig_and_full=pool.mig_and_full_gpus))
    return checks


def _immutable(change: Change) -> list[Check]:
    if change.final.management != "nvidiadriver":
        return []
    checks = []
    for pool in change.final.pools:
        old = change.existing.get(pool.resource_name)
        if old is None:
            continue
        new = {"driverType": pool.driver_type, "usePrecompiled": pool.use_precompiled}
        checks.append(compat.check_immutable(cr_name=pool.resource_name, old=old.get("spec") or {}, new=new))
    return checks


def _component_overrides(change: Change) -> list[Check]:
    if not change.operator_moves:
        return []
    return compat.check_component_overrides(change.release, change.final.components)


def _actions(*names: str) -> frozenset[str]:
    return frozenset(names)


CHECKS: tuple[StackCheck, ...] = (
    StackCheck("release-path", _actions(UPGRADE, SYNC), _release_path),
    StackCheck("rollback-path", _actions(ROLLBACK), _rollback_path),
    StackCheck("kubernetes", _actions(UPGRADE, SYNC, ROLLBACK), _kubernetes),
    StackCheck("pool-scope", _actions(UPGRADE, PROMOTE), _scope),
    StackCheck("driver-management", _actions(UPGRADE, SYNC, ROLLBACK), _driver_management),
    StackCheck("one-commit-edit", _actions(SYNC), _one_commit_edit),
    StackCheck("pools", _actions(UPGRADE, SYNC, ROLLBACK), _pool_rules),
    StackCheck("driver-path", _actions(UPGRADE, SYNC, PROMOTE), _driver_path),
    StackCheck("drivers", _actions(UPGRADE, SYNC, PROMOTE, ROLLBACK), _drivers),
    StackCheck("immutable-fields", _actions(UPGRADE, SYNC, PROMOTE, ROLLBACK), _immutable),
    StackCheck("component-override", _actions(UPGRADE, SYNC), _component_overrides),
)
"""The rules in the order a plan lists them; ``actions`` says which planners run each."""


def run_checks(change: Change, *, through: str | None = None) -> list[Check]:
    """The checks of ``CHECKS`` that ``change.action`` runs, in order; ``through`` stops after that entry."""
    checks: list[Check] = []
    for entry in CHECKS:
        if change.action in entry.actions:
            checks += entry.run(change)
        if entry.name == through:
            break
    return checks
