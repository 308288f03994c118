"""Worker restarts must not take the server down.

gunicorn replaces a worker that exits; these tests make workers exit the ways they do in a
cluster (graceful TERM, a crash, the master's HUP reload) and check that the server keeps
answering and that ``/metrics`` keeps counting across the restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.server.chaos import Chaos
from tests.server.harness import (
    REPO,
    ConfigMapVolume,
    Server,
    copy_policies,
    example_pod,
    free_port,
    https_session,
    repo_policies,
    review_of,
)
from webhook.certs import pki

pytestmark = pytest.mark.slow


def worker_pids(server: Server) -> set[int]:
    assert server.process is not None
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children")
    return {int(pid) for pid in children.read_text().split()}


def wait_for_workers(server: Server, *, count: int, without: set[int], timeout: float = 20) -> set[int]:
    """Wait until ``count`` workers run and none of ``without`` is among them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.process is not None and server.process.poll() is None, server.log_text()
        pids = worker_pids(server)
        if len(pids) == count and not pids & without:
            return pids
        time.sleep(0.1)
    raise AssertionError(f"workers did not settle (now {worker_pids(server)}, old {without}):\n{server.log_text()}")


def admitted(server: Server) -> float:
    return sum(value for key, value in server.metrics().items()
               if key.startswith("gpugate_admissions_total{") and 'endpoint="mutate"' in key)


def serve_some(server: Server, count: int = 6) -> None:
    for _ in range(count):
        response = server.post("mutate", review_of(example_pod()))
        assert response.status_code == 200
        assert response.json()["response"]["allowed"] is True


@pytest.fixture()
def live(tmp_path: Path):
    srv = Server(tmp_path, policies=copy_policies(tmp_path / "policies")).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGABRT], ids=["TERM", "KILL", "ABRT"])
def test_a_worker_that_exits_is_replaced_and_the_counts_survive(live: Server, sig: signal.Signals) -> None:
    serve_some(live)
    before = admitted(live)
    assert before >= 6
    workers = wait_for_workers(live, count=2, without=set())
    victim = sorted(workers)[0]
    os.kill(victim, sig)
    wait_for_workers(live, count=2, without={victim})
    serve_some(live)
    # The dead worker's counter samples stay in the sum (multiprocess mode keeps counter files).
    assert admitted(live) >= before + 6
    assert live.session.get(f"{live.url}/readyz", timeout=5).status_code == 200


def test_hup_reloads_every_worker_and_keeps_serving(live: Server) -> None:
    serve_some(live)
    before = admitted(live)
    old = wait_for_workers(live, count=2, without=set())
    assert live.process is not None
    live.process.send_signal(signal.SIGHUP)
    wait_for_workers(live, count=2, without=old)
    serve_some(live)
    assert admitted(live) >= before + 6


def test_max_requests_recycles_workers_without_failing_a_request(tmp_path: Path) -> None:
    srv = Server(tmp_path, policies=copy_policies(tmp_path / "policies"), extra=["--max-requests", "10"]).start()
    try:
        first = wait_for_workers(srv, count=2, without=set())
        for _ in range(60):
            response = srv.post("mutate", review_of(example_pod()))
            assert response.status_code == 200
        assert wait_for_workers(srv, count=2, without=first)
        assert any("Autorestarting worker" in str(line.get("event")) for line in srv.log_lines())
    finally:
        srv.stop()


def write_tls(directory: Path) -> None:
    pki.write_bundle(pki.create_bundle(service="gpugate-webhook", namespace="gpugate-system",
                                       now=datetime.now(UTC)), directory)


