"""Turn a plan into edited files and one commit, all or nothing (the edge around ``plan``).

Order: refuse a dirty tree -> plan (pure checks) -> derive the files of the first commit ->
re-validate them staged in a temp folder (values keys, drivers/, and the real chart rendered with
helm when it is at hand) -> swap them in -> re-validate in place -> commit. Any failure after the
first write restores every file, so the repository is byte-identical. A rollback is planned and
committed the same way (not with ``git revert``): it runs the same checks and says what it cannot undo.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.errors import GpugateError
from webhook.kube.yamlload import fast_load
from webhook.stack import chartrender, manifests, messages, rollback, site, verify
from webhook.stack import matrix as matrix_data
from webhook.stack import plan as planning
from webhook.stack.checks import NO_WAIVERS, ChangeContext, Waivers
from webhook.stack.clusterstate import ClusterSnapshot
from webhook.stack.compat import Check
from webhook.stack.gitrepo import Repo, StackCommit
from webhook.stack.model import Stack

STACK_PATHS = [manifests.STACK_DIR, "argocd/apps"]
ClusterReader = Callable[[], ClusterSnapshot | None]
"""Reads the cluster (``--kube``) or a recording when called; None: no cluster asked for."""


def _yaml(content: bytes | None) -> dict[str, Any] | None:
    loaded = fast_load(content) if content else None
    return loaded if isinstance(loaded, dict) else None


def context_of(files: manifests.Files, *, values_before: bytes | None,
               cluster: ClusterReader | None = None) -> ChangeContext:
    """What the rules read besides the stacks: the values before and after, the Application, the cluster."""
    from webhook.stack import chartcrds

    app = _yaml(files.get(manifests.ARGO_APP_FILE)) or {}
    sources = (app.get("spec") or {}).get("sources") or [(app.get("spec") or {}).get("source") or {}]
    chart = next((s for s in sources if isinstance(s, dict) and s.get("chart")), None)
    applied = None if chart is None else not bool((chart.get("helm") or {}).get("skipCrds"))
    return ChangeContext(values=_yaml(files.get(manifests.VALUES_FILE)), values_before=_yaml(values_before),
                   cluster=cluster() if cluster is not None else None, chart_crds_applied=applied,
                   application=str((app.get("metadata") or {}).get("name") or "gpu-operator"),
                   chart_crds=chartcrds.known())


class CheckFailed(GpugateError):
    """A plan did not pass; carries the prepared plan so the CLI can still print every check."""

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared
        failed = [c for c in prepared.checks if not c.ok]
        super().__init__("; ".join(f"{c.label}: {c.reason}" for c in failed) or "the plan has no commit to make")


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A plan plus the exact file changes of its first commit and the re-validation results."""

    plan: planning.ChangePlan
    changes: dict[str, bytes | None]
    step_files: tuple[tuple[str, ...], ...]
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return self.plan.ok and all(c.ok for c in self.checks)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(c.warning for c in self.checks if c.warning)


def chart_settings(repo: Path, *, helm: str | None, chart_repo: str | None, skip: bool) -> verify.ChartSettings:
    """Where the chart comes from (--chart-repo, $GPUGATE_CHART_REPO, argocd/site/site.yaml) and which helm renders it.

    Without helm (a laptop without it) the render is skipped with a message naming the ways to
    provide one; ``skip`` (--skip-chart-render) does the same on purpose, e.g. offline.
    """
    import os

    settings = site.load(repo)
    repo_url = chart_repo or os.environ.get(chartrender.CHART_REPO_ENV) or (
        settings.chart_repo_url if settings else "https://helm.ngc.nvidia.com/nvidia")
    if skip:
        return verify.ChartSettings(helm=None, repo_url=repo_url, skip_reason="--skip-chart-render")
    found = chartrender.find_helm(helm)
    if found is None:
        return verify.ChartSettings(helm=None, repo_url=repo_url,
                                    skip_reason="helm not found")
    return verify.ChartSettings(helm=found, repo_url=repo_url)


