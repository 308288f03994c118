"""``gpugate balance``: run the node-load balancer (flags > ``--config`` YAML > defaults)."""

from __future__ import annotations

import gc
import os
import signal
import socket
from pathlib import Path
from typing import Any

import click

from webhook.balancer.settings import BalancerSettings
from webhook.commands.clusteroptions import kubeconfig_options, target
from webhook.errors import GpugateError

DEFAULTS = BalancerSettings()
"""What a flag left out gives (the file's value aside): the help texts show these, written once in
``webhook/balancer/settings.py``."""

FLAG_FIELDS: dict[str, str] = {
    "prometheus": "prometheus__url", "dry_run": "dry_run", "server": "server", "health_bind": "health_bind",
    "taint_congested": "taint_congested", "lease_name": "lease__name", "lease_namespace": "lease__namespace",
    "identity": "lease__identity", "write_qps": "write_qps", "write_burst": "write_burst",
    "write_interval": "write_interval", "publish_inventory": "inventory__enabled",
    "extender_bind": "extender__bind", "extender_cert": "extender__cert_file", "extender_key": "extender__key_file",
    "extender_device_policy": "extender__device_policy", "extender_mix": "extender__mix_file",
    "usage": "usage__enabled",
    "policies": "usage__policies",
}
"""Each settings flag and the ``BalancerSettings`` field it sets (``section__field`` reaches into a section)."""


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def _env_default(name: str, fallback: str) -> str:
    return os.environ.get(name) or fallback


@click.command("balance")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML settings file (keys: tiers, taint_congested, prometheus, lease, resync_interval, ...).")
@click.option("--prometheus", metavar="URL", help="Prometheus base URL for DCGM utilization; "
              "without it tiers come from allocation only.")
@click.option("--dry-run", is_flag=True, default=None, help="Log the label/taint changes instead of writing them.")
@click.option("--server", metavar="URL", help="API server URL (default: in-cluster, else kubeconfig).")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="With --server: a file holding the bearer token to send (e.g. a ServiceAccount token from "
              "the TokenRequest API); re-read whenever a client is made.")
