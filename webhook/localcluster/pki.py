"""Certificates and keys for a throw-away control plane, made with ``cryptography``.

Why here and not ``webhook.certs``: the harness must not depend on the package under test (whose
layout is changing), and a test cluster needs things a webhook never does: a client certificate
whose Organization is a Kubernetes group, and a service-account signing key pair.

Everything is written to one folder as PEM files, the form every component's flags take.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.certs import pki as servingpki

VALIDITY = datetime.timedelta(days=7)
"""Long enough for any test session or a day of poking at ``cluster up``, short enough to be harmless."""

CLOCK_SKEW = datetime.timedelta(minutes=5)
"""Certificates start a little in the past so a component reading them at once never sees "not yet valid"."""


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, as PEM files on disk (what the component flags want)."""

    cert: Path
    key: Path

    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    def key_pem(self) -> bytes:
        return self.key.read_bytes()


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """A self-signed CA that can issue serving and client certificates.

    Kept public on the control plane so a test can sign, say, a webhook's serving certificate
    that the API server trusts through a ``caBundle`` of this CA.
    """

    files: KeyPair

    @classmethod
    def create(cls, folder: Path, *, name: str = "gpugate-e2e-ca") -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = servingpki.self_signed_ca(key, name, not_before=now - CLOCK_SKEW, not_after=now + VALIDITY,
                                         path_length=None)
        return cls(_write_pair(folder, name, cert, key))

    def issue(
        self,
        folder: Path,
        name: str,
        *,
        common_name: str,
        organizations: tuple[str, ...] = (),
        dns_names: tuple[str, ...] = (),
        ip_addresses: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> KeyPair:
        """Sign a leaf certificate; ``organizations`` become Kubernetes groups for a client cert."""
        ca_cert = x509.load_pem_x509_certificate(self.files.cert_pem())
        ca_key = serialization.load_pem_private_key(self.files.key_pem(), password=None)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(servingpki.key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
                           critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        return _write_pair(folder, name, cert, key)


@dataclass(frozen=True, slots=True)
class ServiceAccountKeys:
    """The key pair the API server signs service-account tokens with (and verifies them by).

    RSA, as kubeadm makes it: every consumer of these tokens accepts RS256.
    """

    private_key: Path
    public_key: Path

    @classmethod
    def create(cls, folder: Path) -> ServiceAccountKeys:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private = folder / "sa.key"
        public = folder / "sa.pub"
        private.write_bytes(_private_pem(key))
        private.chmod(0o600)
        public.write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        return cls(private_key=private, public_key=public)


def write_kubeconfig(path: Path, *, server: str, ca: CertificateAuthority, user: KeyPair,
                     name: str = "gpugate-e2e") -> Path:
    """An admin kubeconfig with everything inline, so it can be copied anywhere and still work."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server,
            "certificate-authority-data": _b64(ca.files.cert_pem()),
        }}],
        "users": [{"name": f"{name}-admin", "user": {
            "client-certificate-data": _b64(user.cert_pem()),
            "client-key-data": _b64(user.key_pem()),
        }}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin"}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _private_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write_pair(folder: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> KeyPair:
    pair = KeyPair(cert=folder / f"{name}.crt", key=folder / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(_private_pem(key))
    pair.key.chmod(0o600)
    return pair


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
