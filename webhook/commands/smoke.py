"""``gpugate smoke``: prove a running webhook shapes and denies pods, without running any pod.

What the chart's ``helm test`` runs (manifests/chart/gpugate/templates/tests/): a GPU pod dry-run in
``--shaped-namespace`` must come back shaped by a policy (the ``gpugate.io/policy`` annotation and a
GPU request), one in ``--denied-namespace`` must be refused. The probing is ``webhook.server.probe``;
this command only reads its options and prints. Exit 0 when both hold, else 1.
"""

from __future__ import annotations

import click
from kubernetes import client

from webhook.commands.clusteroptions import kubeconfig_options, target
from webhook.kubeclient import api_client
from webhook.server import probe


@click.command("smoke")
@click.option("--shaped-namespace", required=True, help="A namespace a policy shapes GPU pods in.")
@click.option("--denied-namespace", default="", help="A namespace a policy denies GPU pods in (empty: skip).")
@click.option("--server", help="API server URL (default: in-cluster, else kubeconfig).")
@kubeconfig_options
def smoke(shaped_namespace: str, denied_namespace: str, server: str | None, kubeconfig: str | None,
          context: str | None) -> None:
    """Dry-run a GPU pod where policies shape it and where they deny it; exit 1 unless both do."""
    with api_client(target(server, kubeconfig, context)) as api:
        core = client.CoreV1Api(api)
        answers = [probe.shaped(core, shaped_namespace)]
        if denied_namespace:
            answers.append(probe.denied(core, denied_namespace))
    for held, _ in answers:
        if held:
            click.echo(held)
    failures = [failed for _, failed in answers if failed]
    for failure in failures:
        click.echo(f"FAIL {failure}", err=True)
    if failures:
        raise SystemExit(1)
