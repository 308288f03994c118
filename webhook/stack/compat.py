"""The upgrade rules of the GPU Operator stack, as pure functions: a proposed change in, ``Check`` values out.

Data in, ``Check`` values out: no files, no git, no cluster. The matrix itself is data
(``data/matrix.yaml``, loaded by ``webhook.stack.matrix``, modelled by ``webhook.stack.releases``)
so every fact keeps its source; this module only applies the rules to a proposed change.
``webhook.stack.checks`` lists which rule each planner runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.stack.releases import Matrix, OperatorVersion, Release, driver_branch, driver_key, is_full_version


@dataclass(frozen=True, kw_only=True)
class Check:
    """One rule applied to one change: did it pass, and why (always a reason, pass or fail)."""

    name: str
    ok: bool
    reason: str
    subject: str = ""
    """What the check looked at when there are several (a pool, a CR name); empty for the stack."""
    warning: str = ""
    source: str = ""
    skipped: bool = False
    """Not run (``ok`` stays True): a plan that only prints lacks what the check needs; the reason says what."""
    fix: str = ""
    """What to do about a failure or a warning (the reason says the cause), when there is one thing to do."""

    @property
    def label(self) -> str:
        return f"{self.name}[{self.subject}]" if self.subject else self.name

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "ok": self.ok, "reason": self.reason}
        if self.subject:
            out["subject"] = self.subject
        if self.warning:
            out["warning"] = self.warning
        if self.source:
            out["source"] = self.source
        if self.skipped:
            out["skipped"] = True
        if self.fix:
            out["fix"] = self.fix
        return out


# ---------------------------------------------------------------------------- the rules


def check_release_path(matrix: Matrix, current: OperatorVersion, target: OperatorVersion) -> Check:
    """Upgrades stay in a release line or move to the next one; never skip a line, never go back."""
    name = "release-path"
    lines = matrix.lines()
    source = matrix.release_path_source
    for version in (current, target):
        if version.line not in lines:
            return Check(name=name, ok=False, source=source,
                         reason=f"release line {version.line_name} of {version} is not in the compatibility matrix")
    if target < current:
        return Check(name=name, ok=False, source=source,
                     reason=f"{target} is older than the current {current}; to go back use `gpugate stack rollback`")
    if target == current:
        return Check(name=name, ok=True, source=source, reason=f"operator stays at {current}")
    gap = lines.index(target.line) - lines.index(current.line)
    if gap == 0:
        return Check(name=name, ok=True, source=source,
                     reason=f"{current} -> {target} stays within release line {current.line_name}")
    if gap == 1:
        return Check(name=name, ok=True, source=source,
                     reason=f"{current} -> {target} moves to the next release line {target.line_name}")
    skipped = ", ".join(f"v{a}.{b}" for a, b in lines[lines.index(current.line) + 1: lines.index(target.line)])
    return Check(name=name, ok=False, source=source,
                 reason=f"{current} -> {target} skips release line(s) {skipped}; upgrades are supported only "
                        f"within a release line or to the next one: "
                        f"upgrade to the newest {skipped.split(', ')[0]}.x first")


def check_rollback_path(matrix: Matrix, current: OperatorVersion, target: OperatorVersion, *,
                        allow_downgrade: bool) -> Check:
    """Going back one stack commit may lower the operator by one step, never silently.

    NVIDIA supports upgrades only; a rollback that lowers the operator (and, through Argo CD, its
    CRDs) needs --allow-operator-downgrade, and never goes back over more than one release line.
    """
    name = "rollback-path"
    source = matrix.release_path_source
    if target >= current:
        return compat_forward(matrix, current, target, name)
    lines = matrix.lines()
    if current.line not in lines or target.line not in lines:
        return Check(name=name, ok=False, source=source, reason=f"{current} or {target} is not in the matrix")
    gap = lines.index(current.line) - lines.index(target.line)
    if gap > 1:
        return Check(name=name, ok=False, source=source,
                     reason=f"{current} -> {target} goes back over {gap} release lines; roll back step by step")
    reason = (f"{current} -> {target} downgrades the GPU Operator (and, through Argo CD, its CRDs); NVIDIA "
              f"supports upgrades only")
    if not allow_downgrade:
        return Check(name=name, ok=False, source=source,
                     reason=reason + ": pass --allow-operator-downgrade to accept it, or fix forward with "
                                     "`gpugate stack upgrade`")
    return Check(name=name, ok=True, source=source, reason=reason + "; allowed by --allow-operator-downgrade",
                 warning=f"gpu-operator is downgraded {current} -> {target} (--allow-operator-downgrade)")


def compat_forward(matrix: Matrix, current: OperatorVersion, target: OperatorVersion, name: str) -> Check:
    """A rollback that keeps (or raises) the operator is checked like an upgrade's release path."""
    check = check_release_path(matrix, current, target)
    return Check(name=name, ok=check.ok, reason=check.reason, source=check.source)


