"""What stock gunicorn (27, ``gthread``, ``--http-protocols h2,h1``, TLS) lacks, measured, beside gpugate's server.

gpugate serves HTTP/2 with gunicorn's own code and keeps one piece of its own for HTTP/1.1: the loop
that reads a request whole, under a deadline, before a thread is given it (``server/requestloop.py``).
This is the measurement that keeps it: on stock gunicorn, as many stalled clients as it has threads
(a request's headers and part of its body, then nothing) hold every thread, and a new client is not
answered while they stay. With validation failing closed, that is an outage any pod can cause.
"""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from tests.server.harness import REPO, Server, copy_policies, free_port
from webhook.certs import pki

STALLED = b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"


def _tls(port: int, ca: Path) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    return context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="x")


def _answered_within(port: int, ca: Path, seconds: float) -> bool:
    try:
        sock = _tls(port, ca)
    except (OSError, ssl.SSLError):
        return False
    sock.settimeout(seconds)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return b" 200 " in sock.recv(4096)
    except (OSError, ssl.SSLError):
        return False
    finally:
        sock.close()


def _stall(port: int, ca: Path, count: int) -> list[ssl.SSLSocket]:
    stalled = []
    for _ in range(count):
        sock = _tls(port, ca)
        sock.sendall(STALLED)
        stalled.append(sock)
    time.sleep(0.5)
    return stalled


def test_stock_gunicorn_is_held_by_stalled_clients_and_gpugate_is_not(tmp_path):
    bundle = pki.create_bundle(service="gpugate-webhook", namespace="gpugate-system", now=datetime.now(UTC))
    pki.write_bundle(bundle, tmp_path / "tls")
    ca = tmp_path / "tls" / pki.CA_CERT_FILE
    port = free_port()
    stock = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--workers", "1", "--threads", "4",
         "--http-protocols", "h2,h1", "--certfile", str(tmp_path / "tls" / pki.CERT_FILE),
         "--keyfile", str(tmp_path / "tls" / pki.KEY_FILE), "--bind", f"127.0.0.1:{port}",
         "--no-control-socket", "tests.server.hello_wsgi:app"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    stalled: list[ssl.SSLSocket] = []
    try:
        deadline = time.monotonic() + 20
        while not _answered_within(port, ca, 1.0):
            assert time.monotonic() < deadline, "stock gunicorn did not start"
            time.sleep(0.2)
        stalled = _stall(port, ca, 4)
        stock_answers = _answered_within(port, ca, 3.0)
    finally:
        for sock in stalled:
            sock.close()
        stock.send_signal(signal.SIGTERM)
        try:
            stock.wait(15)
        except subprocess.TimeoutExpired:
            stock.kill()
            stock.wait(5)
    assert not stock_answers, "stock gunicorn answered while its threads were held: the loop may go"

    srv = Server(tmp_path / "gpugate", policies=copy_policies(tmp_path / "gpugate" / "policies"), workers=1,
                 threads=4)
    (tmp_path / "gpugate").mkdir(exist_ok=True)
    srv.start()
    stalled = []
    try:
        stalled = _stall(srv.port, srv.ca, 64)
        assert _answered_within(srv.port, srv.ca, 1.0)
    finally:
        for sock in stalled:
            sock.close()
        srv.stop()
