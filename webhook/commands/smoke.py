"""``gpugate smoke``: prove a running webhook shapes and denies pods, without running any pod.

What the chart's ``helm test`` runs (manifests/chart/gpugate/templates/tests/): it creates a GPU
pod in ``--shaped-namespace`` and one in ``--denied-namespace`` as server-side dry runs
(``dryRun=All``: the API server runs the whole admission chain, webhooks included since they
declare ``sideEffects: None``, and stores nothing). The first must come back shaped by a policy
(the ``gpugate.io/policy`` annotation and a GPU request), the second must be refused. Nothing needs
a GPU node or is left behind, so it is safe on a production cluster. Exit 0 when both hold, else 1.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import click
from kubernetes import client
from kubernetes.client.rest import ApiException

from webhook import names
from webhook.commands.clusteroptions import kubeconfig_options, target
from webhook.errors import GpugateError
from webhook.kube.pods import Pod
from webhook.kubeclient import api_client
from webhook.server import outcome

PROBE_IMAGE = "registry.k8s.io/pause:3.10"


def probe_pod(gpus: int = 1) -> Pod:
    """A pod that asks for GPUs the way an ML engineer does: one label, no GPU YAML."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "gpugate-smoke-", "labels": {names.GPUS_LABEL: str(gpus)}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "probe", "image": PROBE_IMAGE}]},
    }


NO_ACCOUNT_YET = 'serviceaccount "default" not found'
"""A namespace made a moment ago: the controller manager has not made its default ServiceAccount yet."""


def create_dry_run(core: client.CoreV1Api, namespace: str, pod: Pod, *, wait_for_account: float = 30.0
                   ) -> outcome.Outcome:
    """Create ``pod`` as a server-side dry run; the Outcome of what the API server answered.

    A refusal because the namespace's default ServiceAccount does not exist yet (the helm test hook
    made the namespace a moment ago) is retried for up to ``wait_for_account`` seconds."""
    deadline = time.monotonic() + wait_for_account
    while True:
        answer = _create_dry_run(core, namespace, pod)
        if answer.denied is None or NO_ACCOUNT_YET not in answer.denied or time.monotonic() > deadline:
            return answer
        time.sleep(0.5)


def _create_dry_run(core: client.CoreV1Api, namespace: str, pod: Pod) -> outcome.Outcome:
    try:
        # The raw answer: the pod as the API server made it, every field kept (no client models).
        answered: Any = core.create_namespaced_pod(namespace, cast(Any, pod), dry_run="All",
                                                   _preload_content=False)
    except ApiException as err:
        if err.status in (400, 403, 422):
            return outcome.refused(pod["metadata"]["generateName"], namespace=namespace,
                                   message=outcome.denial_text(err.body or str(err.reason)))
        raise GpugateError(f"creating a pod in namespace {namespace} failed: {err.status} {err.reason}: "
                           f"{outcome.denial_text(err.body or '')}") from err
    return outcome.admitted(json.loads(answered.data), namespace=namespace)


@click.command("smoke")
@click.option("--shaped-namespace", required=True, help="A namespace a policy shapes GPU pods in.")
@click.option("--denied-namespace", default="", help="A namespace a policy denies GPU pods in (empty: skip).")
@click.option("--server", help="API server URL (default: in-cluster, else kubeconfig).")
@kubeconfig_options
def smoke(shaped_namespace: str, denied_namespace: str, server: str | None, kubeconfig: str | None,
          context: str | None) -> None:
    """Dry-run a GPU pod where policies shape it and where they deny it; exit 1 unless both do."""
    failures = []
    with api_client(target(server, kubeconfig, context)) as api:
        core = client.CoreV1Api(api)
        shaped = create_dry_run(core, shaped_namespace, probe_pod())
        if shaped.denied is not None:
            failures.append(f"{shaped_namespace}: the GPU pod was refused: {shaped.denied}")
        elif not shaped.shaped:
            failures.append(f"{shaped_namespace}: the GPU pod came back without the {names.POLICY_ANNOTATION} "
                            "annotation: the webhook did not shape it (is it registered and reachable? "
                            "failurePolicy Ignore admits pods unshaped when it is not)")
        else:
            click.echo(f"shaped: {shaped_namespace}: policy {shaped.policy}, asks {shaped.asks()}")
        if denied_namespace:
            denied = create_dry_run(core, denied_namespace, probe_pod())
            if denied.denied is None:
                failures.append(f"{denied_namespace}: the GPU pod was admitted (policy {denied.policy or 'none'}); "
                                "a policy should have denied it")
            elif not outcome.by_gpugate(denied.denied):
                failures.append(f"{denied_namespace}: the GPU pod was refused, but not by gpugate: {denied.denied}")
            else:
                click.echo(f"denied: {denied_namespace}: {denied.denied}")
    for failure in failures:
        click.echo(f"FAIL {failure}", err=True)
    if failures:
        raise SystemExit(1)
