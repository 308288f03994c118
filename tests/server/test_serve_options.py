"""``gpugate serve`` refuses bad options before starting anything."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

from click.testing import CliRunner

from webhook.certs import pki
from webhook.cli import main


def _serve(*args: str, cwd: Path):
    """Run in ``cwd`` (where a policies/ folder exists) without changing this process's directory."""
    (cwd / "policies").mkdir(exist_ok=True)
    fixed = [str(cwd / a) if a in ("tls.crt", "nowhere") else a for a in args]
    result = CliRunner().invoke(main, ["serve", "--policies", str(cwd / "policies"), *fixed])
    return result


def test_cert_without_key_is_a_usage_error(tmp_path):
    result = _serve("--cert", "tls.crt", cwd=tmp_path)
    assert result.exit_code == 2 and "both --cert and --key" in result.output


def test_a_missing_policy_folder_is_named(tmp_path):
    result = _serve("--policies", "nowhere", cwd=tmp_path)
    assert result.exit_code == 1 and f"policy folder {tmp_path / 'nowhere'} does not exist" in result.output


def test_a_bad_bind_address_is_a_usage_error(tmp_path):
    result = _serve("--bind", "8443", cwd=tmp_path)
    assert result.exit_code == 2 and "HOST:PORT" in result.output


def test_a_key_of_another_certificate_is_refused(tmp_path):
    from datetime import datetime

    now = datetime.now(UTC)
    one = pki.create_bundle(service="s", namespace="n", now=now)
    two = pki.create_bundle(service="s", namespace="n", now=now)
    (tmp_path / "tls.crt").write_bytes(one.cert)
    (tmp_path / "tls.key").write_bytes(two.key)
    result = _serve("--cert", str(tmp_path / "tls.crt"), "--key", str(tmp_path / "tls.key"), cwd=tmp_path)
    assert result.exit_code == 1 and "is not the private key of" in result.output


def test_the_state_dir_pair_is_reused_renewed_or_remade(tmp_path):
    from datetime import datetime, timedelta

    from webhook.commands.serve import serving_bundle

    now = datetime.now(UTC)
    state = tmp_path / "state"
    cert, key, ca = serving_bundle(state, service="gpugate-webhook", namespace="gpugate-system", now=now)
    first = pki.read_bundle(state)
    assert (cert, key, ca) == (state / "tls.crt", state / "tls.key", state / "ca.crt")
    serving_bundle(state, service="gpugate-webhook", namespace="gpugate-system", now=now + timedelta(days=1))
    assert pki.read_bundle(state) == first                      # reused
    serving_bundle(state, service="other", namespace="gpugate-system", now=now)
    renamed = pki.read_bundle(state)
    assert renamed.cert != first.cert and renamed.ca_cert == first.ca_cert   # new SANs, same CA
    (state / "tls.key").write_bytes(b"garbage")
    serving_bundle(state, service="other", namespace="gpugate-system", now=now)
    assert pki.read_bundle(state).ca_cert != first.ca_cert      # unusable files are remade