def _prepare(repo: Path, plan: planning.ChangePlan, *, schema_root: Path | None,
             base: dict[str, bytes | None] | None = None, chart: verify.ChartSettings | None = None,
             for_commit: bool = True, edited: Mapping[str, bytes | None] | None = None) -> Prepared:
    """Stage the plan's files and re-validate them; ``for_commit`` False is a plan that only prints
    (a check that needs an optional package it lacks is shown skipped instead of failing).
    ``edited``: hand-edited files by their HEAD content; the commit carries each one that differs."""
    if not plan.ok:
        return Prepared(plan=plan, changes={}, step_files=tuple(() for _ in plan.steps), checks=plan.checks)
    current = base if base is not None else manifests.read_files(repo)
    step_files: list[tuple[str, ...]] = []
    changes: dict[str, bytes | None] = {}
    overlay: dict[str, bytes | None] = dict(current)
    extra: tuple[Check, ...] = ()
    try:
        for index, step in enumerate(plan.steps):
            step_changes = manifests.derive(step.stack, overlay)
            step_files.append(tuple(sorted(step_changes)))
            overlay.update(step_changes)
            if index == 0:
                changes = dict(step_changes)
                changes.update({path: overlay[path] for path, head in (edited or {}).items()
                                if path not in changes and overlay.get(path) != head})
                step_files[0] = tuple(sorted(changes))
                first_overlay = dict(overlay)
    except GpugateError as err:
        extra = (Check(name="derive", ok=False, reason=str(err)),)
    else:
        if not changes:
            return Prepared(plan=plan, changes={}, step_files=tuple(step_files), checks=plan.checks + (
                Check(name="changes", ok=False,
                      reason="the files already declare this stack: nothing to commit"),))
        first = plan.steps[0].stack
        extra = verify.staged(first_overlay, release=first.operator_version,
                              kubernetes_minor=first.kubernetes_minor, schema_root=schema_root,
                              stack=first, chart=chart, need_validator=for_commit)
    return Prepared(plan=plan, changes=changes, step_files=tuple(step_files), checks=plan.checks + extra)


def prepare_upgrade(repo: Path, request: planning.Request, *, schema_root: Path | None,
                    cluster: ClusterReader | None = None,
                    chart: verify.ChartSettings | None = None, for_commit: bool = True) -> Prepared:
    """Plan and stage an upgrade; ``cluster`` (--kube) feeds the preflight rules and gates step 2 of
    the driver migration on the ClusterPolicy."""
    stack = manifests.load_stack(repo)
    files = manifests.read_files(repo)
    context = context_of(files, values_before=files.get(manifests.VALUES_FILE), cluster=cluster)
    plan = planning.plan_upgrade(matrix_data.load(), stack, request, manifests.existing_drivers(files), context)
    if planning.is_migration_second_step(plan):
        listed = list(context.cluster.cluster_policies) if context.cluster is not None else None
        plan = plan.with_checks((planning.check_previous_step_healthy(listed),))
    return _prepare(repo, plan, schema_root=schema_root, chart=chart, for_commit=for_commit)


def prepare_promote(repo: Path, *, source: str, to: str, schema_root: Path | None, waivers: Waivers = NO_WAIVERS,
                    chart: verify.ChartSettings | None = None, canary_gate: Check | None = None,
                    cluster: ClusterReader | None = None) -> Prepared:
    """``canary_gate``: the cluster's verdict on the source pool (``canary_watch.gate_check``), one more
    check of the plan (and a line of the commit message)."""
    stack = manifests.load_stack(repo)
    files = manifests.read_files(repo)
    context = context_of(files, values_before=files.get(manifests.VALUES_FILE), cluster=cluster)
    plan = planning.plan_promote(matrix_data.load(), stack, source=source, to=to,
                                 existing=manifests.existing_drivers(files), waivers=waivers, context=context)
    if canary_gate is not None:
        plan = dataclasses.replace(plan, checks=(*plan.checks, canary_gate))
    return _prepare(repo, plan, schema_root=schema_root, chart=chart)


