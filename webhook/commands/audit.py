"""``gpugate audit``: judge what runs against today's policies; a table, JSON, or PolicyReports.

Thin: reading and writing are :mod:`webhook.audit.cluster`, judging :mod:`webhook.audit.findings`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from webhook.commands.clusteroptions import target_options
from webhook.kubetarget import Target

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

EXCLUDED = ("kube-system", "kube-public", "kube-node-lease", "gpugate-system", "gpu-operator")
"""The namespaces manifests/webhook's configurations leave out: admission never judges them, so
neither does the audit (a test keeps the two lists equal)."""


@click.command("audit")
@click.option("--policies", "policy_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("policies"),
              show_default=True, help="The GPUPolicy folder to judge by (in a cluster: the mounted ConfigMap), "
                                      "read again at every pass.")
@click.option("--namespace", "-n", "only", multiple=True, help="Judge only this namespace (repeatable).")
@click.option("--exclude-namespace", "excluded", multiple=True, default=EXCLUDED, show_default=True,
              help="Never judge this namespace (repeatable; replaces the default list).")
@click.option("--inventory", "inventory_file", type=click.Path(dir_okay=False, path_type=Path),
              help="The balancer's GPUInventory file, as gpugate serve --inventory reads it.")
@click.option("--write-reports", is_flag=True,
              help="Write one PolicyReport (wgpolicyk8s.io/v1alpha2) named gpugate per namespace; needs its CRD.")
@click.option("--interval", type=click.FloatRange(min=1), default=None,
              help="Judge again every so many seconds until stopped (SIGTERM or Ctrl-C); a policy change shows "
                   "at the next pass. Without it: one pass, exit 1 when an object fails.")
@click.option("-o", "--output", type=click.Choice(["table", "json", "none"]), default="table", show_default=True)
@target_options("API server URL (default: in-cluster or kubeconfig).")
def audit(policy_dir: Path, only: tuple[str, ...], excluded: tuple[str, ...], inventory_file: Path | None,
          write_reports: bool, interval: float | None, output: str, server: Target) -> None:
    """Judge every running pod and workload against the policies: fail (admission would refuse it
    now), warn (today's policies would shape the pod differently), pass."""
    from webhook.kubeclient import api_client

    failed = False
    with api_client(server) as api:
        if interval is None:
            failed = _pass(api, policy_dir, only, frozenset(excluded), inventory_file, write_reports, output)
        else:
            _until_stopped(interval, lambda: _pass(api, policy_dir, only, frozenset(excluded), inventory_file,
                                                   write_reports, output))
    if failed:
        raise click.exceptions.Exit(1)


def _pass(api: ApiClient, policy_dir: Path, only: tuple[str, ...], excluded: frozenset[str],
          inventory_file: Path | None, write_reports: bool, output: str) -> bool:
    """One audit: read, judge, print, write. True when an object fails."""
    from webhook.audit import cluster, findings
    from webhook.kube.inventory import EMPTY
    from webhook.policy import loading
    from webhook.server import inventoryfile

    policies = loading.load_servable(policy_dir)
    inventory = inventoryfile.read(inventory_file) if inventory_file else EMPTY
    namespaces, objects = cluster.read(api, only=only, excluded=excluded)
    now = datetime.now(UTC)
    found = findings.audit(objects, policies=policies, skipped_namespaces=findings.skipped(namespaces),
                           inventory=inventory, now=now)
    if output == "table":
        click.echo(findings.table(found))
    elif output == "json":
        click.echo(json.dumps({"revision": policies.revision, "findings": [f.as_dict() for f in found]}, indent=2))
    if write_reports:
        written = cluster.write(api, findings.reports(found, now=now), scope=only)
        if output != "json":
            click.echo(f"PolicyReports: {written} written or deleted (policies revision {policies.revision})",
                       err=True)
    return any(f.result == "fail" for f in found)


def _until_stopped(interval: float, one_pass: Callable[[], object]) -> None:
    """Run ``one_pass`` every ``interval`` seconds until SIGINT or SIGTERM; a pass that fails (the
    API server away, a policy folder mid-edit) is said on stderr and tried again at the next one."""
    from webhook.errors import GpugateError
    from webhook.localcluster import interrupts

    try:
        with interrupts.raised():
            while True:
                started = time.monotonic()
                try:
                    one_pass()
                except GpugateError as err:
                    click.echo(f"error: {err} (trying again in {interval:g} s)", err=True)
                threading.Event().wait(max(0.0, interval - (time.monotonic() - started)))
    except interrupts.Interrupted as signal_name:
        click.echo(f"{signal_name}: audit stopped", err=True)
