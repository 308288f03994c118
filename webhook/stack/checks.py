"""Every rule a stack change is checked by, in one ordered list each planner filters. Pure.

A planner (``webhook.stack.plan``) works out the change (the stack before and after, the pools
whose driver the change touches, what the user waived) as a ``Change``, then runs
``run_checks``: every ``StackCheck`` of ``CHECKS`` whose ``actions`` name the planner's action, in
the list's order. Adding a rule is one entry here (its function in ``compat``, or a few lines
below) plus its test; no planner changes.
"""

from __future__ import annotations

from webhook.errors import GpugateError
from webhook.stack import compat, consumers, crdstate, dracutover, hardening, hardware, nodestates
from webhook.stack.change import (  # re-exported: the planners and commands import them from here
    NO_CONTEXT,
    NO_WAIVERS,
    PROMOTE,
    ROLLBACK,
    SYNC,
    UPGRADE,
    Change,
    ChangeContext,
    ExistingDrivers,
    StackCheck,
    Waivers,
    changed_pools,
    reloaded_pools,
)
from webhook.stack.compat import Check

__all__ = ["CHECKS", "NO_CONTEXT", "NO_WAIVERS", "PROMOTE", "ROLLBACK", "SYNC", "UPGRADE", "Change", "ChangeContext",
           "ExistingDrivers", "StackCheck", "Waivers", "changed_pools", "reloaded_pools", "run_checks"]


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
    return [Check(name="driver-management", ok=False, source=change.matrix.migration_source,
                  reason="a hand edit cannot move the driver to NVIDIADriver and upgrade the operator in one "
                         "commit: the old release's controller would delete driver pods before the new one owns "
                         "them",
                  fix="use `gpugate stack upgrade --driver-management nvidiadriver`, which plans the two commits "
                      "(the second once the first is synced and the ClusterPolicy ready)")]


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


def _device_hardening(change: Change) -> list[Check]:
    return [hardening.check_device_hardening(change.context.values, change.context.values_before)]


CLUSTER_RULES = ("upgrade-in-flight", "nodes-ready", "mig-state", "operands-ready", "gpu-consumers", "drain-emptydir",
                 "driver-switch", "crds-served", "crd-owner", "driver-hardware", "kernel-modules",
                 "precompiled-kernel", "toolkit-platform", "control-plane-gpu")
"""The rules that read the cluster: without one read they return nothing and ``cluster`` says so."""


def _cluster(change: Change) -> list[Check]:
    """One line on what the cluster rules read, or that they did not run."""
    state = change.context.cluster
    if state is None:
        return [Check(name="cluster", ok=True, skipped=True,
                      reason="not read (pass --kube, or --cluster-state FILE): the preflight rules "
                             + ", ".join(CLUSTER_RULES) + " did not run")]
    crds = "CRDs not read" if state.crds is None else f"{len(state.crds)} CRD(s)"
    return [Check(name="cluster", ok=True,
                  reason=f"read {state.source}: {len(state.gpu_nodes())} GPU node(s), {len(state.pods)} pod(s), "
                         f"{len(state.daemonsets)} DaemonSet(s), {crds}")]


def _actions(*names: str) -> frozenset[str]:
    return frozenset(names)


FORWARD = _actions(UPGRADE, SYNC, PROMOTE)
"""A change that starts a rollout; a rollback is never held by the state a rollout left."""

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
    StackCheck("device-hardening", _actions(UPGRADE, SYNC, PROMOTE, ROLLBACK), _device_hardening),
    StackCheck("dra-cutover", _actions(UPGRADE, SYNC), dracutover.check_dra_cutover),
    StackCheck("cluster", _actions(UPGRADE, SYNC, PROMOTE, ROLLBACK), _cluster),
    StackCheck("upgrade-in-flight", FORWARD, nodestates.check_upgrade_in_flight),
    StackCheck("nodes-ready", FORWARD, nodestates.check_nodes_ready),
    StackCheck("mig-state", FORWARD, nodestates.check_mig_state),
    StackCheck("operands-ready", FORWARD, nodestates.check_operands_ready),
    StackCheck("gpu-consumers", FORWARD, consumers.check_gpu_consumers),
    StackCheck("drain-emptydir", FORWARD, consumers.check_drain_emptydir),
    StackCheck("driver-switch", _actions(UPGRADE, SYNC), consumers.check_driver_switch),
    StackCheck("crds-served", _actions(UPGRADE, SYNC, ROLLBACK), crdstate.check_crds_served),
    StackCheck("crd-owner", _actions(UPGRADE, SYNC, ROLLBACK), crdstate.check_crd_owner),
    StackCheck("driver-hardware", FORWARD, hardware.check_driver_hardware),
    StackCheck("kernel-modules", _actions(UPGRADE, SYNC), hardware.check_kernel_modules),
    StackCheck("precompiled-kernel", FORWARD, hardware.check_precompiled_kernel),
    StackCheck("toolkit-platform", _actions(UPGRADE, SYNC), hardware.check_toolkit_platform),
    StackCheck("control-plane-gpu", _actions(UPGRADE, SYNC), hardware.check_control_plane_gpu),
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
