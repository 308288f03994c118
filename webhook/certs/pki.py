"""A private CA and a serving certificate for the webhook Service, made with ``cryptography``.

The kube-apiserver calls the webhook at ``https://<service>.<namespace>.svc`` and verifies it with
the ``caBundle`` of the webhook configuration, so the serving certificate carries that name (and the
short forms) as SANs, plus ``localhost``/``127.0.0.1`` for local runs. Keys are ECDSA P-256: they
are generated in milliseconds and make TLS handshakes cheaper than RSA, and the apiserver accepts them.

``now`` is an argument (never read from the clock here) so tests and renewals are reproducible.
Files are written one by one with an atomic replace: a reader (the server's certificate watcher)
sees either the old or the new file, never half of one; a mismatched cert/key pair seen between two
replaces is refused by the reader and retried.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes, PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.errors import GpugateError

CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
BUNDLE_FILES: tuple[str, ...] = (CA_CERT_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE)

# Certificates start slightly in the past so a node whose clock lags a little still accepts them.
_BACKDATE = timedelta(minutes=5)


class CertError(GpugateError):
    """A certificate or key file is unreadable, not PEM, or does not match its partner."""


@dataclass(frozen=True)
class CertBundle:
    """PEM bytes of a CA and of a serving certificate it signed; what a TLS Secret holds."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes


def service_dns_names(service: str, namespace: str) -> tuple[str, ...]:
    """The names the apiserver may use to reach a Service: short, namespaced and ``.svc``."""
    return (service, f"{service}.{namespace}", f"{service}.{namespace}.svc")


def create_bundle(
    *,
    service: str,
    namespace: str,
    now: datetime,
    days: int = 365,
    extra_dns: Sequence[str] = ("localhost",),
    ips: Sequence[str] = ("127.0.0.1",),
    ca_cert: bytes | None = None,
    ca_key: bytes | None = None,
) -> CertBundle:
    """Create a serving certificate for ``service.namespace`` valid ``days`` from ``now``.

    A new CA is made unless ``ca_cert``/``ca_key`` are given: renewing under the same CA lets
    clients that already trust it (the webhook configurations' caBundle) keep working.
    """
    if days < 1:
        raise CertError(f"certificate lifetime must be at least 1 day, got {days}")
    if not service or not namespace:
        raise CertError("a serving certificate needs a service name and a namespace")
    now = _aware(now)
    if (ca_cert is None) != (ca_key is None):
        raise CertError("give both ca_cert and ca_key to reuse a CA, or neither to create one")
    if ca_cert is not None and ca_key is not None:
        ca = _load_cert(ca_cert, "CA certificate")
        ca_private = _load_issuer_key(ca_key, "CA key")
        _check_pair(ca, ca_private, "CA certificate", "CA key")
        ca_cert_pem, ca_key_pem = ca_cert, ca_key
    else:
        ca_private = ec.generate_private_key(ec.SECP256R1())
        ca = _make_ca(ca_private, service=service, namespace=namespace, now=now, days=days)
        ca_cert_pem = ca.public_bytes(serialization.Encoding.PEM)
        ca_key_pem = _key_pem(ca_private)

    key = ec.generate_private_key(ec.SECP256R1())
    dns = list(dict.fromkeys([*service_dns_names(service, namespace), *extra_dns]))
    try:
        addresses = [ipaddress.ip_address(ip) for ip in ips]
    except ValueError as err:
        raise CertError(f"not an IP address for the certificate: {err}") from err
    cert = _sign_serving(key, ca, ca_private, dns=dns, addresses=addresses, now=now, days=days)
    return CertBundle(
        ca_cert=ca_cert_pem,
        ca_key=ca_key_pem,
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=_key_pem(key),
    )


def _sign_serving(key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, ca_private: CertificateIssuerPrivateKeyTypes,
                  *, dns: list[str], addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address], now: datetime,
                  days: int) -> x509.Certificate:
    """The serving certificate itself: a leaf for TLS servers, named by ``dns`` and ``addresses``,
    never outliving its CA."""
    not_before = now - _BACKDATE
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[2])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(min(now + timedelta(days=days), ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(name) for name in dns] + [x509.IPAddress(ip) for ip in addresses]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_private, hashes.SHA256())
    )


def not_after(cert_pem: bytes) -> datetime:
    """The moment the (first) certificate in ``cert_pem`` expires, timezone-aware UTC."""
    return _load_cert(cert_pem, "certificate").not_valid_after_utc


def needs_renewal(cert_pem: bytes, *, within_days: float, now: datetime) -> bool:
    """True when the certificate expires less than ``within_days`` after ``now`` (or already has)."""
    return not_after(cert_pem) - _aware(now) < timedelta(days=within_days)