def prepare_sync(repo: Repo, *, schema_root: Path | None, waivers: Waivers = NO_WAIVERS,
                 chart: verify.ChartSettings | None = None, for_commit: bool = True,
                 cluster: ClusterReader | None = None) -> Prepared:
    """Plan a commit of a hand-edited stack.yaml (and values.yaml) against HEAD's."""
    root = repo.root
    head_text = repo.show_file("HEAD", manifests.STACK_FILE)
    if head_text is None:
        raise GpugateError(f"{manifests.STACK_FILE} is not committed yet; commit it once by hand")
    current = Stack.from_yaml(head_text)
    edited = manifests.load_stack(root)
    files = manifests.read_files(root)
    files[manifests.STACK_FILE] = head_text.encode()
    existing = manifests.existing_drivers(files)
    values_head = repo.show_file("HEAD", manifests.VALUES_FILE)
    context = context_of(files, values_before=values_head.encode() if values_head is not None else None,
                         cluster=cluster)
    plan = planning.plan_sync(matrix_data.load(), current, edited, existing=existing, waivers=waivers,
                              context=context)
    return _prepare(root, plan, schema_root=schema_root, base=files, chart=chart, for_commit=for_commit,
                    edited={manifests.VALUES_FILE: values_head.encode() if values_head is not None else None})


def execute(repo: Repo, prepared: Prepared, *, schema_root: Path | None,
            after_write: manifests.AfterWrite | None = None, recheck: bool = True) -> str:
    """Write the first commit's files, re-validate them in place, commit; restore everything on failure.

    ``recheck`` False skips the second validation (the staged files were validated a moment ago and
    are written as they are): the canary controller's commits, where a decision must not wait."""
    if not prepared.ok or not prepared.changes:
        raise CheckFailed(prepared)
    root = repo.root
    originals = {path: ((root / path).read_bytes() if (root / path).is_file() else None) for path in prepared.changes}
    manifests.apply_changes(root, prepared.changes, after_write=after_write)
    try:
        first = prepared.plan.steps[0].stack
        if manifests.load_stack(root) != first:
            raise GpugateError("stack.yaml written does not read back as planned; nothing committed")
        rechecked = verify.staged(manifests.read_files(root), release=first.operator_version,
                                  kubernetes_minor=first.kubernetes_minor, schema_root=schema_root) if recheck else ()
        failed = [c for c in rechecked if not c.ok]
        if failed:
            raise GpugateError("re-validation after writing failed: "
                               + "; ".join(f"{c.label}: {c.reason}" for c in failed))
        paths = sorted(prepared.changes)
        message = messages.commit_message(prepared.plan, files=paths,
                                          extra_checks=prepared.checks[len(prepared.plan.checks):])
        return repo.commit(paths, message)
    except BaseException:
        manifests.apply_changes(root, originals)
        raise


@dataclass(frozen=True)
class RollbackChoice:
    """The stack commit a rollback undoes, and why that one: the newer ones it passed over."""

    commit: StackCommit
    passed: tuple[str, ...] = ()
    """``<sha12> (<subject>): <why not>`` for each newer stack commit it did not pick."""

    def why(self) -> str:
        chosen = f"{self.commit.sha[:12]} ({self.commit.subject}): the newest stack commit not rolled back yet"
        if not self.passed:
            return chosen
        return chosen + "; passed over " + "; ".join(self.passed)


def rollback_target(repo: Repo) -> RollbackChoice:
    """The stack commit a rollback undoes: the newest one not itself a rollback, not rolled back yet,
    and changing something a rollback restores.

    Rollback commits name what they undid (Gpugate-Reverts), so a second rollback steps further
    back instead of undoing the first one (which would re-apply the change it removed). A commit
    that changes only ``cluster.kubernetesVersion`` is passed over: a rollback keeps the cluster's
    Kubernetes minor, so undoing it changes nothing (and would be picked again every time).
    """
    commits = repo.stack_commits()
    undone = {c.reverts: c.sha for c in commits if c.action == "rollback" and c.reverts}
    passed: list[str] = []
    for commit in commits:
        if commit.action == "rollback":
            continue
        name = f"{commit.sha[:12]} ({commit.subject})"
        if commit.sha in undone:
            passed.append(f"{name}: rolled back by {undone[commit.sha][:12]}")
            continue
        before, after = _stack_at(repo, f"{commit.sha}^"), _stack_at(repo, commit.sha)
        if before is not None and after is not None and \
                after.replace(kubernetes_minor=before.kubernetes_minor) == before:
            passed.append(f"{name}: changes only cluster.kubernetesVersion, which a rollback keeps")
            continue
        return RollbackChoice(commit, tuple(passed))
    if commits:
        raise GpugateError("nothing further to step back to: every stack commit in the last 200 is rolled back "
                           "already or changes only what a rollback keeps (" + "; ".join(passed) + ")")
    raise GpugateError("no stack commit to roll back (none carries the Gpugate-Stack trailer)")


