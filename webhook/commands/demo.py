"""``gpugate demo``: a local control plane with GPU nodes, the webhook and the balancer, and the example pods.

Thin: the work is :mod:`webhook.localcluster.demo`. Needs Go (to build the control plane once) and
a clone of gpugate for ``policies/`` and ``manifests/webhook/webhookconfigurations.yaml``.
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command("demo")
@click.option("--policies", type=click.Path(file_okay=False, path_type=Path), default=Path("policies"),
              show_default=True, help="The GPUPolicy folder the webhook serves.")
@click.option("--webhook-configurations", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("manifests/webhook/webhookconfigurations.yaml"), show_default=True,
              help="The configurations to register (pointed at the local server by URL).")
@click.option("--once", is_flag=True, help="Stop everything as soon as the table is printed.")
@click.option("--install", type=click.Choice(["manifests", "helm"]), default="manifests", show_default=True,
              help="Register the --webhook-configurations file, or install gpugate's Helm chart (--chart) with "
                   "its webhook pointed at the local server (tls.mode external).")
@click.option("--chart", type=click.Path(file_okay=False, path_type=Path), default=Path("manifests/chart/gpugate"),
              show_default=True, help="The chart --install helm installs.")
@click.option("--helm", default=None, help="The helm binary for --install helm [default: $GPUGATE_HELM, else helm "
                                           "on PATH].")
def demo(policies: Path, webhook_configurations: Path, once: bool, install: str, chart: Path,
         helm: str | None) -> None:
    """Start a local cluster of GPU nodes with gpugate, create the example pods, show what they became.

    With --install helm, gpugate's chart is what registers the webhook: `helm install` onto the
    demo's cluster as you would onto yours (export the KUBECONFIG it prints to run helm yourself)."""
    from webhook.localcluster import demo as demo_run
    from webhook.localcluster import interrupts

    try:
        rows = demo_run.run(demo_run.Settings(policies=policies, webhook_configurations=webhook_configurations,
                                              once=once, log=lambda line: click.echo(line, err=False),
                                              install=install, chart=chart, helm=helm))
    except interrupts.Interrupted as stop:
        click.echo(f"{stop} while starting: stopped everything the demo had started", err=True)
        raise SystemExit(interrupts.EXIT_STATUS) from None
    if any(pod.denied is None and pod.node is None for _, pod in rows):
        raise SystemExit(1)
