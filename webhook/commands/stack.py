"""``gpugate stack``: status, plan, upgrade, promote and roll back the GPU stack declared in Git.

Thin: parse options, call ``webhook.stack``, render text or JSON, pick the exit code
(0 all checks pass / done, 1 a check failed or an error, 2 usage).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from webhook.errors import GpugateError
from webhook.stack import canary_watch, compat, manifests, verify
from webhook.stack import plan as planning
from webhook.stack import status as stack_status
from webhook.stack import upgrade as stack_upgrade
from webhook.stack.gitrepo import Repo

_MODES = click.Choice(["nvidiadriver", "clusterpolicy"])


def _repo_option(func: Any) -> Any:
    return click.option("--repo", "repo", type=click.Path(exists=True, file_okay=False, path_type=Path),
                        default=Path("."), show_default=True,
                        help="Root (or any folder) of the git repository holding manifests/gpu-operator.")(func)


def _output_option(func: Any) -> Any:
    return click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
                        help="text for people, json for machines.")(func)


def _schemas_option(func: Any) -> Any:
    return click.option("--schemas", "schemas", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="Folder with nvidia.com_nvidiadrivers.yaml (default: <repo>/../shared/schemas).")(func)


def _form(parse: Any) -> Any:
    """A click callback that refuses a malformed value as a usage error (exit 2), with the expected form."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                parse(value)
            except GpugateError as err:
                raise click.BadParameter(str(err)) from err
        return value

    return callback


_DOWNGRADE_OPTION = click.option(
    "--allow-driver-downgrade", is_flag=True,
    help="Accept moving a pool to an older driver (the commit is titled a downgrade and says so).")


