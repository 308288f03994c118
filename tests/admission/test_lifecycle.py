"""Worker restarts must not take the server down (issue 18).

gunicorn replaces a worker that exits; these tests make workers exit the ways they do in a
cluster (graceful TERM, a crash, the master's HUP reload) and check that the server keeps
answering and that ``/metrics`` keeps counting across the restart.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.admission.harness import Server, copy_policies, example_pod, review_of

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