def check_kubernetes(release: Release, minor: int) -> Check:
    """The cluster's Kubernetes minor against the target release's listed range.

    Older than the range refuses: the release uses APIs that cluster lacks. Newer than the range
    passes with a warning: NVIDIA publishes its range with the release and extends it only in a
    later one (v26.7.0 came six days before Kubernetes 1.37.0), so refusing would block every
    stack change, fixes included, on a cluster one minor ahead; the warning says it is unvalidated.
    """
    source = release.sources["kubernetes"]
    where = f"{release.version}'s supported range {release.kubernetes_range}"
    if minor < release.kubernetes_min:
        return Check(name="kubernetes", ok=False, source=source,
                     reason=f"Kubernetes 1.{minor} is outside {where}; upgrade the cluster or pick a release "
                            "that supports it")
    if minor > release.kubernetes_max:
        return Check(name="kubernetes", ok=True, source=source,
                     reason=f"Kubernetes 1.{minor} is newer than {where}: NVIDIA has not listed it yet",
                     warning=f"Kubernetes 1.{minor} is not validated by NVIDIA for {release.version} "
                             f"(listed {release.kubernetes_range}); canary the change before every pool")
    return Check(name="kubernetes", ok=True, source=source, reason=f"Kubernetes 1.{minor} is within {where}")


def check_driver_validated(release: Release, *, pool: str, driver: str, allow_unvalidated: bool) -> Check:
    """The pool's driver must be in a branch the target release validated, unless explicitly allowed."""
    branch = driver_branch(driver)
    branches = ", ".join(release.branches)
    source = release.sources["drivers"]
    if branch in release.branches:
        listed = "listed" if driver in release.drivers else "in a validated branch"
        return Check(name="driver-validated", subject=pool, ok=True, source=source,
                     reason=f"driver {driver} is {listed} for {release.version} (branches {branches})")
    reason = f"driver {driver} (branch {branch}) is outside {release.version}'s validated branches {branches}"
    if allow_unvalidated:
        return Check(name="driver-validated", subject=pool, ok=True, source=source,
                     reason=reason + "; allowed by --allow-unvalidated-driver",
                     warning=f"pool {pool}: driver {driver} is not validated for {release.version}")
    return Check(name="driver-validated", subject=pool, ok=False, source=source,
                 reason=reason + "; pick a validated driver or pass --allow-unvalidated-driver")


def is_driver_downgrade(current: str, target: str) -> bool:
    """True when ``target`` is an older driver than ``current`` (595.91.07 after 610.57.04).

    Compared number by number over the parts both have, so a bare precompiled branch (595) is
    neither older nor newer than the versions of its own branch.
    """
    old, new = driver_key(current), driver_key(target)
    common = min(len(old), len(new))
    return new[:common] < old[:common]


def check_driver_path(*, pool: str, current: str, target: str, allow_downgrade: bool) -> Check:
    """A pool's driver goes up; going down is a downgrade, named as one and only with --allow-driver-downgrade.

    The operator installs an older driver through the same node-by-node upgrade state machine
    (GPU pods evicted), so a typo in --driver must not roll every pool back as an "upgrade".
    """
    name = "driver-path"
    if not is_driver_downgrade(current, target):
        return Check(name=name, subject=pool, ok=True,
                     reason=f"driver {current} -> {target} on pool {pool} is not a downgrade")
    reason = (f"driver {current} -> {target} on pool {pool} is a downgrade: its nodes reinstall the older "
              f"driver through the upgrade state machine (GPU pods evicted)")
    if allow_downgrade:
        return Check(name=name, subject=pool, ok=True, reason=reason + "; allowed by --allow-driver-downgrade",
                     warning=f"pool {pool}: driver downgraded {current} -> {target} (--allow-driver-downgrade)")
    return Check(name=name, subject=pool, ok=False,
                 reason=reason + "; pass --allow-driver-downgrade to accept it (to undo a stack commit, use "
                                 "`gpugate stack rollback`)")


