"""The CA and serving certificate work for a real TLS handshake under the Service's names."""

from __future__ import annotations

import socket
import ssl
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from webhook.certs import pki

# Real time: the handshake tests verify validity dates too (pki.py itself never reads the clock).
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(scope="module")
def bundle() -> pki.CertBundle:
    return pki.create_bundle(service="gpugate-webhook", namespace="gpugate-system", now=NOW, days=30)


def _handshake(bundle: pki.CertBundle, tmp_path: Path, server_hostname: str) -> str:
    """Serve one TLS handshake with the bundle's cert; the client verifies with its CA."""
    pki.write_bundle(bundle, tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")
        except ssl.SSLError:
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    try:
        with socket.create_connection(("127.0.0.1", port)) as raw:
            with client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
                return tls.recv(2).decode()
    finally:
        thread.join(5)
        listener.close()


@pytest.mark.parametrize("name", [
    "gpugate-webhook.gpugate-system.svc",
    "gpugate-webhook.gpugate-system",
    "gpugate-webhook",
    "localhost",
    "127.0.0.1",
])
def test_the_serving_cert_verifies_under_every_service_name(bundle, tmp_path, name):
    assert _handshake(bundle, tmp_path, name) == "ok"


def test_a_name_not_in_the_sans_is_refused(bundle, tmp_path):
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(bundle, tmp_path, "other.gpugate-system.svc")


def test_sans_usage_and_lifetime(bundle):
    cert = x509.load_pem_x509_certificate(bundle.cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {
        "gpugate-webhook", "gpugate-webhook.gpugate-system", "gpugate-webhook.gpugate-system.svc", "localhost"}
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    ca = x509.load_pem_x509_certificate(bundle.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    cert.verify_directly_issued_by(ca)
    assert pki.not_after(bundle.cert) == NOW + timedelta(days=30)
    assert pki.not_after(bundle.ca_cert) == NOW + timedelta(days=30)
    assert cert.not_valid_before_utc <= NOW


def test_extra_names_and_ips_are_added():
    b = pki.create_bundle(service="s", namespace="n", now=NOW, extra_dns=("hook.example",),
                            ips=("10.0.0.7", "::1"))
    sans = x509.load_pem_x509_certificate(b.cert).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert "hook.example" in sans.get_values_for_type(x509.DNSName)
    assert "localhost" not in sans.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"10.0.0.7", "::1"}


@pytest.mark.parametrize(("days_left", "within", "expected"), [
    (30, 10, False),   # far from expiry
    (30, 31, True),    # expiry inside the window
    (-1, 0, True),     # already expired
])
def test_needs_renewal_only_inside_the_window(bundle, days_left, within, expected):
    now = pki.not_after(bundle.cert) - timedelta(days=days_left)
    assert pki.needs_renewal(bundle.cert, within_days=within, now=now) is expected


def test_renewing_under_the_same_ca_keeps_clients_trusting_it(bundle, tmp_path):
    renewed = pki.create_bundle(service="gpugate-webhook", namespace="gpugate-system",
                                  now=NOW + timedelta(minutes=1), ca_cert=bundle.ca_cert, ca_key=bundle.ca_key)
    assert renewed.ca_cert == bundle.ca_cert and renewed.cert != bundle.cert
    # Never outlives the CA that signed it.
    assert pki.not_after(renewed.cert) == pki.not_after(bundle.ca_cert) < NOW + timedelta(days=366)
    assert _handshake(renewed, tmp_path, "gpugate-webhook.gpugate-system.svc") == "ok"


def test_write_then_read_round_trips_with_private_keys_0600(bundle, tmp_path):
    target = tmp_path / "state" / "tls"
    pki.write_bundle(bundle, target)
    assert pki.read_bundle(target) == bundle
    assert (target / "tls.key").stat().st_mode & 0o777 == 0o600
    assert (target / "ca.key").stat().st_mode & 0o777 == 0o600
    assert not [p for p in target.iterdir() if p.name.startswith(".")]  # no temp files left


def test_read_bundle_is_none_when_a_file_is_missing(bundle, tmp_path):
    assert pki.read_bundle(tmp_path / "absent") is None
    pki.write_bundle(bundle, tmp_path)
    (tmp_path / "ca.key").unlink()
    assert pki.read_bundle(tmp_path) is None


def test_read_bundle_names_the_damaged_file(bundle, tmp_path):
    pki.write_bundle(bundle, tmp_path)
    (tmp_path / "tls.crt").write_bytes(b"not a certificate")
    with pytest.raises(pki.CertError, match="tls.crt is not a PEM certificate"):
        pki.read_bundle(tmp_path)


def test_read_bundle_refuses_a_key_of_another_cert(bundle, tmp_path):
    other = pki.create_bundle(service="gpugate-webhook", namespace="gpugate-system", now=NOW)
    pki.write_bundle(bundle, tmp_path)
    (tmp_path / "tls.key").write_bytes(other.key)
    with pytest.raises(pki.CertError, match="tls.key is not the private key of .*tls.crt"):
        pki.read_bundle(tmp_path)


def test_bad_arguments_are_refused_with_a_message():
    with pytest.raises(pki.CertError, match="at least 1 day"):
        pki.create_bundle(service="s", namespace="n", now=NOW, days=0)
    with pytest.raises(pki.CertError, match="not an IP address"):
        pki.create_bundle(service="s", namespace="n", now=NOW, ips=("nope",))
    with pytest.raises(pki.CertError, match="both ca_cert and ca_key"):
        pki.create_bundle(service="s", namespace="n", now=NOW, ca_cert=b"x")