def write_bundle(bundle: CertBundle, directory: Path) -> None:
    """Write ca.crt, ca.key, tls.crt, tls.key into ``directory``, each by atomic replace.

    Keys are created mode 0600. The directory is created if missing.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    contents = {
        CA_CERT_FILE: (bundle.ca_cert, 0o644),
        CA_KEY_FILE: (bundle.ca_key, 0o600),
        # Key before certificate: a watcher that sees the new cert finds its key already there.
        KEY_FILE: (bundle.key, 0o600),
        CERT_FILE: (bundle.cert, 0o644),
    }
    for name, (data, mode) in contents.items():
        _atomic_write(directory / name, data, mode)


def read_bundle(directory: Path) -> CertBundle | None:
    """The bundle in ``directory``, or None when any of its four files is absent.

    Raises CertError naming the file when a file is present but not valid PEM, or when the
    serving key does not belong to the serving certificate.
    """
    directory = Path(directory)
    paths = {name: directory / name for name in BUNDLE_FILES}
    if not all(path.is_file() for path in paths.values()):
        return None
    data = {}
    for name, path in paths.items():
        try:
            data[name] = path.read_bytes()
        except OSError as err:
            raise CertError(f"cannot read {path}: {err.strerror}") from err
    ca = _load_cert(data[CA_CERT_FILE], str(paths[CA_CERT_FILE]))
    _check_pair(ca, _load_key(data[CA_KEY_FILE], str(paths[CA_KEY_FILE])),
                str(paths[CA_CERT_FILE]), str(paths[CA_KEY_FILE]))
    cert = _load_cert(data[CERT_FILE], str(paths[CERT_FILE]))
    _check_pair(cert, _load_key(data[KEY_FILE], str(paths[KEY_FILE])),
                str(paths[CERT_FILE]), str(paths[KEY_FILE]))
    return CertBundle(ca_cert=data[CA_CERT_FILE], ca_key=data[CA_KEY_FILE],
                      cert=data[CERT_FILE], key=data[KEY_FILE])


def check_pair(cert_pem: bytes, key_pem: bytes, *, cert_name: str = "certificate",
               key_name: str = "key") -> None:
    """Raise CertError unless ``key_pem`` is the private key of ``cert_pem``'s public key."""
    _check_pair(_load_cert(cert_pem, cert_name), _load_key(key_pem, key_name), cert_name, key_name)


# --- helpers -----------------------------------------------------------------------------------

def _make_ca(key: ec.EllipticCurvePrivateKey, *, service: str, namespace: str, now: datetime,
             days: int) -> x509.Certificate:
    return self_signed_ca(key, f"gpugate CA for {service}.{namespace}", not_before=now - _BACKDATE,
                          not_after=now + timedelta(days=days), path_length=0)


def self_signed_ca(key: ec.EllipticCurvePrivateKey, common_name: str, *, not_before: datetime, not_after: datetime,
                   path_length: int | None) -> x509.Certificate:
    """A self-signed CA certificate for ``key``: CA basic constraints, ``key_usage(ca=True)`` and a
    subject key identifier, signed with SHA-256.

    Why public: the webhook's serving CA (here) and the local control plane's CA
    (:mod:`webhook.localcluster.pki`) are made the same way; only the name, the validity and how
    deep a chain may go differ.
    """
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def key_usage(*, ca: bool) -> x509.KeyUsage:
    """Digital signature for every certificate; certificate and CRL signing only for a CA."""
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False)


def _aware(now: datetime) -> datetime:
    """Naive datetimes are taken as UTC (what ``datetime.utcnow()`` callers mean)."""
    return now if now.tzinfo is not None else now.replace(tzinfo=UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load_cert(pem: bytes, what: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as err:
        raise CertError(f"{what} is not a PEM certificate ({err})") from err


def _load_issuer_key(pem: bytes, what: str) -> CertificateIssuerPrivateKeyTypes:
    key = _load_key(pem, what)
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey)):
        raise CertError(f"{what} is a {type(key).__name__}, which cannot sign certificates; use an EC or RSA key")
    return key


def _load_key(pem: bytes, what: str) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as err:
        raise CertError(f"{what} is not an unencrypted PEM private key ({err})") from err


def _check_pair(cert: x509.Certificate, key: PrivateKeyTypes, cert_name: str, key_name: str) -> None:
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if (cert.public_key().public_bytes(serialization.Encoding.DER, public)
            != key.public_key().public_bytes(serialization.Encoding.DER, public)):
        raise CertError(f"{key_name} is not the private key of {cert_name}; write them as a pair")


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
