"""Install the webhook's TLS material in the cluster: the Secret and the two caBundles.

What ``gpugate certs --secret NS/NAME --patch-webhooks NAME[,NAME]`` does, in a Job:

1. read the ``kubernetes.io/tls`` Secret; create it when missing, replace it when it is
   incomplete, does not name the Service, or expires within the renewal window;
2. make every webhook of the named Mutating/ValidatingWebhookConfigurations trust the
   Secret's CA (``clientConfig.caBundle``), patching only the ones that do not yet.

A second run with nothing due changes nothing (no write at all), so the Job can run on every
sync and weekly. On a renewal the new CA goes into the caBundle *next to* the previous one: the
webhook pods keep serving the old certificate until their certificate watcher picks up the new
files, and the API server must trust both in that window. The next renewal drops the older CA.

The pure parts (why a Secret must be renewed, what a caBundle should become) are plain
functions with no I/O; ``install`` is the edge that talks to the API with the real client.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import urllib3.exceptions
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes import client
from kubernetes.client.rest import ApiException

from webhook import __version__, kubeclient
from webhook.certs import pki
from webhook.errors import ClusterAPIError, GpugateError

TLS_SECRET_TYPE = "kubernetes.io/tls"
SECRET_KEYS: tuple[str, ...] = ("tls.crt", "tls.key", "ca.crt")
MANAGED_BY = "gpugate-certs"

KubeObject = dict[str, Any]


@dataclass(frozen=True)
class WebhookChange:
    """What happened to one webhook configuration's caBundles."""

    kind: str
    name: str
    patched: int  # webhooks whose caBundle was written
    total: int

    def __str__(self) -> str:
        if self.patched:
            return f"{self.kind}/{self.name}: caBundle patched on {self.patched} of {self.total} webhook(s)"
        return f"{self.kind}/{self.name}: caBundle already trusts the CA, unchanged"


@dataclass(frozen=True)
class InstallResult:
    """The outcome of one run: enough for the CLI to print and for tests to assert on."""

    secret: str  # "namespace/name"
    action: str  # "created" | "renewed" | "unchanged"
    reason: str  # why it was created or renewed; "" when unchanged
    not_after: datetime
    webhooks: tuple[WebhookChange, ...]
    bundle: pki.CertBundle | None  # the bundle made in this run (with its CA key), else None

    @property
    def changed(self) -> bool:
        return self.action != "unchanged" or any(w.patched for w in self.webhooks)


# --- pure decisions -----------------------------------------------------------------------------

def renewal_reason(data: dict[str, bytes] | None, *, service: str, namespace: str, now: datetime,
                   within_days: float) -> str | None:
    """Why the Secret holding ``data`` (decoded values) must be (re)written, or None if it is fine."""
    if data is None:
        return "missing"
    for key in SECRET_KEYS:
        if not data.get(key):
            return f"has no {key}"
    try:
        pki.check_pair(data["tls.crt"], data["tls.key"], cert_name="tls.crt", key_name="tls.key")
        cert = x509.load_pem_x509_certificate(data["tls.crt"])
        _ca_certificates(data["ca.crt"])
    except (GpugateError, ValueError) as err:
        return f"is unreadable ({err})"
    try:
        sans = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
                   .value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        sans = set()
    wanted = f"{service}.{namespace}.svc"
    if wanted not in sans:
        return f"does not name {wanted}"
    if pki.needs_renewal(data["tls.crt"], within_days=within_days, now=now):
        expiry = pki.not_after(data["tls.crt"]).strftime("%Y-%m-%d %H:%M UTC")
        return f"expires {expiry}, within the {within_days:g}-day renewal window"
    return None


