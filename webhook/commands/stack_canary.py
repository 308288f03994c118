"""``gpugate stack canary``: watch a canary pool's rollout and decide promote or roll back.

The decision is ``webhook.stack.canary_watch``'s; this command prints it and, with ``--commit``,
makes the promote (``--to all``) or rollback commit through the same path as those commands.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from webhook.commands.clusteroptions import target_options
from webhook.commands.stack_canary_watch import WatchOptions, canary_watch_loop, watch_options
from webhook.commands.stack_options import (
    Workspace,
    output_option,
    workspace_options,
)
from webhook.commands.stack_render import emit_plan
from webhook.errors import GpugateError
from webhook.kubetarget import Target
from webhook.stack import canary_watch, compat, manifests
from webhook.stack import status as stack_status
from webhook.stack import upgrade as stack_upgrade
from webhook.stack.gitrepo import Repo


def _decided_commit(where: Workspace, pool: str, verdict: Any, *, output: str) -> str:
    """Make the promote (``--to all``) or rollback commit the verdict calls for; returns its sha."""
    where.clean_repo()
    root, schema_root, chart = where.root, where.schema_root, where.chart()
    if verdict.decision == "promote":
        gate = compat.Check(name="canary-gate", subject=pool, ok=True, reason="; ".join(verdict.reasons))
        prepared = stack_upgrade.prepare_promote(root, source=pool, to="all", schema_root=schema_root, chart=chart,
                                                 canary_gate=gate)
    else:
        prepared = stack_upgrade.prepare_rollback(Repo(root), schema_root=schema_root, chart=chart)
    if not prepared.ok:
        emit_plan(prepared, output, {"committed": None})
        raise stack_upgrade.CheckFailed(prepared)
    sha = stack_upgrade.execute(Repo(root), prepared, schema_root=schema_root)
    if output == "text":
        click.echo(f"committed {sha[:12]}: gpugate stack: {prepared.plan.steps[0].title}")
    return sha


def _report_end(pool: str, driver: str, verdict: Any, sha: str | None, *, committed: bool, output: str) -> None:
    """What to run next (without --commit), how to retry failed nodes, or the JSON verdict."""
    if verdict.decision != "wait" and not committed and output == "text":
        would = "gpugate stack promote --from " + pool + " --to all" if verdict.decision == "promote" \
            else "gpugate stack rollback"
        click.echo(f"would run: {would} (pass --commit to make the commit)")
    if verdict.failed_nodes and output == "text":
        click.echo("once Argo CD has synced the rollback, retry each failed node (the operator does not): "
                   + "; ".join(f"kubectl label node {n} {stack_status.DRIVER_UPGRADE_STATE_LABEL}=upgrade-required "
                               "--overwrite" for n in verdict.failed_nodes))
    if output == "json":
        click.echo(json.dumps({"pool": pool, "driver": driver, "decision": verdict.decision,
                               "reasons": list(verdict.reasons), "failedNodes": list(verdict.failed_nodes),
                               "committed": sha}, indent=2))


@click.command("canary", short_help="Watch a canary rollout; decide promote or roll back.")
@click.option("--pool", default=None, help="The canary pool (default: canary.yaml's, else the first non-default).")
@click.option("--analysis", "analysis_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Conditions file (default: <repo>/manifests/gpu-operator/canary.yaml; none: no conditions).")
@click.option("--prometheus", default=None, help="Prometheus URL for the conditions (default: canary.yaml's).")
@click.option("--window", type=float, default=None, help="Seconds the canary must hold (default: canary.yaml's, 60).")
@click.option("--timeout", type=float, default=None, help="Seconds before an unfinished canary rolls back.")
@click.option("--once", is_flag=True, help="Look once and report (exit 3 while undecided).")
@click.option("--commit", "make_commit", is_flag=True,
              help="Make the promote (--to all) or rollback commit; without it, print what it would do.")
@target_options("API server URL (default: in-cluster or kubeconfig).")
@watch_options
@workspace_options
@output_option
@click.pass_context
def canary_command(ctx: click.Context, pool: str | None, analysis_file: Path | None, prometheus: str | None,
                   window: float | None, timeout: float | None, once: bool, make_commit: bool, server: Target,
                   watch: WatchOptions | None, where: Workspace, output: str) -> None:
    """Watch the canary pool until every node is upgrade-done at the driver Git pins for it and the
    conditions of canary.yaml held for the window (promote), or a node is upgrade-failed, a condition
    fails or the timeout passes (roll back). Exit 0 promote, 1 roll back, 3 undecided (--once, or
    the cluster or Prometheus did not answer: nothing is committed).

    With --watch it is the controller that acts by itself (in the cluster, leader-elected): it follows
    every canary pool of canary.yaml through NVIDIA's upgrade states, commits and pushes the promote or
    rollback itself (never twice for one rollout, never forced) and runs until SIGTERM."""
    if watch is not None:
        canary_watch_loop(watch, where, server=server, prometheus=prometheus, analysis_file=analysis_file)
        return
    root = where.root
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
    make = verdict.decision != "wait" and make_commit
    if make:
        sha = _decided_commit(where, analysis.pool, verdict, output=output)
    _report_end(analysis.pool, driver, verdict, sha, committed=make, output=output)
    ctx.exit({"promote": 0, "rollback": 1}.get(verdict.decision, 3))
