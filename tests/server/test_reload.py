"""Policy hot reload and certificate replacement on a real server while reviews keep flowing.

The policy folder has the layout of a ConfigMap volume: ``training.yaml -> ..data/training.yaml``,
``..data -> ..<timestamp>``, and an update is one atomic rename of ``..data``, as the kubelet does.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.server.harness import (
    SERVICE_HOST,
    ConfigMapVolume,
    Server,
    example_pod,
    https_session,
    repo_policies,
    review_of,
)
from webhook.certs import pki


class Traffic:
    """Threads sending reviews until stopped; every answer and every failure is kept."""

    def __init__(self, send: Callable[[], Any], threads: int = 2) -> None:
        self._send = send
        self._stop = threading.Event()
        self.results: list[Any] = []
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.results.append(self._send())
            except Exception as err:  # every failure is a test failure: keep it to report
                self.failures.append(f"{type(err).__name__}: {err}")
            time.sleep(0.005)

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)


def wait_for(condition: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def volume(module_tmp: Path) -> ConfigMapVolume:
    vol = ConfigMapVolume(module_tmp / "policies")
    vol.publish(repo_policies())
    return vol


@pytest.fixture(scope="module")
def tls_dir(module_tmp: Path) -> Path:
    bundle = pki.create_bundle(service="gpugate-webhook", namespace="gpugate-system",
                                 now=datetime.now(UTC))
    pki.write_bundle(bundle, module_tmp / "tls")
    return module_tmp / "tls"


@pytest.fixture(scope="module")
def server(module_tmp: Path, volume: ConfigMapVolume, tls_dir: Path) -> Iterator[Server]:
    srv = Server(module_tmp, policies=volume.root,
                 extra=["--cert", str(tls_dir / "tls.crt"), "--key", str(tls_dir / "tls.key")])
    srv.start(ca=tls_dir / "ca.crt")
    try:
        yield srv
    finally:
        srv.stop()


def _mutate_once(server: Server, session: requests.Session) -> dict[str, Any]:
    http = session.post(f"{server.url}/mutate", json=review_of(example_pod()), timeout=10)
    if http.status_code != 200:
        raise AssertionError(f"HTTP {http.status_code}: {http.text}")
    response = http.json()["response"]
    if "auditAnnotations" not in response:  # an internal error answer: say which
        errors = [line for line in server.log_lines() if line.get("level") == "error"]
        raise AssertionError(f"no audit annotations in {response}; the server's last error lines: {errors[-3:]}")
    return response


def _revision(server: Server) -> str:
    return _mutate_once(server, server.session)["auditAnnotations"]["revision"]


def _fresh_revisions(server: Server, n: int = 8) -> set[str]:
    """Revisions answered on n new connections (so both workers are asked)."""
    seen = set()
    for _ in range(n):
        with https_session(server.ca) as session:
            seen.add(_mutate_once(server, session)["auditAnnotations"]["revision"])
    return seen


def test_policy_changes_apply_while_requests_flow_and_bad_ones_are_refused(server, volume):
    first = _revision(server)
    files = repo_policies()
    sessions = threading.local()

    def send() -> dict[str, Any]:
        if not hasattr(sessions, "s"):
            sessions.s = https_session(server.ca)
        return _mutate_once(server, sessions.s)

    with Traffic(send) as traffic:
        # 1. A valid change through the ConfigMap swap: training allows at most 2 GPUs.
        files["training.yaml"] = files["training.yaml"].replace("max: 8", "max: 2")
        assert "max: 2" in files["training.yaml"]
        volume.publish(files)
        wait_for(lambda: _fresh_revisions(server) - {first} == _fresh_revisions(server) and
                 len(_fresh_revisions(server)) == 1, what="every worker to serve the new revision")
        second = _revision(server)
        assert second != first
        workers = {line["pid"] for line in server.log_lines() if line.get("event") == "admission"}
        wait_for(lambda: {line["pid"] for line in server.log_lines()
                          if line.get("event") == "policy set loaded" and line.get("revision") == second} >= workers,
                 what="every worker to log loading the new set")
        # The example pod's gpus label asks 4: the new set refuses it already at mutation.
        answer = _mutate_once(server, server.session)
        assert answer["allowed"] is False and "allows 2" in answer["status"]["message"]

        # 2. An invalid change is refused: the last good set keeps answering.
        errors_before = server.metrics().get("gpugate_policy_reload_errors_total", 0)
        broken = dict(files, **{"training.yaml": files["training.yaml"].replace("max: 2", "max: two")})
        volume.publish(broken)
        wait_for(lambda: server.metrics().get("gpugate_policy_reload_errors_total", 0) >= errors_before + 2,
                 what="both workers to refuse the broken set")
        assert _fresh_revisions(server) == {second}
        refused = [line for line in server.log_lines() if line.get("event") == "policy reload refused"]
        assert refused and "spec.gpu.max" in refused[-1]["error"] and refused[-1]["serving"] == second
        assert server.session.get(f"{server.url}/readyz", timeout=5).json()["revision"] == second

        # 3. A new file added by a later ConfigMap version is picked up too.
        fixed = dict(files, **{"extra.yaml": files["training.yaml"].replace("name: training", "name: extra")
                               .replace("priority: 100", "priority: 5").replace('"ml-*", "research-*"', '"extra-*"')})
        volume.publish(fixed)
        wait_for(lambda: _fresh_revisions(server) - {first, second} == _fresh_revisions(server),
                 what="the third revision")
        time.sleep(0.3)
    assert not traffic.failures, traffic.failures[:5]
    answered = {r["auditAnnotations"]["revision"] for r in traffic.results}
    third = _revision(server)
    assert len(traffic.results) > 20
    assert answered <= {first, second, third} and {second, third} <= answered
    # Every answer is what its revision says: the first patches the example's 4 GPUs; the later
    # ones (training capped at 2) refuse them already at mutation.
    for r in traffic.results:
        if r["auditAnnotations"]["revision"] == first:
            assert r["allowed"] is True and r["patchType"] == "JSONPatch"
        else:
            assert r["allowed"] is False and "allows 2" in r["status"]["message"]
    metrics = server.metrics()
    assert metrics[f'gpugate_policy_revision_info{{revision="{third}"}}'] == 1
    assert metrics[f'gpugate_policy_revision_info{{revision="{first}"}}'] == 0


def _served_certificate(server: Server) -> bytes:
    context = ssl.create_default_context(cafile=str(server.ca))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=SERVICE_HOST) as tls:
            return tls.getpeercert(binary_form=True)


def _der(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode())


def test_certificate_replacement_drops_no_request(server, tls_dir):
    old = pki.read_bundle(tls_dir)
    assert old is not None and _served_certificate(server) == _der(old.cert)
    local = threading.local()

    def keep_alive() -> dict[str, Any]:
        if not hasattr(local, "s"):
            local.s = https_session(server.ca)
        return _mutate_once(server, local.s)

    def new_connection() -> dict[str, Any]:
        with https_session(server.ca) as session:
            return _mutate_once(server, session)

    with Traffic(keep_alive, threads=2) as reused, Traffic(new_connection, threads=2) as fresh:
        time.sleep(0.3)
        # A broken pair first: refused, the old certificate keeps serving.
        (tls_dir / "tls.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n")
        wait_for(lambda: any(line.get("event") == "new certificate refused; keeping the current one"
                             for line in server.log_lines()), what="the broken certificate to be refused")
        assert _served_certificate(server) == _der(old.cert)
        # Then a proper renewal under the same CA, written file by file as a Secret update would be.
        new = pki.create_bundle(service="gpugate-webhook", namespace="gpugate-system",
                                  now=datetime.now(UTC), ca_cert=old.ca_cert, ca_key=old.ca_key)
        pki.write_bundle(new, tls_dir)
        wait_for(lambda: all(_served_certificate(server) == _der(new.cert) for _ in range(6)),
                 what="new connections to get the new certificate in every worker")
        time.sleep(0.3)
    assert not reused.failures and not fresh.failures, (reused.failures + fresh.failures)[:5]
    assert len(reused.results) > 10 and len(fresh.results) > 10
    assert any(line.get("event") == "certificate reloaded" for line in server.log_lines())
