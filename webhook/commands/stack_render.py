"""What the ``gpugate stack`` commands print: the text forms of a status and of a plan (``-o text``;
JSON is the dicts themselves), and the report of a commit made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from webhook.stack import status as stack_status
from webhook.stack import upgrade as stack_upgrade
from webhook.stack.gitrepo import Repo


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
    for decision in git.get("canaryDecisions", []):
        mode = f" ({decision['mode']})" if decision.get("mode") else ""
        lines.append(f"  canary {decision['decision']}{mode} of pool {decision['pool']}'s rollout "
                     f"{decision['rollout'][:12]} by {decision['sha'][:12]}: {decision['subject']}")
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


def render_plan(data: dict[str, Any]) -> str:
    lines = [f"plan: {data.get('title') or data['action']}", "checks:"]
    width = max((len(c["name"] + (f"[{c['subject']}]" if c.get("subject") else "")) for c in data["checks"]), default=0)
    for check in data["checks"]:
        label = check["name"] + (f"[{check['subject']}]" if check.get("subject") else "")
        verdict = "SKIP" if check.get("skipped") else "PASS" if check["ok"] else "FAIL"
        lines.append(f"  {verdict}  {label:<{width}}  {check['reason']}")
        if check.get("fix") and not check["ok"]:
            lines.append(f"        {'':<{width}}  fix: {check['fix']}")
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
    skipped = [c["name"] for c in data["checks"] if c.get("skipped")]
    if failed:
        lines.append(f"result: {len(failed)} check(s) failed")
    elif skipped:
        lines.append(f"result: every check that ran passes; {len(skipped)} skipped ({', '.join(skipped)})")
    else:
        lines.append("result: all checks pass")
    return "\n".join(lines)


def emit_plan(prepared: stack_upgrade.Prepared, output: str, extra: dict[str, Any] | None = None) -> None:
    data = stack_upgrade.plan_as_dict(prepared)
    if extra:
        data.update(extra)
    click.echo(json.dumps(data, indent=2) if output == "json" else render_plan(data))


def commit(root: Path, prepared: stack_upgrade.Prepared, output: str,
            schema_root: Path | None) -> None:
    """Make the prepared commit and print it; a failed plan is printed and raised (exit 1)."""
    repo = Repo(root)
    if not prepared.ok:
        emit_plan(prepared, output, {"committed": None})
        raise stack_upgrade.CheckFailed(prepared)
    sha = stack_upgrade.execute(repo, prepared, schema_root=schema_root)
    if output == "json":
        emit_plan(prepared, output, {"committed": sha})
    else:
        click.echo(render_plan(stack_upgrade.plan_as_dict(prepared)))
        click.echo(f"committed {sha[:12]}: gpugate stack: {prepared.plan.steps[0].title}")
        if len(prepared.plan.steps) > 1:
            click.echo(f"next: {prepared.plan.steps[1].title} -- {prepared.plan.steps[1].note}")
