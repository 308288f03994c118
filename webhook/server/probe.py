"""Probe a running webhook through the API server: dry-run a GPU pod and read what came back.

What ``gpugate smoke`` (the chart's ``helm test``) and ``gpugate demo`` both ask: it creates a GPU
pod as a server-side dry run (``dryRun=All``: the API server runs the whole admission chain,
webhooks included since they declare ``sideEffects: None``, and stores nothing), so nothing needs a
GPU node or is left behind and it is safe on a production cluster. The probe lives beside the
server it proves, below the commands and the local cluster that run it.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

from kubernetes import client
from kubernetes.client.rest import ApiException

from webhook import names
from webhook.errors import GpugateError
from webhook.kube.pods import Pod
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


def shaped(core: client.CoreV1Api, namespace: str) -> tuple[str, str]:
    """(what held, what failed) for a GPU pod in a namespace a policy shapes; one of them is empty."""
    answer = create_dry_run(core, namespace, probe_pod())
    if answer.denied is not None:
        return "", f"{namespace}: the GPU pod was refused: {answer.denied}"
    if not answer.shaped:
        return "", (f"{namespace}: the GPU pod came back without the {names.POLICY_ANNOTATION} "
                    "annotation: the webhook did not shape it (is it registered and reachable? "
                    "failurePolicy Ignore admits pods unshaped when it is not)")
    return f"shaped: {namespace}: policy {answer.policy}, asks {answer.asks()}", ""


def denied(core: client.CoreV1Api, namespace: str) -> tuple[str, str]:
    """(what held, what failed) for a GPU pod in a namespace a policy denies; one of them is empty."""
    answer = create_dry_run(core, namespace, probe_pod())
    if answer.denied is None:
        return "", (f"{namespace}: the GPU pod was admitted (policy {answer.policy or 'none'}); "
                    "a policy should have denied it")
    if not outcome.by_gpugate(answer.denied):
        return "", f"{namespace}: the GPU pod was refused, but not by gpugate: {answer.denied}"
    return f"denied: {namespace}: {answer.denied}", ""
