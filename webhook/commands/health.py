"""``gpugate health``: the quarantined GPUs, and an operator's release of one."""

from __future__ import annotations

import functools
import getpass
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from webhook import names
from webhook.commands.clusteroptions import target_options
from webhook.errors import GpugateError
from webhook.kubetarget import Target

if TYPE_CHECKING:
    from webhook.balancer.quarantineapi import HealthApi


def _api(server: Target, namespace: str | None) -> HealthApi:
    from webhook.balancer.quarantineapi import HealthApi
    from webhook.kubeclient import api_client

    namespace = namespace or os.environ.get("POD_NAMESPACE") or "gpugate-system"
    return HealthApi(api_client(server), namespace=namespace, ledger_name=names.HEALTH_LEDGER,
                     may_write=lambda: True, reporter=f"gpugate-health-cli@{os.uname().nodename}")


def _options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = target_options("API server URL (default: in-cluster, else kubeconfig).")(func)
    return click.option("--namespace", metavar="NS", help="The balancer's namespace, where the ledger ConfigMap "
                        f"{names.HEALTH_LEDGER} lives [default: $POD_NAMESPACE, else gpugate-system].")(func)


@click.group("health", invoke_without_command=True)
@_options
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def health(ctx: click.Context, server: Target, namespace: str | None, output: str) -> None:
    """List quarantined GPUs: why, since when, and what will return them (then the recent returns).

    The balancer's leader quarantines a GPU on a fatal XID, a double-bit ECC error, a failed row
    remap, its DRA driver's taint or its device plugin's health report (the ``health:`` section
    of its configuration, docs/health.md), and returns it only once a validation pod passed on it
    after the hold, or on ``gpugate health release``.
    """
    if ctx.invoked_subcommand is not None:
        return
    from kubernetes.client.exceptions import ApiException

    from webhook import kubeclient
    from webhook.balancer import quarantinereport

    api = _api(server, namespace)
    ledger, _ = kubeclient.call(api.read_ledger, f"reading ConfigMap {api.namespace}/{names.HEALTH_LEDGER}")
    try:
        rules = list(api.rules().values())
    except ApiException as err:
        if err.status != 404:
            raise GpugateError(f"listing DeviceTaintRules: {kubeclient.failure(err)}") from err
        rules = []  # before Kubernetes 1.37: no DeviceTaintRule in resource.k8s.io/v1
    found = quarantinereport.rows(ledger, rules, time.time())
    if output == "json":
        click.echo(json.dumps(quarantinereport.as_json(found, ledger), indent=2))
    else:
        click.echo(quarantinereport.table(found, ledger))


@health.command("release")
@click.argument("node")
@click.argument("gpu", required=False)
@click.option("--reason", required=True, help="Why it may return without a validation (kept in the ledger and "
              "the Node's Events).")
@click.option("--by", "who", metavar="NAME", help="Who releases it [default: the login name].")
@click.option("--wait", "wait_seconds", type=float, default=0.0, metavar="SECONDS",
              help="Wait until the balancer's leader has returned it (exit 1 if not within SECONDS).")
@_options
def release(node: str, gpu: str | None, reason: str, who: str | None, wait_seconds: float, server: Target,
            namespace: str | None) -> None:
    """Return NODE's quarantined GPU (its UUID, or a unique prefix; omitted: the node's only one) to service.

    The one way a GPU returns without passing a validation pod. The request is stored in the
    ledger and an Event on the Node; the balancer's leader removes the taints at its next pass and
    records who released it and why.
    """
    from webhook import kubeclient
    from webhook.balancer.quarantineledger import ReleaseRequest
    from webhook.balancer.quarantinereport import target

    api = _api(server, namespace)
    who = who or getpass.getuser()
    for _ in range(5):  # a conflict means the leader wrote the ledger meanwhile: read it again
        ledger, version = kubeclient.call(api.read_ledger, f"reading ConfigMap {api.namespace}/{names.HEALTH_LEDGER}")
        q = target(ledger, node, gpu)
        request = ReleaseRequest(node=q.node, gpu=q.gpu, by=who, reason=reason, at=time.time())
        if kubeclient.call(functools.partial(api.write_ledger, ledger.with_request(request), version),
                           "writing the ledger"):
            break
    else:
        raise GpugateError("the ledger kept changing under the release; try again")
    message = f"release of GPU {q.gpu or '(device plugin)'} requested by {who}: {reason}"
    kubeclient.call(lambda: api.event(q.node, "GPUReleaseRequested", message, warning=False, now=request.at),
                    "writing the Event")
    click.echo(f"{node}: {message}; the balancer's leader returns it at its next pass")
    if wait_seconds > 0:
        _wait(api, q.node, q.gpu, wait_seconds)


def _wait(api: HealthApi, node: str, gpu: str, seconds: float) -> None:
    from webhook import kubeclient

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ledger, _ = kubeclient.call(api.read_ledger, "reading the ledger")
        if ledger.find(node, gpu) is None:
            click.echo(f"{node}: GPU {gpu or '(device plugin)'} is back in service")
            return
        time.sleep(0.5)
    raise GpugateError(f"no balancer leader acted within {seconds:g} s: is it running with health.enabled?")
