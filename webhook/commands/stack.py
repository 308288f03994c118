"""``gpugate stack``: status, plan, upgrade, promote and roll back the GPU stack declared in Git.

Thin: parse options, call ``webhook.stack``, render text or JSON, pick the exit code
(0 all checks pass / done, 1 a check failed or an error, 2 usage). The shared options live in
``stack_options``, the text forms in ``stack_render``, the canary command in ``stack_canary``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from webhook.commands.clusteroptions import target_options
from webhook.commands.stack_canary import canary_command
from webhook.commands.stack_options import (
    Workspace,
    change_options,
    cluster_option,
    output_option,
    repo_option,
    waiver_options,
    workspace_options,
)
from webhook.commands.stack_render import commit, emit_plan, render_status
from webhook.kubetarget import Target
from webhook.stack import canary_watch, manifests
from webhook.stack import plan as planning
from webhook.stack import status as stack_status
from webhook.stack import upgrade as stack_upgrade
from webhook.stack.checks import Waivers


@click.group("stack")
def stack() -> None:
    """Upgrade the GPU stack by one checked git commit; canary per pool, promote, roll back."""


stack.add_command(canary_command)


# ---------------------------------------------------------------------------- status


@stack.command("status", short_help="Show the stack Git declares (--kube: cluster).")
@repo_option
@click.option("--kube", is_flag=True, help="Also ask the cluster (ClusterPolicy, NVIDIADriver, GPU nodes).")
@target_options("API server URL (default: in-cluster or kubeconfig).")
@output_option
def status_command(repo: Path, kube: bool, server: Target, output: str) -> None:
    """What Git declares (and, with --kube, what the cluster reports)."""
    result = stack_status.status(repo, kube=kube or server.given, server=server)
    if output == "json":
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(render_status(result))
    # A failed node upgrade is visible nowhere in Argo CD (no condition says it): a script gating a
    # promotion on `status --kube` must not read it as success.
    if (result.get("cluster") or {}).get("upgradeFailed"):
        raise click.exceptions.Exit(1)


# ---------------------------------------------------------------------------- plan / upgrade / promote


def finishing_options(func: Any) -> Any:
    """What every command that ends in :func:`_finish` takes for it: the workspace (``where``), the
    output format (``output``) and the click context (``ctx``)."""
    return workspace_options(output_option(click.pass_context(func)))


def _finish(ctx: click.Context, where: Workspace, prepared: stack_upgrade.Prepared, output: str, *,
            check_only: bool = False) -> None:
    """Print the plan (``check_only``: exit 0 if it passes, 1 if not), or make its commit."""
    if check_only:
        emit_plan(prepared, output)
        ctx.exit(0 if prepared.ok else 1)
    commit(where.root, prepared, output, where.schema_root)


def _change_command(name: str, short_help: str, help_text: str, *, check_only: bool) -> click.Command:
    """``plan`` and ``upgrade``: one request, one set of options, the same checks; ``plan`` only prints."""
    def command(ctx: click.Context, request: planning.Request, cluster: stack_upgrade.ClusterReader | None,
                where: Workspace, output: str) -> None:
        _upgrade(ctx, request, cluster, where, output, check_only=check_only)

    command.__name__ = f"{name}_command"
    return stack.command(name, short_help=short_help, help=help_text)(
        change_options(cluster_option(finishing_options(command))))


plan_command = _change_command(
    "plan", "Print a change's checks and commits.",
    "Print every check (pass/fail, its cause and fix) and the commits an upgrade would make; exit 1 if\n"
    "any fails. With --kube (or --cluster-state) the preflight rules read the cluster.", check_only=True)
upgrade_command = _change_command(
    "upgrade", "Check a change and make one commit.",
    "Check (the plan, with the preflight rules under --kube), edit stack.yaml and every derived file,\n"
    "render the chart, re-validate, and make one commit.", check_only=False)


def _upgrade(ctx: click.Context, request: planning.Request, cluster: stack_upgrade.ClusterReader | None,
             where: Workspace, output: str, *, check_only: bool) -> None:
    """``plan`` is ``upgrade`` that only prints: the same request, the same checks, no commit (and
    so no need for a clean working tree)."""
    if not check_only:
        where.clean_repo()
    prepared = stack_upgrade.prepare_upgrade(where.root, request, schema_root=where.schema_root,
                                             cluster=cluster, chart=where.chart(),
                                             for_commit=not check_only)
    _finish(ctx, where, prepared, output, check_only=check_only)


@stack.command("promote", short_help="Carry a pool's driver to other pools.")
@click.option("--from", "source", required=True, help="The pool whose driver is carried over (e.g. canary).")
@click.option("--force", is_flag=True,
              help="Promote without the canary gate (every --from node upgrade-done at its driver, read from "
                   "the cluster); the commit says it was forced.")
@target_options("API server URL for the canary gate (default: in-cluster or kubeconfig).")
@click.option("--to", "to", required=True, help="A pool name, or all for every other pool.")
@waiver_options("unvalidated_driver", "unlisted_driver", "driver_downgrade")
@finishing_options
def promote_command(ctx: click.Context, source: str, force: bool, server: Target, to: str, waivers: Waivers,
                    where: Workspace, output: str) -> None:
    """Carry the canary pool's driver to another pool (or all) in one commit, once every node of the
    canary pool is upgrade-done at that driver in the cluster (--force skips that gate, and says so)."""
    where.clean_repo()
    chart = where.chart()
    gate = canary_watch.gate_check(manifests.load_stack(where.root), source, server, force=force)
    prepared = stack_upgrade.prepare_promote(where.root, source=source, to=to, schema_root=where.schema_root,
                                             waivers=waivers, chart=chart, canary_gate=gate)
    _finish(ctx, where, prepared, output)


@stack.command("sync", short_help="Commit a hand edit of stack.yaml or values.yaml, checked.")
@click.option("--check", "check_only", is_flag=True, help="Only print the checks and the commit; write nothing.")
@waiver_options("unvalidated_driver", "unlisted_driver", "driver_downgrade")
@cluster_option
@finishing_options
def sync_command(ctx: click.Context, check_only: bool, waivers: Waivers,
                 cluster: stack_upgrade.ClusterReader | None, where: Workspace, output: str) -> None:
    """Commit a hand edit of stack.yaml (a pool's upgradePolicy, labels, a new pool) or of values.yaml, and
    the files derived from stack.yaml, after the checks (the preflight rules too, with --kube)."""
    git_repo = where.clean_repo(allow=(manifests.STACK_FILE, manifests.VALUES_FILE))
    prepared = stack_upgrade.prepare_sync(git_repo, schema_root=where.schema_root, waivers=waivers,
                                          chart=where.chart(), for_commit=not check_only, cluster=cluster)
    _finish(ctx, where, prepared, output, check_only=check_only)


@stack.command("rollback", short_help="Undo the newest stack commit, checked.")
@click.option("--check", "check_only", is_flag=True, help="Only print the checks and what cannot be undone.")
@waiver_options("operator_downgrade", "unvalidated_driver", "unlisted_driver")
@finishing_options
def rollback_command(ctx: click.Context, check_only: bool, waivers: Waivers, where: Workspace, output: str) -> None:
    """Step back one stack commit: the newest not yet rolled back, with the upgrade checks; says what it cannot undo.

    A second rollback steps further back (it never re-applies what the first removed); to go
    forward again, run `gpugate stack upgrade`.
    """
    git_repo = where.clean_repo()
    prepared = stack_upgrade.prepare_rollback(git_repo, schema_root=where.schema_root, waivers=waivers,
                                              chart=where.chart(), for_commit=not check_only)
    _finish(ctx, where, prepared, output, check_only=check_only)