def check_mig_mixed(matrix: Matrix, *, pool: str, driver: str, mixes_mig_and_full: bool) -> Check:
    """Known-bad drivers are refused on pools that mix MIG slices and full GPUs."""
    source = matrix.known_bad_source
    if driver not in matrix.known_bad_drivers:
        return Check(name="driver-mig-mixed", subject=pool, ok=True, source=source,
                     reason=f"driver {driver} is not one of the drivers known bad with mixed MIG")
    if not mixes_mig_and_full:
        return Check(name="driver-mig-mixed", subject=pool, ok=True, source=source,
                     reason=f"driver {driver} is known bad with mixed MIG, "
                            f"but pool {pool} does not mix MIG and full GPUs")
    return Check(name="driver-mig-mixed", subject=pool, ok=False, source=source,
                 reason=f"driver {driver} on pool {pool}, which mixes MIG and full GPUs: {matrix.known_bad_reason}",
                 fix=f"pick a driver outside {', '.join(matrix.known_bad_drivers)} for pool {pool} "
                     f"(`gpugate stack plan` lists the published ones)")


def migration_steps(matrix: Matrix, *, current: OperatorVersion, current_mode: str,
                    target: OperatorVersion, target_mode: str) -> int:
    """How many commits the change takes: 2 when moving the driver to NVIDIADriver from before v26.7.0."""
    moving = current_mode == "clusterpolicy" and target_mode == "nvidiadriver"
    if moving and current < matrix.migration_supported_from and target != current:
        return 2
    return 1


def check_driver_management(matrix: Matrix, *, current: OperatorVersion, current_mode: str,
                            target: OperatorVersion, target_mode: str) -> Check:
    """NVIDIADriver needs the supported release; a move from an older release is planned as two commits."""
    name = "driver-management"
    source = matrix.migration_source
    floor = matrix.migration_supported_from
    if target_mode == "nvidiadriver" and target < floor:
        return Check(name=name, ok=False, source=source,
                     reason=f"per-pool NVIDIADriver management needs gpu-operator {floor} or newer, target is {target}")
    if current_mode == target_mode:
        return Check(name=name, ok=True, source=source, reason=f"driver stays managed by {current_mode}")
    if target_mode == "clusterpolicy":
        return Check(name=name, ok=True, source=source,
                     reason="driver management moves back to ClusterPolicy (NVIDIADriver CRs are removed)")
    if current < floor:
        if target == current:
            return Check(name=name, ok=False, source=source,
                         reason=f"moving the driver from ClusterPolicy to NVIDIADriver needs {floor}; "
                                f"the stack is at {current}: pass --operator {floor}")
        return Check(name=name, ok=True, source=source,
                     reason=f"moving the driver from ClusterPolicy to NVIDIADriver from {current} "
                            f"(older than {floor}) takes two commits: 1) operator {current} -> {target} "
                            f"with ClusterPolicy still managing the driver, 2) NVIDIADriver per pool; "
                            f"each synced and healthy before the next. "
                            f"This run makes only the first",
                     warning="step 1 of 2: after Argo CD shows gpu-operator Synced and Healthy (ClusterPolicy ready), "
                             "run the same command again for step 2")
    return Check(name=name, ok=True, source=source,
                 reason=f"driver management moves from ClusterPolicy to NVIDIADriver at {current} in one commit")