def desired_ca_bundle(current: bytes | None, *, ca: bytes, previous_ca: bytes | None = None) -> bytes | None:
    """The caBundle (PEM) a webhook should carry, or None when ``current`` already trusts ``ca``.

    ``previous_ca`` is given only right after a renewal: the bundle then holds the new CA and
    the previous one, so pods still serving the old certificate stay trusted until they reload.
    """
    wanted = _ca_certificates(ca)
    if previous_ca is None:
        have = _safe_certificates(current)
        if all(_der(c) in {_der(h) for h in have} for c in wanted):
            return None
        return _pem(wanted)
    bundle = list(wanted)
    for cert in _safe_certificates(previous_ca):
        if _der(cert) not in {_der(c) for c in bundle}:
            bundle.append(cert)
    if current is not None and [_der(c) for c in _safe_certificates(current)] == [_der(c) for c in bundle]:
        return None
    return _pem(bundle)


def parse_secret_ref(ref: str) -> tuple[str, str]:
    """``"namespace/name"`` -> (namespace, name); GpugateError on anything else."""
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise GpugateError(f"--secret expects NAMESPACE/NAME, got {ref!r}")
    return namespace, name


# --- the edge -----------------------------------------------------------------------------------

def install(api: client.ApiClient, *, secret_namespace: str, secret_name: str, service: str, namespace: str,
            webhooks: Sequence[str], now: datetime, days: int = 365,
            renew_within_days: float = 30) -> InstallResult:
    """Make the TLS Secret current and the named webhook configurations trust its CA.

    Raises ClusterAPIError (from the client's ApiException) on API failures and GpugateError
    when a named webhook configuration exists neither as Mutating nor as Validating.
    """
    if renew_within_days >= days:
        raise GpugateError(f"--renew-within ({renew_within_days:g} days) must be shorter than --days ({days}); "
                           "otherwise every run would renew a certificate it just made")
    core = client.CoreV1Api(api)
    ref = f"{secret_namespace}/{secret_name}"
    existing = _read(lambda: core.read_namespaced_secret(secret_name, secret_namespace, _preload_content=False),
                     f"Secret {ref}")
    data = _decode_secret(existing) if existing is not None else None
    reason = renewal_reason(data, service=service, namespace=namespace, now=now, within_days=renew_within_days)
    bundle: pki.CertBundle | None = None
    previous_ca: bytes | None = None
    if reason is None:
        assert data is not None
        action, ca, expiry = "unchanged", data["ca.crt"], pki.not_after(data["tls.crt"])
    else:
        bundle = pki.create_bundle(service=service, namespace=namespace, now=now, days=days,
                                     extra_dns=(f"{service}.{namespace}.svc.cluster.local",), ips=())
        body = _secret_body(secret_namespace, secret_name, bundle, existing)
        if existing is None:
            _call(lambda: core.create_namespaced_secret(secret_namespace, kubeclient.body(body)),
                  f"create Secret {ref}")
            action = "created"
        else:
            _call(lambda: core.replace_namespaced_secret(secret_name, secret_namespace, kubeclient.body(body)),
                  f"replace Secret {ref}")
            action = "renewed"
            if data is not None and data.get("ca.crt"):
                previous_ca = data["ca.crt"] if _safe_certificates(data["ca.crt"]) else None
        ca, expiry = bundle.ca_cert, pki.not_after(bundle.cert)
    changes = tuple(
        change for name in webhooks
        for change in _patch_configurations(api, name, ca=ca, previous_ca=previous_ca)
    )
    return InstallResult(secret=ref, action=action, reason=reason or "", not_after=expiry,
                         webhooks=changes, bundle=bundle)


