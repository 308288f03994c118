"""``gpugate serve`` as a person runs it in a terminal: what it cannot do it says in one line and exits 1
before anything starts, and Ctrl-C ends it promptly and cleanly."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

from tests.server.h2client import H2Client
from tests.server.harness import Server, copy_policies, example_pod, free_port, review_of


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
           timeout: float = 20) -> subprocess.CompletedProcess[str]:
    copy_policies(tmp_path / "policies")
    return subprocess.run([sys.executable, "-m", "webhook.cli", "serve", "--state-dir", str(tmp_path / "state"),
                           "--policies", str(tmp_path / "policies"), *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=timeout)


def test_resolve_claims_without_a_cluster_is_one_error_not_workers_failing_in_a_loop(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
    env.update(KUBECONFIG=str(tmp_path / "no-such-kubeconfig"), HOME=str(tmp_path))
    started = time.monotonic()
    result = _serve(tmp_path, "--bind", f"127.0.0.1:{free_port()}", "--resolve-claims", env=env)
    assert result.returncode == 1
    assert time.monotonic() - started < 15
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--resolve-claims" in errors[0] and "KUBECONFIG" in errors[0], result.stderr
    assert "--server" not in result.stderr           # an option serve does not have
    assert "Booting worker" not in result.stderr and "Traceback" not in result.stderr


def test_a_busy_port_is_one_line_and_nothing_says_serving(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve(tmp_path, "--bind", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "serving" not in result.stderr and "Connection in use" not in result.stderr, result.stderr


def test_ctrl_c_ends_the_server_promptly_with_connections_open(tmp_path):
    """Ctrl-C reaches the master and every worker (the terminal signals the process group); with an
    idle kept-alive connection, a connection that never sent a byte, a request stalled halfway and
    HTTP/2 connections open, the server still ends within seconds and no worker is SIGKILLed."""
    srv = Server(tmp_path, policies=copy_policies(tmp_path / "policies"), extra=["--http2"]).start()
    context = ssl.create_default_context(cafile=str(srv.ca))
    context.check_hostname = False
    held = []
    try:
        idle = context.wrap_socket(socket.create_connection(("127.0.0.1", srv.port)), server_hostname="x")
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        idle.recv(4096)
        stalled = context.wrap_socket(socket.create_connection(("127.0.0.1", srv.port)), server_hostname="x")
        stalled.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        held += [idle, stalled, socket.create_connection(("127.0.0.1", srv.port))]
        streams = [H2Client(srv.port, srv.ca) for _ in range(3)]   # the API server's, each on its own thread
        streams[0].post("/validate", json.dumps(review_of(example_pod())).encode())
        held += [client.sock for client in streams]
        time.sleep(0.5)
        took = srv.ctrl_c()
    finally:
        for sock in held:
            sock.close()
        srv.stop()
    assert took < 5, f"Ctrl-C took {took:.1f} s"
    log = srv.log_text()
    assert "SIGKILL" not in log and "Traceback" not in log, log[-2000:]


def test_http1_alone_unless_http2_is_asked_for(tmp_path):
    """By default the handshake offers HTTP/1.1 only, so the API server speaks it (docs/server.md says
    why: under 256 concurrent creators gunicorn's HTTP/2 timed out where HTTP/1.1 did not)."""
    srv = Server(tmp_path, policies=copy_policies(tmp_path / "policies"), workers=1).start()
    try:
        client = H2Client(srv.port, srv.ca)
        try:
            assert client.protocol is None
        finally:
            client.close()
        assert srv.session.get(f"{srv.url}/healthz", timeout=5).status_code == 200
    finally:
        srv.stop()
