"""``gpugate certs``: make the webhook's serving certificate, locally and/or in the cluster.

Locally (``--out DIR``) it writes ca.crt, ca.key, tls.crt, tls.key, keeping a valid bundle.
In the cluster (``--secret NS/NAME [--patch-webhooks NAME[,NAME]]``) it creates or renews the
kubernetes.io/tls Secret and makes the webhook configurations trust its CA; see
``webhook.certs.pki.publish``. Both are idempotent: nothing due, nothing written.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from webhook.certs import pki as certfiles
from webhook.certs import publish
from webhook.commands.clusteroptions import kubeconfig_options, target
from webhook.errors import GpugateError
from webhook.kubeclient import api_client


def _webhook_names(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    names = tuple(part.strip() for part in value.split(","))
    if not all(names):
        raise click.BadParameter(f"expected NAME[,NAME], got {value!r}", ctx=ctx, param=param)
    return names


def _secret_ref(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, str] | None:
    if value is None:
        return None
    try:
        return publish.parse_secret_ref(value)
    except GpugateError as err:
        raise click.BadParameter(str(err), ctx=ctx, param=param) from err


@click.command("certs")
@click.option("--service", default="gpugate-webhook", show_default=True,
              help="Service the certificate is for (SANs <svc>, <svc>.<ns>, <svc>.<ns>.svc).")
@click.option("--namespace", default="gpugate-system", show_default=True, help="Namespace of that Service.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for ca.crt, ca.key, tls.crt, tls.key. A valid bundle already there is kept; "
                   "one missing, expiring within --renew-within or for another Service is replaced. "
                   "With --secret: a copy of the bundle this run made.")
@click.option("--days", type=click.IntRange(1, 3650), default=365, show_default=True,
              help="Lifetime of a new certificate.")
@click.option("--renew-within", type=click.FloatRange(0, 3650), default=30.0, show_default=True,
              help="Renew when the certificate expires within this many days.")
@click.option("--secret", "secret_ref", callback=_secret_ref, metavar="NS/NAME",
              help="The kubernetes.io/tls Secret to create or renew in the cluster.")
@click.option("--patch-webhooks", "webhooks", callback=_webhook_names, metavar="NAME[,NAME]",
              help="Mutating/ValidatingWebhookConfigurations whose caBundle must trust the Secret's CA.")
@click.option("--server", help="API server URL (default: in-cluster, else kubeconfig).")
@kubeconfig_options
def certs(service: str, namespace: str, out: Path | None, days: int, renew_within: float,
          secret_ref: tuple[str, str] | None, webhooks: tuple[str, ...], server: str | None,
          kubeconfig: str | None, context: str | None) -> None:
    """Create or renew the webhook's serving certificate; install it in the cluster if asked."""
    if renew_within >= days:
        raise click.UsageError(f"--renew-within ({renew_within:g}) must be less than --days ({days}), "
                               "or every run would renew the certificate it just made")
    if webhooks and secret_ref is None:
        raise click.UsageError("--patch-webhooks needs --secret: the caBundle is the CA of that Secret")
    if secret_ref is None and out is None:
        raise click.UsageError("say where the certificate goes: --out DIR, --secret NS/NAME, or both")
    now = datetime.now(UTC)
    if secret_ref is None:
        assert out is not None
        _local(out, service=service, namespace=namespace, now=now, days=days, renew_within=renew_within)
        return
    secret_namespace, secret_name = secret_ref
    with api_client(target(server, kubeconfig, context)) as api:
        result = publish.install(
            api, secret_namespace=secret_namespace, secret_name=secret_name, service=service,
            namespace=namespace, webhooks=webhooks, now=now, days=days, renew_within_days=renew_within,
        )
    expiry = result.not_after.strftime("%Y-%m-%d %H:%M UTC")
    if result.action == "unchanged":
        click.echo(f"Secret {result.secret}: valid until {expiry}, unchanged")
    else:
        click.echo(f"Secret {result.secret}: {result.action} ({result.reason}); valid until {expiry}")
    for change in result.webhooks:
        click.echo(str(change))
    if out is not None:
        if result.bundle is not None:
            certfiles.write_bundle(result.bundle, out)
            click.echo(f"wrote {out}/{{ca.crt,ca.key,tls.crt,tls.key}}")
        else:
            click.echo(f"{out}: not written (the Secret was unchanged and it holds no CA key)")


def _local(out: Path, *, service: str, namespace: str, now: datetime, days: int, renew_within: float) -> None:
    existing = certfiles.read_bundle(out)
    data = None if existing is None else {"tls.crt": existing.cert, "tls.key": existing.key, "ca.crt": existing.ca_cert}
    reason = publish.renewal_reason(data, service=service, namespace=namespace, now=now, within_days=renew_within)
    if reason is None:
        assert existing is not None
        expiry = certfiles.not_after(existing.cert).strftime("%Y-%m-%d %H:%M UTC")
        click.echo(f"{out}: valid until {expiry}, unchanged")
        return
    bundle = certfiles.create_bundle(service=service, namespace=namespace, now=now, days=days)
    certfiles.write_bundle(bundle, out)
    expiry = certfiles.not_after(bundle.cert).strftime("%Y-%m-%d %H:%M UTC")
    click.echo(f"{out}: {'created' if existing is None else 'renewed'} ({reason}); valid until {expiry}")