def _change_options(func: Any) -> Any:
    options = [
        click.option("--operator", required=True, callback=_form(compat.OperatorVersion.parse),
                     help="Target GPU Operator release, e.g. v26.7.0."),
        click.option("--driver", default=None, callback=_form(compat.driver_branch),
                     help="Target driver version (default: keep each pool's)."),
        click.option("--pool", default=None, help="Change only this pool's NVIDIADriver (canary)."),
        click.option("--kubernetes", default=None, callback=_form(compat.parse_minor),
                     help="The cluster's Kubernetes minor, 1.NN (default: stack.yaml)."),
        click.option("--allow-unvalidated-driver", is_flag=True,
                     help="Accept a driver outside the target's validated branches (warned)."),
        click.option("--allow-unlisted-driver", is_flag=True,
                     help="Accept a driver version not in the list of published driver images (said in the commit)."),
        _DOWNGRADE_OPTION,
        click.option("--driver-management", type=_MODES, default=None,
                     help="Move the driver to NVIDIADriver CRs per pool, or back to the ClusterPolicy."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _chart_options(func: Any) -> Any:
    """How the real chart is rendered before a commit (the check is skipped, and says so, without helm)."""
    func = click.option("--skip-chart-render", is_flag=True, envvar="GPUGATE_SKIP_CHART_RENDER",
                        help="Do not render the chart (e.g. offline); the commit says it was not checked.")(func)
    func = click.option("--chart-repo", default=None,
                        help="Helm repository to render the chart from (default: $GPUGATE_CHART_REPO, else "
                             "chartRepoURL in argocd/site/site.yaml).")(func)
    return click.option("--helm", "helm", default=None,
                        help="helm binary for the chart render (default: $GPUGATE_HELM, else helm on PATH).")(func)


def _unlisted_option(func: Any) -> Any:
    return click.option("--allow-unlisted-driver", is_flag=True,
                        help="Accept a driver version not in the list of published driver images.")(func)


def _cluster_option(func: Any) -> Any:
    func = click.option("--server", default=None,
                        help="API server URL for --kube (default: in-cluster or kubeconfig).")(func)
    return click.option("--kube", is_flag=True,
                        help="Ask the cluster whether the previous step is healthy (driver migration step 2).")(func)


def _lister(kube: bool, server: str | None) -> Any:
    if not kube and server is None:
        return None
    return lambda: stack_status.fetch_cluster_policies(server)


def _request(operator: str, driver: str | None, pool: str | None, kubernetes: str | None,
             allow_unvalidated_driver: bool, allow_unlisted_driver: bool, allow_driver_downgrade: bool,
             driver_management: str | None) -> planning.Request:
    return planning.Request(operator=operator, driver=driver, pool=pool, kubernetes=kubernetes,
                            allow_unvalidated_driver=allow_unvalidated_driver,
                            allow_unlisted_driver=allow_unlisted_driver,
                            allow_driver_downgrade=allow_driver_downgrade, driver_management=driver_management)


def _root(path: Path) -> Path:
    try:
        return Repo(path).root
    except GpugateError:
        return path.resolve()


def _schema_root(root: Path, schemas: Path | None) -> Path | None:
    if schemas is not None:
        return schemas
    default = verify.default_schema_root(root)
    return default if default.is_dir() else None


@click.group("stack")
def stack() -> None:
    """Upgrade the GPU stack by one checked git commit; canary per pool, promote, roll back."""


# ---------------------------------------------------------------------------- status


@stack.command("status", short_help="Show the stack Git declares (--kube: cluster).")
@_repo_option
@click.option("--kube", is_flag=True, help="Also ask the cluster (ClusterPolicy, NVIDIADriver, GPU nodes).")
@click.option("--server", default=None, help="API server URL (default: in-cluster or kubeconfig).")
@_output_option
def status_command(repo: Path, kube: bool, server: str | None, output: str) -> None:
    """What Git declares (and, with --kube, what the cluster reports)."""
    result = stack_status.status(repo, kube=kube or server is not None, server=server)
    if output == "json":
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(render_status(result))
    # A failed node upgrade is visible nowhere in Argo CD (no condition says it): a script gating a
    # promotion on `status --kube` must not read it as success.
    if (result.get("cluster") or {}).get("upgradeFailed"):
        raise click.exceptions.Exit(1)


def render_status(result: dict[str, Any]) -> str:
    git = result["git"]
    repository = git["operator"]["repository"] or "no argocd/site/site.yaml"
    lines = [f"Git ({git['stackFile']}{' @ ' + git['head'][:12] if git.get('head') else ''}):",
             f"  operator           {git['operator']['chart']} {git['operator']['version']} ({repository})",
             f"  kubernetes         {git['kubernetesVersion']}",
             f"  driver management  {git['driverManagement']}",
             "  pools:"]
    for pool in git["pools"]:
        where = ("default pool" if pool["default"]
                 else "nodeSelector " + ",".join(f"{k}={v}" for k, v in pool["nodeSelector"].items()))
        cr = f"NVIDIADriver {pool['nvidiaDriver']}, " if pool["nvidiaDriver"] else ""
        mig = ", MIG + full GPUs" if pool["migAndFullGPUs"] else ""
        lines.append(f"    {pool['name']:<12} driver {pool['driver']:<12} ({cr}{where}, {pool['driverType']}"
                     f"{', precompiled' if pool['usePrecompiled'] else ''}{mig})")
        if pool.get("newerDrivers"):
            lines.append(f"    {'':<12} newer published in its branch: {', '.join(pool['newerDrivers'])}")
    if git["operator"].get("newerPatches"):
        lines.append(f"  newer patch releases of {git['operator']['version']}'s line: "
                     f"{', '.join(git['operator']['newerPatches'])}")
    overrides = ", ".join(f"{k}={v}" for k, v in git["components"].items()) or "none"
    lines.append(f"  overridden components: {overrides}")
    if git["outOfStep"]:
        lines.append(f"  OUT OF STEP with stack.yaml: {', '.join(git['outOfStep'])}")
    for commit in git.get("stackCommits", [])[:3]:
        lines.append(f"  stack commit {commit['sha'][:12]} [{commit['action']}] {commit['subject']}")
    cluster = result.get("cluster")
    if cluster is not None:
        lines.append(f"Cluster ({cluster['server']}):")
        for kind, key in (("ClusterPolicy", "clusterPolicies"), ("NVIDIADriver", "nvidiaDrivers")):
            items = cluster[key]
            if items is None:
                lines.append(f"  {kind}: not served (CRD not installed)")
                continue
            if not items:
                lines.append(f"  {kind}: none")
            for item in items:
                conds = ", ".join(f"{c.get('type')}={c.get('status')}"
                                  + (f" ({c['reason']})" if c.get("reason") else "")
                                  for c in item["conditions"]) or "no conditions"
                lines.append(f"  {kind} {item['name']}: {item['state']} [{conds}]")
        lines.append(f"  GPU nodes per pool by {stack_status.DRIVER_UPGRADE_STATE_LABEL}:")
        for pool in cluster["pools"]:
            states = ", ".join(f"{k}={v}" for k, v in pool["upgradeStates"].items()) or "no nodes"
            cr = f" (NVIDIADriver {pool['nvidiaDriver']})" if pool["nvidiaDriver"] else ""
            lines.append(f"    {pool['name']:<12} {states}{cr}")
        for pool in cluster["pools"]:
            if pool.get("upgradeFailed"):
                first = pool["upgradeFailed"][0]
                lines.append(f"  DRIVER UPGRADE FAILED on pool {pool['name']}: {', '.join(pool['upgradeFailed'])}. "
                             f"Argo CD shows no error for this (the operator sets no condition) and the operator "
                             f"does not retry by itself. Fix the cause (driver pod logs), then retry: "
                             f"kubectl label node {first} {stack_status.DRIVER_UPGRADE_STATE_LABEL}=upgrade-required "
                             f"--overwrite")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- plan / upgrade / promote


def render_plan(data: dict[str, Any]) -> str:
    lines = [f"plan: {data.get('title') or data['action']}", "checks:"]
    width = max((len(c["name"] + (f"[{c['subject']}]" if c.get("subject") else "")) for c in data["checks"]), default=0)
    for check in data["checks"]:
        label = check["name"] + (f"[{check['subject']}]" if check.get("subject") else "")
        verdict = "SKIP" if check.get("skipped") else "PASS" if check["ok"] else "FAIL"
        lines.append(f"  {verdict}  {label:<{width}}  {check['reason']}")
    if data["warnings"]:
        lines.append("warnings:")
        lines += [f"  {w}" for w in data["warnings"]]
    if data.get("reverts"):
        lines.append(f"rolls back: {data['reverts']}")
        if data.get("revertsWhy"):
            lines.append(f"  chosen: {data['revertsWhy']}")
    if data.get("cannotUndo"):
        lines.append("cannot undo:")
        lines += [f"  {line}" for line in data["cannotUndo"]]
    failed = [c for c in data["checks"] if not c["ok"]]
    if failed:
        lines.append("commits: none (a check failed)")
    else:
        lines.append(f"commits ({len(data['commits'])}):")
    for index, commit in enumerate(data["commits"], start=1):
        marker = "this run" if commit["made_by_this_run"] else "a later run"
        lines.append(f"  {index}. gpugate stack: {commit['title']}  [{marker}]")
        lines += [f"       {change}" for change in commit["changes"]]
        if commit["files"]:
            lines.append(f"       files: {', '.join(commit['files'])}")
        if commit["note"]:
            lines.append(f"       note: {commit['note']}")
    lines.append("result: all checks pass" if not failed else f"result: {len(failed)} check(s) failed")
    return "\n".join(lines)


def _emit_plan(prepared: stack_upgrade.Prepared, output: str, extra: dict[str, Any] | None = None) -> None:
    data = stack_upgrade.plan_as_dict(prepared)
    if extra:
        data.update(extra)
    click.echo(json.dumps(data, indent=2) if output == "json" else render_plan(data))


@stack.command("plan", short_help="Print a change's checks and commits.")
@_change_options
@_cluster_option
@_chart_options
@_repo_option
@_schemas_option
@_output_option
@click.pass_context
def plan_command(ctx: click.Context, operator: str, driver: str | None, pool: str | None, kubernetes: str | None,
                 allow_unvalidated_driver: bool, allow_unlisted_driver: bool, allow_driver_downgrade: bool,
                 driver_management: str | None,
                 kube: bool, server: str | None, helm: str | None, chart_repo: str | None, skip_chart_render: bool,
                 repo: Path, schemas: Path | None, output: str) -> None:
    """Print every check (pass/fail and why) and the commits an upgrade would make; exit 1 if any fails."""
    root = _root(repo)
    request = _request(operator, driver, pool, kubernetes, allow_unvalidated_driver, allow_unlisted_driver,
                       allow_driver_downgrade, driver_management)
    chart = stack_upgrade.chart_settings(root, helm=helm, chart_repo=chart_repo, skip=skip_chart_render)
    prepared = stack_upgrade.prepare_upgrade(root, request, schema_root=_schema_root(root, schemas),
                                             cluster_policies=_lister(kube, server), chart=chart, for_commit=False)
    _emit_plan(prepared, output)
    ctx.exit(0 if prepared.ok else 1)


def _commit(ctx: click.Context, root: Path, prepared: stack_upgrade.Prepared, output: str,
            schema_root: Path | None) -> None:
    repo = Repo(root)
    if not prepared.ok:
        _emit_plan(prepared, output, {"committed": None})
        raise stack_upgrade.CheckFailed(prepared)
    sha = stack_upgrade.execute(repo, prepared, schema_root=schema_root)
    if output == "json":
        _emit_plan(prepared, output, {"committed": sha})
    else:
        click.echo(render_plan(stack_upgrade.plan_as_dict(prepared)))
        click.echo(f"committed {sha[:12]}: gpugate stack: {prepared.plan.steps[0].title}")
        if len(prepared.plan.steps) > 1:
            click.echo(f"next: {prepared.plan.steps[1].title} -- {prepared.plan.steps[1].note}")


@stack.command("upgrade", short_help="Check a change and make one commit.")
@_change_options
@_cluster_option
@_chart_options
@_repo_option
@_schemas_option
@_output_option
@click.pass_context
def upgrade_command(ctx: click.Context, operator: str, driver: str | None, pool: str | None, kubernetes: str | None,
                    allow_unvalidated_driver: bool, allow_unlisted_driver: bool, allow_driver_downgrade: bool,
                    driver_management: str | None,
                    kube: bool, server: str | None, helm: str | None, chart_repo: str | None,
                    skip_chart_render: bool, repo: Path, schemas: Path | None, output: str) -> None:
    """Check, edit stack.yaml and every derived file, render the chart, re-validate, and make one commit."""
    root = _root(repo)
    Repo(root).require_clean(stack_upgrade.STACK_PATHS)
    schema_root = _schema_root(root, schemas)
    request = _request(operator, driver, pool, kubernetes, allow_unvalidated_driver, allow_unlisted_driver,
                       allow_driver_downgrade, driver_management)
    chart = stack_upgrade.chart_settings(root, helm=helm, chart_repo=chart_repo, skip=skip_chart_render)
    prepared = stack_upgrade.prepare_upgrade(root, request, schema_root=schema_root,
                                             cluster_policies=_lister(kube, server), chart=chart)
    _commit(ctx, root, prepared, output, schema_root)


@stack.command("promote", short_help="Carry a pool's driver to other pools.")
@click.option("--from", "source", required=True, help="The pool whose driver is carried over (e.g. canary).")
@click.option("--force", is_flag=True,
              help="Promote without the canary gate (every --from node upgrade-done at its driver, read from "
                   "the cluster); the commit says it was forced.")
@click.option("--server", default=None, help="API server URL for the canary gate (default: in-cluster or kubeconfig).")
@click.option("--to", "to", required=True, help="A pool name, or all for every other pool.")
@click.option("--allow-unvalidated-driver", is_flag=True, help="Accept a driver outside the validated branches.")
@_unlisted_option
@_DOWNGRADE_OPTION
@_chart_options
@_repo_option
@_schemas_option
@_output_option
@click.pass_context
def promote_command(ctx: click.Context, source: str, force: bool, server: str | None, to: str,
                    allow_unvalidated_driver: bool, allow_unlisted_driver: bool, allow_driver_downgrade: bool,
                    helm: str | None, chart_repo: str | None, skip_chart_render: bool, repo: Path,
                    schemas: Path | None, output: str) -> None:
    """Carry the canary pool's driver to another pool (or all) in one commit, once every node of the
    canary pool is upgrade-done at that driver in the cluster (--force skips that gate, and says so)."""
    root = _root(repo)
    Repo(root).require_clean(stack_upgrade.STACK_PATHS)
    schema_root = _schema_root(root, schemas)
    chart = stack_upgrade.chart_settings(root, helm=helm, chart_repo=chart_repo, skip=skip_chart_render)
    gate = canary_watch.gate_check(manifests.load_stack(root), source, server, force=force)
    prepared = stack_upgrade.prepare_promote(root, source=source, to=to,
                                             allow_unvalidated_driver=allow_unvalidated_driver, schema_root=schema_root,
                                             allow_unlisted_driver=allow_unlisted_driver, chart=chart,
                                             allow_driver_downgrade=allow_driver_downgrade, canary_gate=gate)
    _commit(ctx, root, prepared, output, schema_root)


@stack.command("sync", short_help="Commit a hand edit of stack.yaml, checked.")
@click.option("--check", "check_only", is_flag=True, help="Only print the checks and the commit; write nothing.")
@click.option("--allow-unvalidated-driver", is_flag=True, help="Accept a driver outside the validated branches.")
@_unlisted_option
@_DOWNGRADE_OPTION
@_chart_options
@_repo_option
@_schemas_option
@_output_option
@click.pass_context
def sync_command(ctx: click.Context, check_only: bool, allow_unvalidated_driver: bool, allow_unlisted_driver: bool,
                 allow_driver_downgrade: bool, helm: str | None, chart_repo: str | None, skip_chart_render: bool,
                 repo: Path, schemas: Path | None, output: str) -> None:
    """Commit a hand edit of stack.yaml (a pool's upgradePolicy, a new pool) and its derived files, after the checks."""
    root = _root(repo)
    git_repo = Repo(root)
    git_repo.require_clean(stack_upgrade.STACK_PATHS, allow=(manifests.STACK_FILE,))
    schema_root = _schema_root(root, schemas)
    chart = stack_upgrade.chart_settings(root, helm=helm, chart_repo=chart_repo, skip=skip_chart_render)
    prepared = stack_upgrade.prepare_sync(git_repo, allow_unvalidated_driver=allow_unvalidated_driver,
                                          schema_root=schema_root, allow_unlisted_driver=allow_unlisted_driver,
                                          chart=chart, allow_driver_downgrade=allow_driver_downgrade,
                                          for_commit=not check_only)
    if check_only:
        _emit_plan(prepared, output)
        ctx.exit(0 if prepared.ok else 1)
    _commit(ctx, root, prepared, output, schema_root)


@stack.command("rollback", short_help="Undo the newest stack commit, checked.")
@click.option("--check", "check_only", is_flag=True, help="Only print the checks and what cannot be undone.")
@click.option("--allow-operator-downgrade", is_flag=True,
              help="Accept a rollback that lowers the GPU Operator (and, through Argo CD, its CRDs).")
@click.option("--allow-unvalidated-driver", is_flag=True, help="Accept a driver outside the validated branches.")
@_unlisted_option
@_chart_options
@_repo_option
@_schemas_option
@_output_option
@click.pass_context
def rollback_command(ctx: click.Context, check_only: bool, allow_operator_downgrade: bool,
                     allow_unvalidated_driver: bool, allow_unlisted_driver: bool, helm: str | None,
                     chart_repo: str | None, skip_chart_render: bool, repo: Path, schemas: Path | None,
                     output: str) -> None:
    """Step back one stack commit: the newest not yet rolled back, with the upgrade checks; says what it cannot undo.

    A second rollback steps further back (it never re-applies what the first removed); to go
    forward again, run `gpugate stack upgrade`.
    """
    root = _root(repo)
    git_repo = Repo(root)
    git_repo.require_clean(stack_upgrade.STACK_PATHS)
    schema_root = _schema_root(root, schemas)
    chart = stack_upgrade.chart_settings(root, helm=helm, chart_repo=chart_repo, skip=skip_chart_render)
    prepared = stack_upgrade.prepare_rollback(git_repo, allow_operator_downgrade=allow_operator_downgrade,
                                              allow_unvalidated_driver=allow_unvalidated_driver,
                                              allow_unlisted_driver=allow_unlisted_driver, schema_root=schema_root,
                                              chart=chart, for_commit=not check_only)
    if check_only:
        _emit_plan(prepared, output)
        ctx.exit(0 if prepared.ok else 1)
    _commit(ctx, root, prepared, output, schema_root)


# ---------------------------------------------------------------------------- canary


@stack.command("canary", short_help="Watch a canary rollout; decide promote or roll back.")
@click.option("--pool", default=None, help="The canary pool (default: canary.yaml's, else the first non-default).")
@click.option("--analysis", "analysis_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Conditions file (default: <repo>/manifests/gpu-operator/canary.yaml; none: no conditions).")
@click.option("--prometheus", default=None, help="Prometheus URL for the conditions (default: canary.yaml's).")
@click.option("--window", type=float, default=None, help="Seconds the canary must hold (default: canary.yaml's, 60).")
@click.option("--timeout", type=float, default=None, help="Seconds before an unfinished canary rolls back.")
@click.option("--once", is_flag=True, help="Look once and report (exit 3 while undecided).")
@click.option("--commit", "make_commit", is_flag=True,
              help="Make the promote (--to all) or rollback commit; without it, print what it would do.")
@click.option("--server", default=None, help="API server URL (default: in-cluster or kubeconfig).")
@_chart_options
@_repo_option
@_schemas_option
@_output_option
@click.pass_context
def canary_command(ctx: click.Context, pool: str | None, analysis_file: Path | None, prometheus: str | None,
                   window: float | None, timeout: float | None, once: bool, make_commit: bool, server: str | None,
                   helm: str | None, chart_repo: str | None, skip_chart_render: bool, repo: Path,
                   schemas: Path | None, output: str) -> None:
    """Watch the canary pool until every node is upgrade-done at the driver Git pins for it and the
    conditions of canary.yaml held for the window (promote), or a node is upgrade-failed, a condition
    fails or the timeout passes (roll back). Exit 0 promote, 1 roll back, 3 undecided (--once, or
    the cluster or Prometheus did not answer: nothing is committed)."""
    from dataclasses import replace

    root = _root(repo)
    stack_now = manifests.load_stack(root)
    analysis = canary_watch.load_analysis(root, stack_now, pool=pool, path=analysis_file)
    if window is not None:
        analysis = replace(analysis, window_seconds=window)
    if timeout is not None:
        analysis = replace(analysis, timeout_seconds=timeout)
    driver = next(p.driver for p in stack_now.pools if p.name == analysis.pool)

    def report(verdict: Any) -> None:
        if output == "text":
            click.echo(f"canary {analysis.pool} at driver {driver}: {verdict.decision}: {'; '.join(verdict.reasons)}")

    try:
        verdict = canary_watch.watch(stack_now, analysis, driver, server=server, prometheus=prometheus, once=once,
                                     report=report)
    except GpugateError as err:
        # An unanswered look decides nothing: promoting would skip the analysis, rolling back would
        # revert a driver nothing showed to be bad (Argo Rollouts: an Error measurement is inconclusive).
        click.echo(f"error: {err}", err=True)
        click.echo(f"canary {analysis.pool} at driver {driver}: undecided: nothing committed", err=True)
        ctx.exit(3)
    sha = None
    if verdict.decision != "wait" and make_commit:
        Repo(root).require_clean(stack_upgrade.STACK_PATHS)
        schema_root = _schema_root(root, schemas)
        chart = stack_upgrade.chart_settings(root, helm=helm, chart_repo=chart_repo, skip=skip_chart_render)
        if verdict.decision == "promote":
            gate = compat.Check(name="canary-gate", subject=analysis.pool, ok=True, reason="; ".join(verdict.reasons))
            prepared = stack_upgrade.prepare_promote(root, source=analysis.pool, to="all",
                                                     allow_unvalidated_driver=False, schema_root=schema_root,
                                                     chart=chart, canary_gate=gate)
        else:
            prepared = stack_upgrade.prepare_rollback(Repo(root), allow_operator_downgrade=False,
                                                      allow_unvalidated_driver=False, allow_unlisted_driver=False,
                                                      schema_root=schema_root, chart=chart)
        if not prepared.ok:
            _emit_plan(prepared, output, {"committed": None})
            raise stack_upgrade.CheckFailed(prepared)
        sha = stack_upgrade.execute(Repo(root), prepared, schema_root=schema_root)
        if output == "text":
            click.echo(f"committed {sha[:12]}: gpugate stack: {prepared.plan.steps[0].title}")
    elif verdict.decision != "wait" and output == "text":
        would = "gpugate stack promote --from " + analysis.pool + " --to all" if verdict.decision == "promote" \
            else "gpugate stack rollback"
        click.echo(f"would run: {would} (pass --commit to make the commit)")
    if verdict.failed_nodes and output == "text":
        click.echo("once Argo CD has synced the rollback, retry each failed node (the operator does not): "
                   + "; ".join(f"kubectl label node {n} {stack_status.DRIVER_UPGRADE_STATE_LABEL}=upgrade-required "
                               "--overwrite" for n in verdict.failed_nodes))
    if output == "json":
        click.echo(json.dumps({"pool": analysis.pool, "driver": driver, "decision": verdict.decision,
                               "reasons": list(verdict.reasons), "failedNodes": list(verdict.failed_nodes),
                               "committed": sha}, indent=2))
    ctx.exit({"promote": 0, "rollback": 1}.get(verdict.decision, 3))