def _stack_at(repo: Repo, rev: str) -> Stack | None:
    text = repo.show_file(rev, manifests.STACK_FILE)
    if text is None:
        return None
    return Stack.from_yaml(text)


def prepare_rollback(repo: Repo, *, schema_root: Path | None, waivers: Waivers = NO_WAIVERS,
                     chart: verify.ChartSettings | None = None, for_commit: bool = True,
                     cluster: ClusterReader | None = None) -> Prepared:
    """Plan going back to stack.yaml as it was before the newest not-yet-undone stack commit."""
    root = repo.root
    choice = rollback_target(repo)
    target_commit = choice.commit
    current = manifests.load_stack(root)
    after = _stack_at(repo, target_commit.sha)
    before = _stack_at(repo, f"{target_commit.sha}^")
    if before is None or after is None:
        raise GpugateError(f"stack commit {target_commit.sha[:12]} has no stack.yaml before or after it; "
                           f"roll it back by hand (edit stack.yaml, `gpugate stack sync`)")
    if after.replace(kubernetes_minor=current.kubernetes_minor) != current:
        raise GpugateError(f"stack.yaml changed after {target_commit.sha[:12]} ({target_commit.subject}) outside the "
                           f"stack tool; going back to before it would undo those changes too: edit stack.yaml by "
                           f"hand and run `gpugate stack sync`")
    files = manifests.read_files(root)
    context = context_of(files, values_before=files.get(manifests.VALUES_FILE), cluster=cluster)
    plan = rollback.plan_rollback(matrix_data.load(), current, before, sha=target_commit.sha,
                                  subject=target_commit.subject, why=choice.why(), waivers=waivers,
                                  existing=manifests.existing_drivers(files), context=context)
    return _prepare(root, plan, schema_root=schema_root, chart=chart, for_commit=for_commit)


def prepare_pool_rollback(repo: Repo, *, drivers: Mapping[str, str], sha: str, schema_root: Path | None,
                          chart: verify.ChartSettings | None = None) -> Prepared:
    """Put pools back on the drivers they ran before commit ``sha`` (a canary's rollback), checked."""
    root = repo.root
    current = manifests.load_stack(root)
    files = manifests.read_files(root)
    plan = rollback.plan_pool_rollback(matrix_data.load(), current, drivers=drivers, sha=sha,
                                       subject=repo.subject(sha), existing=manifests.existing_drivers(files),
                                       context=context_of(files, values_before=files.get(manifests.VALUES_FILE)))
    return _prepare(root, plan, schema_root=schema_root, chart=chart)


def plan_as_dict(prepared: Prepared) -> dict:
    plan = prepared.plan
    return {
        "action": plan.action,
        "title": plan.steps[0].title if plan.steps else None,
        "ok": prepared.ok,
        "current": yaml.safe_load(plan.current.to_yaml()),
        "target": yaml.safe_load(plan.steps[0].stack.to_yaml()) if plan.steps else None,
        "checks": [c.as_dict() for c in prepared.checks],
        "warnings": list(prepared.warnings),
        "reverts": plan.reverts or None,
        "revertsWhy": plan.reverts_why or None,
        "cannotUndo": list(plan.cannot_undo),
        # Only a plan that passes makes commits: a failed one lists none (not "[this run]" above a FAIL).
        "commits": [] if not prepared.ok else [
            {"title": step.title,
             "changes": messages.changes(plan.current if i == 0 else plan.steps[i - 1].stack, step.stack),
             "files": list(prepared.step_files[i]) if i < len(prepared.step_files) else [],
             "made_by_this_run": i == 0, "note": step.note}
            for i, step in enumerate(plan.steps)
        ],
    }
