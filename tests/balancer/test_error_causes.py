"""``gpugate balance``'s errors say their cause first, whole, and it stops when no retry can help.

Before: log lines were cut at 300 characters, so a missing Lease namespace looped forever on
``(404) Reason: Not Found HTTP response headers...`` and a closed ``--server`` port never showed
"connection refused".
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.balancer.test_command import FAST
from tests.kubefake import FakeKube

REPO = Path(__file__).resolve().parents[2]


def balance(server: str, tmp_path: Path, *args: str, stderr: Any = subprocess.PIPE) -> subprocess.Popen:
    config = tmp_path / "balancer.yaml"
    config.write_text(FAST)
    return subprocess.Popen([sys.executable, "-m", "webhook.cli", "balance", "--server", server, "--config",
                             str(config), "--health-bind", "127.0.0.1:0", "--identity", "a", *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_missing_lease_namespace_is_named_and_stops_the_balancer(tmp_path: Path) -> None:
    with FakeKube(require_namespaces=True) as fk:
        proc = balance(fk.url, tmp_path, "--lease-namespace", "gpu-ops")
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the Lease namespace gpu-ops does not exist"), last
    assert "kubectl create namespace gpu-ops" in last and "--lease-namespace" in last
    failed = [line for line in json_lines(err) if line["event"] == "lease update failed"]
    assert failed and failed[0]["error"].startswith("namespace gpu-ops does not exist"), failed
    assert "HTTP response headers" not in err


def test_the_lease_namespace_once_it_exists_is_used(tmp_path: Path) -> None:
    with FakeKube(require_namespaces=True) as fk:
        fk.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-ops"}})
        proc = balance(fk.url, tmp_path, "--lease-namespace", "gpu-ops")
        try:
            deadline = time.monotonic() + 20
            while fk.get("coordination.k8s.io/v1", "Lease", "gpugate-balancer", "gpu-ops") is None:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=5)
                time.sleep(0.1)
        finally:
            proc.terminate()
            proc.communicate(timeout=15)


def failures_in(text: str) -> list[dict]:
    return [line for line in json_lines(text) if line["event"] in ("API call failed, backing off",
                                                                    "lease update failed")]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_nothing_listening_at_server_says_connection_refused(tmp_path: Path) -> None:
    port = closed_port()
    log = tmp_path / "balance.log"
    with log.open("w") as sink:
        proc = balance(f"http://127.0.0.1:{port}", tmp_path, stderr=sink)
        try:
            deadline = time.monotonic() + 30
            while {line.get("resource", "lease") for line in failures_in(log.read_text())} < {"nodes", "pods", "lease"}:
                assert proc.poll() is None, log.read_text()  # the API server may come up: this is retried
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.communicate(timeout=15)
    failures = failures_in(log.read_text())
    for line in failures:
        assert line["error"].startswith(f"connection refused at 127.0.0.1:{port}: nothing listens there"), line


@pytest.mark.parametrize("body, expected", [
    ('{"kind":"Status","message":"namespaces \\"x\\" not found","reason":"NotFound",'
     '"details":{"name":"x","kind":"namespaces"},"code":404}',
     "namespace x does not exist (the API server answered 404 NotFound: namespaces \"x\" not found)"),
    ('{"kind":"Status","message":"leases.coordination.k8s.io is forbidden: User \\"u\\" cannot create",'
     '"reason":"Forbidden","code":403}',
     'the API server answered 403 Forbidden: leases.coordination.k8s.io is forbidden: User "u" cannot create'),
])
def test_an_api_refusal_reads_as_a_sentence_without_headers(body: str, expected: str) -> None:
    from kubernetes.client.exceptions import ApiException

    from webhook.kubeclient import failure

    err = ApiException(status=int(json.loads(body)["code"]), reason="Not Found")
    err.body = body
    err.headers = {"Audit-Id": "x" * 400}
    assert failure(err) == expected