def test_a_worker_whose_boot_fails_is_replaced_and_the_master_keeps_serving(tmp_path: Path) -> None:
    """gunicorn halts the whole server on a failed boot; one worker's failure must cost only that worker."""
    tls = tmp_path / "tls"
    write_tls(tls)
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "one").touch()
    port = free_port()
    log = open(tmp_path / "server.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.server.bootfail_server", "--bind", f"127.0.0.1:{port}",
         "--cert", str(tls / pki.CERT_FILE), "--key", str(tls / pki.KEY_FILE), "--policies", str(REPO / "policies"),
         "--fail-tokens", str(tokens)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        session = https_session(tls / pki.CA_CERT_FILE)
        deadline = time.monotonic() + 20
        ready = 0
        while time.monotonic() < deadline and ready < 5:
            assert process.poll() is None, (tmp_path / "server.log").read_text()
            try:
                answer = session.get(f"https://127.0.0.1:{port}/readyz", timeout=2)
                ready = ready + 1 if answer.status_code == 200 else 0
            except Exception:
                ready = 0
            time.sleep(0.2)
        assert ready >= 5, (tmp_path / "server.log").read_text()
        assert not list(tokens.iterdir())  # the failure did happen
        text = (tmp_path / "server.log").read_text()
        assert "worker could not load the app" in text and "Worker failed to boot" not in text
        time.sleep(2.0)  # the replacement boots after the failed worker's pause
        assert len(Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()) == 2
        answer = session.post(f"https://127.0.0.1:{port}/mutate", json=review_of(example_pod()), timeout=5)
        assert answer.status_code == 200
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
        log.close()


def test_sigterm_to_the_master_drains_then_exits(tmp_path: Path) -> None:
    """How Kubernetes stops the pod: not ready at once, in-flight work finishes, clients close cleanly."""
    srv = Server(tmp_path, policies=copy_policies(tmp_path / "policies"), extra=["--drain-seconds", "2"]).start()
    results: list[tuple[float, int | None, str]] = []
    stop = threading.Event()

    def load() -> None:
        session = https_session(srv.ca, pool=1)
        while not stop.is_set():
            try:
                response = session.post(f"{srv.url}/mutate", json=review_of(example_pod()), timeout=10)
                results.append((time.monotonic(), response.status_code, response.headers.get("Connection", "")))
            except Exception as err:
                results.append((time.monotonic(), None, f"{type(err).__name__}: {err}"))
        session.close()

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        assert srv.process is not None
        term_at = time.monotonic()
        srv.process.send_signal(signal.SIGTERM)
        readyz = None
        with https_session(srv.ca) as probe:
            while time.monotonic() < term_at + 1.0:
                try:
                    readyz = probe.get(f"{srv.url}/readyz", timeout=2)
                except Exception:
                    readyz = None
                if readyz is not None and readyz.status_code == 503:
                    break
                time.sleep(0.02)
        not_ready_after = time.monotonic() - term_at
        assert readyz is not None and readyz.status_code == 503 and "draining" in readyz.text
        time.sleep(1.0)          # still inside the drain window: keep sending
        stop.set()
        for thread in threads:
            thread.join(timeout=15)
        srv.process.wait(timeout=25)
        exit_after = time.monotonic() - term_at
    finally:
        stop.set()
        srv.stop()
    failures = [r for r in results if r[1] != 200]
    after_term = [r for r in results if r[0] > term_at]
    assert not failures, failures[:5]
    assert after_term and any(r[2].lower() == "close" for r in after_term)
    assert not_ready_after < 0.5 and exit_after < 20
    print(f"\nreadyz 503 after {not_ready_after * 1000:.0f} ms; {len(after_term)} requests answered while "
          f"draining, 0 failed; exited {exit_after:.1f} s after SIGTERM")


def test_chaos_minute(tmp_path: Path) -> None:
    """Steady load through policy edits, a bad policy, a certificate rotation, TERM, HUP and KILL."""
    tls = tmp_path / "tls"
    write_tls(tls)
    volume = ConfigMapVolume(tmp_path / "policies")
    volume.publish(repo_policies())
    srv = Server(tmp_path, policies=volume.root,
                 extra=["--cert", str(tls / pki.CERT_FILE), "--key", str(tls / pki.KEY_FILE),
                        "--drain-seconds", "1"]).start(ca=tls / pki.CA_CERT_FILE)
    try:
        report = Chaos(srv, volume, tls).run(60)
        assert srv.process is not None and srv.process.poll() is None, "the server died"
        with https_session(tls / pki.CA_CERT_FILE) as session:
            assert session.get(f"{srv.url}/readyz", timeout=5).status_code == 200
            assert any(key.startswith("gpugate_admissions_total") for key in srv.metrics())
        log = srv.log_text()
    finally:
        srv.stop()
    print("\nchaos, 60 s:\n" + report.summary())
    counts = report.counts()
    assert not report.unexcused_failures(), report.summary()
    assert counts["answered 200"] > 500
    assert all(counts.get(f"event {name}", 0) >= 1 for name in
               ("policy-edit", "policy-invalid", "cert-rotation", "worker-term", "master-hup", "worker-kill"))
    assert "policy reload refused" in log and "certificate reloaded" in log