def check_immutable(*, cr_name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> Check:
    """``driverType`` and ``usePrecompiled`` of an existing NVIDIADriver never change under its name."""
    changed = [
        f"{key} {old.get(key, default)!r} -> {new.get(key, default)!r}"
        for key, default in (("driverType", "gpu"), ("usePrecompiled", False))
        if old.get(key, default) != new.get(key, default)
    ]
    if not changed:
        return Check(name="immutable-fields", subject=cr_name, ok=True,
                     reason=f"NVIDIADriver {cr_name} keeps driverType and usePrecompiled")
    return Check(name="immutable-fields", subject=cr_name, ok=False,
                 source="CRD nvidia.com_nvidiadrivers.yaml: x-kubernetes-validations self == oldSelf",
                 reason=f"NVIDIADriver {cr_name}: {'; '.join(changed)} is immutable (the API server refuses it); "
                        f"give the pool a new CR name (crName in stack.yaml) "
                        f"so Argo CD creates a new CR and prunes the old")


def check_component_overrides(release: Release, overrides: Mapping[str, str]) -> list[Check]:
    """Overridden component versions are kept across an upgrade; say when they differ from the new defaults."""
    checks = []
    for component, version in sorted(overrides.items()):
        default = release.defaults.get(component)
        if default is None or default == version:
            note = "" if default is None else " (equals the release default)"
            checks.append(Check(name="component-override", subject=component, ok=True,
                                reason=f"{component} stays pinned at {version}{note}"))
        else:
            checks.append(Check(name="component-override", subject=component, ok=True,
                                source=release.sources["defaults"],
                                reason=f"{component} stays pinned at {version}; "
                                       f"{release.version} defaults to {default}",
                                warning=f"{component} is pinned at {version}, "
                                        f"not {release.version}'s default {default}"))
    return checks


def check_driver_published(matrix: Matrix, release: Release, *, pool: str, driver: str, use_precompiled: bool,
                           allow_unlisted: bool) -> Check:
    """The driver image the pool's NVIDIADriver (or the ClusterPolicy) will pull must exist.

    A branch check alone lets 595.99.99, an unpadded 595.91.7 or a bare 610 through, and each
    would commit an image tag NVIDIA never published: the driver pods then stay in
    ImagePullBackOff on every node of the pool. Precompiled images are tagged by branch and built
    for a few branches per release only.
    """
    name = "driver-published"
    if use_precompiled:
        entry = matrix.precompiled.get(release.version)
        if is_full_version(driver) or "." in driver:
            return Check(name=name, subject=pool, ok=False,
                         reason=f"pool {pool} uses precompiled drivers, whose images are tagged "
                                f"<branch>-<kernel>-<os>: name the branch ({driver_branch(driver)}), not {driver}")
        if entry is not None and driver in entry[0]:
            return Check(name=name, subject=pool, ok=True, source=entry[1],
                         reason=f"precompiled driver images of branch {driver} are published for {release.version}")
        known = (f"{release.version} has precompiled images for branches {', '.join(entry[0])}" if entry
                 else f"no record of precompiled images for {release.version}")
        reason = f"precompiled branch {driver} on pool {pool}: {known}"
        if allow_unlisted:
            return Check(name=name, subject=pool, ok=True, source=entry[1] if entry else "",
                         reason=reason + "; allowed by --allow-unlisted-driver",
                         warning=f"pool {pool}: precompiled branch {driver} is not known to be published for "
                                 f"{release.version} (committed with --allow-unlisted-driver)")
        return Check(name=name, subject=pool, ok=False, source=entry[1] if entry else "",
                     reason=reason + "; pick a listed branch or pass --allow-unlisted-driver")
    if not is_full_version(driver):
        return Check(name=name, subject=pool, ok=False,
                     reason=f"driver {driver} on pool {pool} is a bare branch: only precompiled images "
                            f"(usePrecompiled: true) are tagged by branch; name a full version such as "
                            f"{(matrix.newer_drivers(driver + '.0.0') or (driver + '.NN.NN',))[-1]}")
    if driver in matrix.published_drivers:
        newer = matrix.newer_drivers(driver)
        note = f"; newer in branch {driver_branch(driver)}: {', '.join(newer)}" if newer else ""
        return Check(name=name, subject=pool, ok=True, source=matrix.published_drivers[driver],
                     reason=f"driver {driver} is a published image{note}")
    near = [v for v in matrix.published_drivers if driver_key(v) == driver_key(driver)]
    hint = f" (did you mean {near[0]}?)" if near else ""
    reason = f"driver {driver} on pool {pool} is not in the list of published driver images{hint}"
    if allow_unlisted:
        return Check(name=name, subject=pool, ok=True, reason=reason + "; allowed by --allow-unlisted-driver",
                     warning=f"pool {pool}: driver {driver} is not a listed published image; committed with "
                             f"--allow-unlisted-driver (check that nvcr.io/nvidia/driver:{driver}-<os> exists)")
    return Check(name=name, subject=pool, ok=False,
                 reason=reason + "; pick a listed version, or pass --allow-unlisted-driver if you know it exists")


def verdict(name: str, problems: list[str], *, passed: str, failed: str, source: str, fix: str) -> list[Check]:
    """One rule's check over what it found: PASS with ``passed`` when nothing, else FAIL whose reason is
    ``failed`` with ``{found}`` replaced by the problems, joined (the preflight rules all read so)."""
    if not problems:
        return [Check(name=name, ok=True, reason=passed)]
    return [Check(name=name, ok=False, source=source, fix=fix, reason=failed.replace("{found}", "; ".join(problems)))]
