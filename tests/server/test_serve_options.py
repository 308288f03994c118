"""``gpugate serve`` refuses bad options before starting anything."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from webhook import certs
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
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    one = certs.create_bundle(service="s", namespace="n", now=now)
    two = certs.create_bundle(service="s", namespace="n", now=now)
    (tmp_path / "tls.crt").write_bytes(one.cert)
    (tmp_path / "tls.key").write_bytes(two.key)
    result = _serve("--cert", str(tmp_path / "tls.crt"), "--key", str(tmp_path / "tls.key"), cwd=tmp_path)
    assert result.exit_code == 1 and "is not the private key of" in result.output
