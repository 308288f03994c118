"""``gpugate serve`` (the HTTPS admission server) and ``gpugate admit`` (send it one pod or review)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import socket
import ssl
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import jsonpatch

from webhook.admission import reviews
from webhook.certs import pki
from webhook.commands.settingsoptions import build, default_of, field_option
from webhook.errors import GpugateError, InputError, PolicyLoadError
from webhook.kube import claims
from webhook.kube.documents import read_one
from webhook.server import client
from webhook.server.serverstate import ServerSettings
from webhook.server.workershared import WorkerSettings

DEFAULT_BIND = "127.0.0.1:8443"
DEFAULT_STATE_DIR = Path(".gpugate")
RENEW_WITHIN_DAYS = 30


def _host_port(value: str, option: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}", param_hint=option)
    return host.strip("[]"), int(port)


def serving_bundle(state_dir: Path, *, service: str, namespace: str, now: datetime) -> tuple[Path, Path, Path]:
    """The self-signed serving pair in ``state_dir``: reused while valid for this Service, else made.

    A serving certificate close to expiry is renewed under the same CA while the CA itself is
    valid, so clients that trust it keep working. Returns (certfile, keyfile, ca file).
    """
    paths = state_dir / pki.CERT_FILE, state_dir / pki.KEY_FILE, state_dir / pki.CA_CERT_FILE
    try:
        bundle = pki.read_bundle(state_dir)
    except pki.CertError as err:
        click.echo(f"gpugate: the certificates in {state_dir} are unusable ({err}); making new ones", err=True)
        bundle = None
    if bundle is not None:
        fresh = not pki.needs_renewal(bundle.cert, within_days=RENEW_WITHIN_DAYS, now=now)
        if fresh and set(pki.service_dns_names(service, namespace)) <= _dns_names(bundle.cert):
            return paths
        if not pki.needs_renewal(bundle.ca_cert, within_days=RENEW_WITHIN_DAYS, now=now):
            renewed = pki.create_bundle(service=service, namespace=namespace, now=now,
                                          ca_cert=bundle.ca_cert, ca_key=bundle.ca_key)
            pki.write_bundle(renewed, state_dir)
            return paths
    pki.write_bundle(pki.create_bundle(service=service, namespace=namespace, now=now), state_dir)
    return paths


def _dns_names(cert_pem: bytes) -> set[str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(sans.get_values_for_type(x509.DNSName))


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """How ``gpugate serve`` listens and runs its workers. What each worker does is the server's own
    settings (``ServerSettings``: policies, failure modes, reloads) and its HTTP loop's
    (``WorkerSettings``: timeouts, drain, connections); the command builds all three from its options."""

    bind: str = DEFAULT_BIND
    certfile: Path | None = None
    keyfile: Path | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    service: str = "gpugate-webhook"
    """The Service the self-signed certificate names (manifests/webhook's)."""
    namespace: str = "gpugate-system"
    workers: int = 2
    """Worker processes: one per core of the Deployment's two-CPU limit."""
    threads: int = 4
    """Threads per worker: requests are short and CPU-bound, a few cover the waits on I/O."""
    metrics_bind: str | None = None
    http2: bool = False
    """HTTP/1.1 alone held 256 concurrent creators where HTTP/2 did not (docs/server.md)."""
    max_requests: int = 0
    """Recycle a worker after this many requests; 0: never."""


@click.command()
@field_option(ServeSettings, "bind", "--bind", show_default=True, help="HOST:PORT of the HTTPS listener.")
@field_option(ServerSettings, "policy_dir", "--policies", type=click.Path(path_type=Path),
              show_default=True, help="Folder of GPUPolicy files, watched for changes.")
@field_option(ServeSettings, "certfile", "--cert", type=click.Path(dir_okay=False, path_type=Path),
              help="Serving certificate (PEM). Without --cert/--key a self-signed pair is made in --state-dir.")
@field_option(ServeSettings, "keyfile", "--key", type=click.Path(dir_okay=False, path_type=Path),
              help="Its private key (PEM).")
@field_option(ServeSettings, "state_dir", "--state-dir", type=click.Path(file_okay=False, path_type=Path),
              show_default=True, help="Where the self-signed CA and certificate are kept and reused.")
@field_option(ServeSettings, "service", "--service", show_default=True, help="Service name for the certificate SANs.")
@field_option(ServeSettings, "namespace", "--namespace", show_default=True, help="Service namespace for the SANs.")
@field_option(ServeSettings, "workers", "--workers", type=click.IntRange(1, 64), show_default=True,
              help="Worker processes (one per core).")
@field_option(ServeSettings, "threads", "--threads", type=click.IntRange(1, 256), show_default=True,
              help="Threads per worker (requests are short and CPU-bound: a few are enough).")
@field_option(ServeSettings, "metrics_bind", "--metrics-bind",
              help="HOST:PORT for a plaintext /metrics-only listener (off unless given).")
@field_option(ServerSettings, "fail_closed", "--fail-closed", is_flag=True,
              help="Mutation too denies what it cannot shape, instead of admitting it unchanged.")
@field_option(ServerSettings, "fail_open", "--fail-open", is_flag=True,
              help="Validation admits, with a warning, what it cannot judge (for failurePolicy: Ignore; "
                   "docs/server.md says what that gives away).")
@field_option(ServerSettings, "reload_interval", "--reload-interval", type=click.FloatRange(0.1, 300),
              show_default=True, help="Seconds between checks of the policy folder and certificate files.")
@field_option(WorkerSettings, "request_timeout", "--request-timeout", type=click.FloatRange(0.1, 120),
              show_default=True,
              help="Seconds a client has to send a whole request (and to take the answer); slower ones get 408.")
@field_option(WorkerSettings, "drain_seconds", "--drain-seconds", type=click.FloatRange(0, 60), show_default=True,
              help="After SIGTERM, seconds a worker keeps answering (with Connection: close) before it stops.")
@field_option(ServeSettings, "http2", "--http2/--no-http2", show_default=True,
              help="Offer HTTP/2 by ALPN (the API server then takes it; gunicorn's HTTP/2). Off: HTTP/1.1 "
                   "alone, which held 256 concurrent creators where HTTP/2 did not (docs/server.md).")
@field_option(WorkerSettings, "connections_per_source", "--max-connections-per-source", type=click.IntRange(1),
              show_default=True,
              help="Open connections one client address may hold per worker; more are closed at once.")
@field_option(ServeSettings, "max_requests", "--max-requests", type=click.IntRange(0), show_default=True,
              help="Recycle a worker after this many requests (0: never).")
@field_option(ServerSettings, "inventory_file", "--inventory", type=click.Path(dir_okay=False, path_type=Path),
              help="The balancer's GPUInventory file (the gpugate-inventory ConfigMap, mounted); optional.")
@field_option(ServerSettings, "allow_empty", "--allow-empty-policies", is_flag=True,
              help="Serve a policy folder with no GPUPolicy (refused by default: it would lift every deny rule).")
@field_option(ServerSettings, "resolve_claims", "--resolve-claims", is_flag=True,
              help="Read the ResourceClaims and templates a pod references from the API (service account or "
                   "KUBECONFIG) so spec.gpu.max per pod counts their devices (docs/dra.md).")
def serve(**options: Any) -> None:
    """Serve the admission webhook over HTTPS (POST /mutate, /validate; GET /healthz, /readyz, /metrics)."""
    _serve(build(ServeSettings, options), build(ServerSettings, options), build(WorkerSettings, options))


def _serve(settings: ServeSettings, server: ServerSettings, worker: WorkerSettings) -> None:
    """Check what can be checked before gunicorn starts (each a clear error), then serve."""
    _host_port(settings.bind, "--bind")
    metrics_address = _host_port(settings.metrics_bind, "--metrics-bind") if settings.metrics_bind else None
    certfile, keyfile = settings.certfile, settings.keyfile
    if (certfile is None) != (keyfile is None):
        raise click.UsageError("give both --cert and --key, or neither for a self-signed pair in --state-dir")
    if not server.policy_dir.is_dir():
        raise GpugateError(f"policy folder {server.policy_dir} does not exist; pass --policies DIR")
    if certfile is None or keyfile is None:
        certfile, keyfile, ca_file = serving_bundle(settings.state_dir, service=settings.service,
                                                    namespace=settings.namespace, now=datetime.now(UTC))
        click.echo(f"gpugate: self-signed CA at {ca_file.resolve()} "
                   f"(verify with: gpugate admit POD.yaml --ca {ca_file})", err=True)
    for path in (certfile, keyfile):
        if not path.is_file():
            raise GpugateError(f"{path} does not exist")
    pki.check_pair(certfile.read_bytes(), keyfile.read_bytes(), cert_name=str(certfile), key_name=str(keyfile))
    if server.resolve_claims:
        _check_cluster_access()
    _check_port(settings.bind)

    def make_app(runtime_dir: Path) -> Any:
        from webhook.server import routes

        return routes.create_app(dataclasses.replace(server, snapshot_dir=runtime_dir / "policies"))

    click.echo(f"gpugate: serving https://{settings.bind} (policies: {server.policy_dir}, workers: "
               f"{settings.workers}, threads: {settings.threads})", err=True)
    not_ready = unservable_reason(server.policy_dir, allow_empty=server.allow_empty)
    if not_ready:
        click.echo(not_ready, err=True)
    run_gunicorn(make_app, bind=settings.bind, workers=settings.workers, threads=settings.threads, certfile=certfile,
                 keyfile=keyfile, reload_interval=server.reload_interval, metrics_bind=metrics_address,
                 max_requests=settings.max_requests, request_timeout=worker.request_timeout,
                 drain_seconds=worker.drain_seconds, connections_per_source=worker.connections_per_source,
                 http2=settings.http2)


def _check_cluster_access() -> None:
    """``--resolve-claims`` needs an API server to read from: found once here, before any worker
    starts, so a missing one is one clear error and exit 1 instead of workers failing in a loop."""
    from webhook.server.claimlookup import ClaimLookup

    try:
        ClaimLookup.from_environment()
    except GpugateError as err:
        raise GpugateError("--resolve-claims reads claims from the API server, and there is none to talk to "
                           f"({_cause(err)}): run the server in a pod with its service account, or set KUBECONFIG; "
                           "or leave --resolve-claims off") from err


def _cause(err: GpugateError) -> str:
    cause = err.__cause__
    return (str(cause).strip() or type(cause).__name__) if cause is not None else str(err)


def _check_port(bind: str) -> None:
    """A busy port is one line and exit 1, before anything says "serving".

    gunicorn binds on its own only after the banner, and a busy port then costs five retries and a
    log that reads like a crash. The port is tried here and released again: gunicorn binds it when its
    workers are about to start, so the API server's calls do not queue unanswered while the server
    starts (a socket bound early made a restart's first calls time out).
    """
    host, port = _host_port(bind, "--bind")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as gunicorn binds
        try:
            probe.bind((host, port))
        except OSError as err:
            why = "the address is in use (another process listens there)" if err.errno == errno.EADDRINUSE \
                else err.strerror
            raise GpugateError(f"cannot listen on {bind}: {why}; pass another --bind HOST:PORT") from err


def unservable_reason(policy_dir: Path, *, allow_empty: bool) -> str:
    """Why the server will not be ready with ``policy_dir`` as it is now, in words (empty: it will be).

    The workers log the same refusal as JSON; this is the line a person starting the server reads.
    """
    from webhook.policy import loading

    try:
        loading.load_servable(policy_dir, allow_empty=allow_empty)
    except PolicyLoadError as err:
        problems = "\n".join(f"  {problem}" for problem in err.problems)
        return (f"gpugate: NOT READY: the policies in {policy_dir} cannot be served:\n{problems}\n"
                f"gpugate: /readyz answers 503 and admissions get no policy until a valid set loads; the folder "
                f"is watched, so fix it in place (check it with: gpugate policy check {policy_dir})")
    return ""


def run_gunicorn(make_app: Callable[[Path], Any], *, bind: str, workers: int, threads: int, certfile: Path,
                 keyfile: Path, reload_interval: float = default_of(ServerSettings, "reload_interval"),
                 metrics_bind: tuple[str, int] | None = None,
                 max_requests: int = default_of(ServeSettings, "max_requests"),
                 request_timeout: float = default_of(WorkerSettings, "request_timeout"),
                 drain_seconds: float = default_of(WorkerSettings, "drain_seconds"),
                 connections_per_source: int = default_of(WorkerSettings, "connections_per_source"),
                 http2: bool = default_of(ServeSettings, "http2")) -> None:
    """Run ``make_app(runtime_dir)`` in gunicorn workers until the master is stopped.

    ``runtime_dir`` is a fresh temporary folder shared by the master and its workers: Prometheus'
    multiprocess sample files, and the last accepted policy set. The benchmark runs its null
    webhook through here too, so both sides of its comparison share every part but the core.
    """
    runtime_dir = Path(tempfile.mkdtemp(prefix="gpugate-"))
    (runtime_dir / "metrics").mkdir()
    # Before anything imports prometheus_client: each run gets fresh multiprocess sample files.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(runtime_dir / "metrics")
    # gunicorn forks its workers from inside run(), so a worker that exits unwinds through this
    # frame too: only the master may remove the folder its live and future workers write into.
    master_pid = os.getpid()
    try:
        from webhook.server import serving, workershared

        workershared.configure(WorkerSettings(request_timeout=request_timeout,
                                                           drain_seconds=drain_seconds,
                                                           connections_per_source=connections_per_source),
                               max_workers=workers)
        try:
            reloader = serving.CertReloader(certfile, keyfile, interval=reload_interval,
                                            alpn=serving.ALPN if http2 else ("http/1.1",))
        except ssl.SSLError as err:
            raise GpugateError(f"cannot use {certfile} / {keyfile}: {err}") from err
        options = serving.gunicorn_options(bind=bind, workers=workers, threads=threads, certfile=certfile,
                                           keyfile=keyfile, reloader=reloader, metrics_bind=metrics_bind,
                                           max_requests=max_requests, http2=http2)
        serving.GunicornServer(lambda: make_app(runtime_dir), options).run()
    finally:
        if os.getpid() == master_pid:
            shutil.rmtree(runtime_dir, ignore_errors=True)


# --- admit -------------------------------------------------------------------------------------

def _read_document(path: Path) -> dict[str, Any]:
    document = read_one(path)
    if document.get("kind") not in ("Pod", reviews.KIND) and not claims.is_claim_document(document):
        raise InputError(f"{path} holds neither a Pod, a ResourceClaim, a ResourceClaimTemplate nor an "
                         f"AdmissionReview (kind {document.get('kind')!r})")
    return document


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--server", default=f"https://{DEFAULT_BIND}", show_default=True, help="Base URL of gpugate serve.")
@click.option("--ca", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help=f"CA certificate to verify the server (default: {DEFAULT_STATE_DIR}/ca.crt when present).")
@click.option("--server-name", help="Verify the certificate for this name instead of the URL's host.")
@click.option("--endpoint", type=click.Choice(["mutate", "validate", "both"]), default="both", show_default=True)
@click.option("--namespace", "-n", help="Namespace of the request (default: the pod's, else 'default').")
@click.option("--dry-run", is_flag=True, help="Mark the review as a dry run.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def admit(file: Path, server: str, ca: Path | None, server_name: str | None, endpoint: str,
          namespace: str | None, dry_run: bool, output: str) -> None:
    """Send FILE (a Pod, ResourceClaim or ResourceClaimTemplate, wrapped in an AdmissionReview, or a
    review) to the server; print the answer.

    Exit 0 when every endpoint allowed it, 1 when one denied it or the server refused the review.
    """
    document = _read_document(file)
    if ca is None and (DEFAULT_STATE_DIR / pki.CA_CERT_FILE).is_file():
        ca = DEFAULT_STATE_DIR / pki.CA_CERT_FILE
    review: Mapping[str, Any]
    if document["kind"] == "Pod" or claims.is_claim_document(document):
        review = reviews.wrap_pod(document, uid=str(uuid.uuid4()), namespace=namespace, dry_run=dry_run)
    else:
        review = document
    endpoints = ["mutate", "validate"] if endpoint == "both" else [endpoint]
    all_allowed = True
    for name in endpoints:
        status, body = client.post_review(server, name, review, ca=ca, server_name=server_name)
        if status != 200:
            message = body.get("error") if isinstance(body, dict) else body
            raise GpugateError(f"{server}/{name} answered HTTP {status}: {message}")
        if output == "json":
            click.echo(json.dumps(body, indent=2))
            allowed = bool((body.get("response") or {}).get("allowed"))
        else:
            text, allowed = client.render_response(name, body)
            click.echo(text)
        all_allowed = all_allowed and allowed
        if name == "mutate" and not allowed and "validate" in endpoints:
            # The API server never calls a validating webhook on an object a mutating one refused.
            if output != "json":
                click.echo("validate: not asked (the API server stops at the mutating webhook's refusal)")
            break
        patch = (body.get("response") or {}).get("patch") if isinstance(body, dict) else None
        if name == "mutate" and patch and isinstance(review.get("request"), dict):
            # The API server validates the mutated object: so does admit.
            review = json.loads(json.dumps(review))
            review["request"]["object"] = jsonpatch.apply_patch(review["request"]["object"],
                                                                reviews.decode_patch(patch))
    if not all_allowed:
        sys.exit(1)
