"""``gpugate balance`` as a process: JSON logs, SIGTERM releases the lease, a crash is covered by expiry."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.balancer.conftest import fast_settings, wait_for
from tests.balancer.test_controller import gpu_node, gpu_pod, marks
from tests.kubefake import FakeKube

REPO = Path(__file__).resolve().parents[2]
LEASE = ("coordination.k8s.io/v1", "Lease", "gpugate-balancer", "gpugate-system")

FAST = """\
lease: {duration: 1, renew_deadline: 0.7, retry_period: 0.15}
backoff_initial: 0.05
backoff_max: 0.2
watch_timeout: 5
"""


def start_command(fk: FakeKube, tmp_path: Path, identity: str) -> subprocess.Popen:
    config = tmp_path / "balancer.yaml"
    config.write_text(FAST)
    return subprocess.Popen(
        [sys.executable, "-m", "webhook.cli", "balance", "--server", fk.url, "--config", str(config),
         "--identity", identity, "--lease-namespace", "gpugate-system", "--health-bind", "127.0.0.1:0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def holder(fk: FakeKube) -> str | None:
    lease = fk.get(*LEASE)
    return None if lease is None else lease["spec"].get("holderIdentity")


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_sigterm_releases_the_lease_and_logs_are_json_lines(fake_kube: FakeKube, tmp_path: Path, processes) -> None:
    fake_kube.put(gpu_node("gpu-1"))
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=2))
    proc = start_command(fake_kube, tmp_path, "cli-1")
    processes.append(proc)
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("6", "idle") or proc.poll() is not None, timeout=60,
             what="the command to label the node")
    assert proc.poll() is None, proc.stderr.read()
    assert holder(fake_kube) == "cli-1"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert not holder(fake_kube)
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    messages = [line["event"] for line in lines]
    assert "node marks updated" in messages and "lease released" in messages and "balancer stopped" in messages
    assert all({"ts", "level", "logger", "event", "pid"} <= set(line) for line in lines)  # the server's format too


def test_a_standby_takes_over_when_the_leader_dies_without_releasing(
        fake_kube: FakeKube, tmp_path: Path, processes, start_balancer) -> None:
    fake_kube.put(gpu_node("gpu-1"))
    proc = start_command(fake_kube, tmp_path, "cli-1")
    processes.append(proc)
    wait_for(lambda: holder(fake_kube) == "cli-1" or proc.poll() is not None, timeout=60, what="the command leading")
    standby = start_balancer(fast_settings(lease={"identity": "replica-b"}))
    wait_for(lambda: standby.balancer.synced, what="standby synced")
    assert not standby.balancer.writes()
    proc.kill()  # no release: the standby must wait for the lease to expire
    proc.wait(5)
    wait_for(lambda: standby.balancer.writes(), timeout=30, what="standby taking over an expired lease")
    assert holder(fake_kube) == "replica-b"
    fake_kube.put(gpu_pod("a", "gpu-1", gpus=8))
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("0", "congested"), what="the new leader writing")


def test_the_token_file_is_sent_as_a_bearer_token(fake_kube: FakeKube, tmp_path: Path, processes) -> None:
    """What `gpugate balance --server URL --token-file` sends: the e2e test runs it as a ServiceAccount."""
    fake_kube.put(gpu_node("gpu-1"))
    token = tmp_path / "token"
    token.write_text("e2e-token-123\n")
    config = tmp_path / "balancer.yaml"
    config.write_text(FAST)
    proc = subprocess.Popen(
        [sys.executable, "-m", "webhook.cli", "balance", "--server", fake_kube.url, "--token-file", str(token),
         "--config", str(config), "--identity", "tok", "--lease-namespace", "gpugate-system",
         "--health-bind", "127.0.0.1:0"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    processes.append(proc)
    wait_for(lambda: marks(fake_kube, "gpu-1") == ("8", "idle") or proc.poll() is not None, timeout=60,
             what="the command to label the node")
    assert proc.poll() is None
    sent = {r.headers.get("authorization") for r in fake_kube.requests if r.path.startswith("/api")}
    assert sent == {"Bearer e2e-token-123"}
    assert {r.user_agent for r in fake_kube.requests} == {"gpugate-balancer (tok)"}