def _patch_configurations(api: client.ApiClient, name: str, *, ca: bytes,
                          previous_ca: bytes | None) -> list[WebhookChange]:
    admission = client.AdmissionregistrationV1Api(api)
    kinds = (
        ("MutatingWebhookConfiguration", admission.read_mutating_webhook_configuration,
         admission.patch_mutating_webhook_configuration),
        ("ValidatingWebhookConfiguration", admission.read_validating_webhook_configuration,
         admission.patch_validating_webhook_configuration),
    )
    changes: list[WebhookChange] = []
    for kind, read, patch in kinds:
        obj = _read(lambda read=read: read(name, _preload_content=False), f"{kind} {name}")
        if obj is None:
            continue
        hooks = obj.get("webhooks") or []
        ops: list[dict[str, Any]] = []
        for index, hook in enumerate(hooks):
            current_b64 = (hook.get("clientConfig") or {}).get("caBundle")
            current = base64.b64decode(current_b64) if current_b64 else None
            wanted = desired_ca_bundle(current, ca=ca, previous_ca=previous_ca)
            if wanted is None:
                continue
            # The test op pins the index to the webhook we read: if someone reordered the list in
            # between, the API server refuses the whole patch instead of writing the wrong one.
            ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": hook.get("name")})
            if "clientConfig" not in hook:
                ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig", "value": {}})
            ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle",
                        "value": base64.b64encode(wanted).decode()})
        if ops:
            _call(lambda patch=patch, ops=ops: patch(name, ops), f"patch {kind} {name}")
        changes.append(WebhookChange(kind=kind, name=name,
                                     patched=sum(1 for op in ops if op["path"].endswith("/caBundle")),
                                     total=len(hooks)))
    if not changes:
        raise GpugateError(
            f"no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named {name!r}; "
            "apply manifests/webhook first (the Job retries), or fix --patch-webhooks"
        )
    return changes


def _secret_body(namespace: str, name: str, bundle: pki.CertBundle, existing: KubeObject | None) -> KubeObject:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/name": "gpugate-webhook",
            "app.kubernetes.io/part-of": "gpugate",
            "app.kubernetes.io/component": "tls",
            "app.kubernetes.io/version": __version__,
            "app.kubernetes.io/managed-by": MANAGED_BY,
        },
    }
    if existing is not None:
        # Replace, not patch: the resourceVersion makes a concurrent writer a 409, not a mix.
        old = existing.get("metadata") or {}
        metadata["resourceVersion"] = old.get("resourceVersion")
        metadata["labels"] = {**(old.get("labels") or {}), **metadata["labels"]}
        if old.get("annotations"):
            metadata["annotations"] = old["annotations"]
    values = {"tls.crt": bundle.cert, "tls.key": bundle.key, "ca.crt": bundle.ca_cert}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": TLS_SECRET_TYPE,
        "data": {key: base64.b64encode(value).decode() for key, value in values.items()},
    }


def _decode_secret(secret: KubeObject) -> dict[str, bytes]:
    decoded: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            decoded[key] = base64.b64decode(value)
        except (ValueError, TypeError):
            decoded[key] = b""
    return decoded


def _read(call: Any, what: str) -> KubeObject | None:
    """GET through the real client, returning the raw JSON object, or None on 404."""
    try:
        response = call()
    except ApiException as err:
        if err.status == 404:
            return None
        raise ClusterAPIError(f"cannot read {what}: {_api_message(err)}") from err
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise ClusterAPIError(_unreachable(f"read {what}", err)) from err
    return json.loads(response.data)


def _call(call: Any, what: str) -> Any:
    try:
        return call()
    except ApiException as err:
        hint = ""
        if err.status == 409:
            hint = " (changed by someone else meanwhile; run again)"
        elif err.status == 403:
            hint = " (the ServiceAccount lacks the RBAC in manifests/webhook/components/builtin-tls)"
        raise ClusterAPIError(f"cannot {what}: {_api_message(err)}{hint}") from err
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise ClusterAPIError(_unreachable(what, err)) from err


def _unreachable(what: str, err: Exception) -> str:
    cause = getattr(err, "reason", None) or err
    return (f"cannot {what}: the API server does not answer ({cause}); check --server or KUBECONFIG "
            f"and that the cluster is up")


def _api_message(err: ApiException) -> str:
    try:
        message = json.loads(err.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {err.status} {message or err.reason}"


def _ca_certificates(pem: bytes) -> list[x509.Certificate]:
    found = x509.load_pem_x509_certificates(pem)
    if not found:
        raise ValueError("no certificate in ca.crt")
    return found


def _safe_certificates(pem: bytes | None) -> list[x509.Certificate]:
    if not pem:
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _pem(certificates: list[x509.Certificate]) -> bytes:
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in certificates)