@click.option("--certificate-authority", "ca_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="With an https --server: the CA that signed its certificate [default: the system's].")
@click.option("--write-qps", type=float, help=f"Node patches per second, sustained [default: {DEFAULTS.write_qps:g}].")
@click.option("--write-burst", type=int,
              help=f"Node patches allowed at once after a quiet spell [default: {DEFAULTS.write_burst}].")
@click.option("--write-interval", type=float, metavar="SECONDS",
              help=f"Least time between two patches of one node that change only gpu-free [default: "
                   f"{DEFAULTS.write_interval:g}].")
@click.option("--lease-name", metavar="NAME", help=f"Lease used for leader election [default: {DEFAULTS.lease.name}].")
@click.option("--lease-namespace", metavar="NS",
              help="Namespace of the Lease [default: $POD_NAMESPACE, else gpugate-system].")
@click.option("--identity", metavar="ID", help="This replica's holder identity [default: $POD_NAME, else hostname].")
@click.option("--health-bind", metavar="HOST:PORT",
              help=f"Plaintext /healthz and /metrics [default: {DEFAULTS.health_bind}].")
@click.option("--taint-congested/--no-taint-congested", default=None,
              help="Also taint congested nodes gpugate.io/congested:PreferNoSchedule "
                   f"[default: {_on_off(DEFAULTS.taint_congested)}].")
@click.option("--inventory/--no-inventory", "publish_inventory", default=None,
              help="Publish the GPUInventory ConfigMap (gpugate-inventory) the webhook right-sizes by "
              f"[default: {_on_off(DEFAULTS.inventory.enabled)}; the leader writes it].")
@click.option("--extender-bind", metavar="HOST:PORT",
              help="Serve kube-scheduler's extender prioritize call over HTTPS here [default: not served].")
@click.option("--extender-cert", metavar="FILE", help="With --extender-bind: the serving certificate (PEM).")
@click.option("--extender-key", metavar="FILE", help="With --extender-bind: its private key (PEM).")
@click.option("--extender-device-policy", type=click.Choice(["distributed", "packed"]),
              help="The device plugin's allocation policy for time-sliced shares, as the cluster runs it "
              "(its flags.plugin.sharedDevicesAllocationPolicy): which GPU the extender assumes a share got "
              f"[default: {DEFAULTS.extender.device_policy}, the device plugin's default].")
@click.option("--extender-mix", metavar="FILE",
              help="The cluster's typical pod shapes for the extender's measure (YAML; gpugate replay writes "
              "one from a pod list as pod-mix.yaml) [default: learned from the last 2,000 pods created].")
@click.option("--usage/--no-usage", "usage", default=None,
              help="Export the GPUs each pod holds (by namespace and owner) and look for idle allocations "
              f"[default: {_on_off(DEFAULTS.usage.enabled)}; docs/usage.md].")
@click.option("--policies", metavar="DIR", type=click.Path(exists=True, file_okay=False),
              help="With --usage: the GPUPolicy folder whose spec.idle says what may be done with an idle pod "
              "[default: none, report only].")
@kubeconfig_options
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def balance(config_file: Path | None, token_file: Path | None, ca_file: Path | None, log_level: str,
            kubeconfig: str | None, context: str | None, **flags: Any) -> None:
    """Label GPU nodes gpugate.io/gpu-free and gpugate.io/gpu-load from live load.

    Lists and watches nodes and pods, optionally reads DCGM utilization from Prometheus, and
    patches each GPU node's labels (and optional PreferNoSchedule taint) when they change, and
    publishes the GPUInventory (ConfigMap gpugate-inventory) the webhook right-sizes by. One
    replica writes, chosen by a coordination.k8s.io Lease; SIGTERM releases it. With
    --extender-bind every replica also answers kube-scheduler's extender prioritize call.
    """
    from kubernetes.config import ConfigException

    from webhook import logs
    from webhook.balancer.controller import Balancer
    from webhook.kubeclient import NO_CLUSTER, api_client

    settings = settings_from(config_file, **flags)
    if (token_file or ca_file) and not settings.server:
        raise click.UsageError("--token-file and --certificate-authority go with --server")
    cluster = target(settings.server, kubeconfig, context)
    logs.configure(log_level)
    # Decoding lists allocates millions of short-lived, acyclic dicts: collecting cycles among them
    # every 700 allocations cost more CPU than the decoding itself. Objects that live (the state)
    # are few and cycle-free, so the collector may run far less often.
    gc.set_threshold(50_000, 20, 20)
    gc.freeze()

    def client_factory() -> Any:
        token = token_file.read_text(encoding="utf-8").strip() if token_file else None
        return api_client(cluster, token=token, ca_file=str(ca_file) if ca_file else None)

    try:
        balancer = Balancer(settings, client_factory=client_factory, serve_health=True)
    except ConfigException as err:
        raise GpugateError(NO_CLUSTER.format(reason=err)) from err

    def on_signal(signum: int, frame: Any) -> None:
        balancer.stop()  # run() then releases the lease, so a standby takes over at once

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    balancer.run()


def settings_from(config_file: Path | None, **flags: Any) -> BalancerSettings:
    """Defaults, then the file, then flags; an empty lease namespace or identity comes from the
    ``POD_NAMESPACE`` / ``POD_NAME`` environment (the Deployment's downward API), else defaults."""
    unknown = sorted(set(flags) - set(FLAG_FIELDS))
    if unknown:
        raise TypeError(f"not a balancer settings flag: {', '.join(unknown)}")
    base = BalancerSettings.from_file(config_file) if config_file else BalancerSettings()
    settings = base.with_overrides(**{FLAG_FIELDS[flag]: value for flag, value in flags.items()})
    return settings.with_overrides(
        lease__namespace=settings.lease.namespace or _env_default("POD_NAMESPACE", "gpugate-system"),
        lease__identity=settings.lease.identity or _env_default("POD_NAME", socket.gethostname()),
    )
