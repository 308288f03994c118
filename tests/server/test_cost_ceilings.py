"""What one client or one review can cost the served webhook, each with a ceiling, on a real ``gpugate serve``.

The webhook's port is open to every pod, and validation fails closed: anything a tenant can do to
make the server slow or dead is an outage of pod creation. Each test is a hostile client beside an
ordinary one (the API server's part), and asserts the ordinary one is still answered.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
import time

import pytest

from tests.server.h2client import H2Client
from tests.server.harness import Server, example_pod, https_session, review_of, running
from tests.server.test_worker import read_response
from webhook.admission import budget
from webhook.server.serverstate import MAX_BODY_BYTES


@pytest.fixture(scope="module")
def server(module_tmp):
    with running(module_tmp, "--http2", "--request-timeout", "2", "--max-connections-per-source", "40") as srv:
        yield srv


def _context(srv: Server) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(srv.ca))
    context.check_hostname = False
    return context


def _review_over_h2(srv: Server, source: str = "127.0.0.9") -> tuple[int, dict, float]:
    client = H2Client(srv.port, srv.ca, source=source)
    try:
        started = time.monotonic()
        status, body = client.post("/validate?timeout=5s", json.dumps(review_of(example_pod())).encode())
        return status, json.loads(body), time.monotonic() - started
    finally:
        client.close()


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except (OSError, ssl.SSLError):
        return True


def _healthz(sock: ssl.SSLSocket) -> bool:
    """GET /healthz on a kept-alive connection; whether the whole answer came back."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, body = read_response(sock)
    return status == 200 and b'"ok":true' in body


def test_the_api_server_speaks_http2_and_is_answered_as_over_http1(server):
    status, answer, _ = _review_over_h2(server)
    assert status == 200 and answer["response"]["allowed"] is True
    client = H2Client(server.port, server.ca)
    try:
        assert client.protocol == "h2"
        for _ in range(3):  # several streams on one connection
            status, body = client.post("/mutate", json.dumps(review_of(example_pod())).encode())
            assert status == 200 and json.loads(body)["response"]["patchType"] == "JSONPatch"
    finally:
        client.close()
    assert server.metrics().get("gpugate_http2_connections_total", 0) >= 2


def test_connections_that_never_send_a_request_are_closed_after_the_request_timeout(server):
    idle_tcp = [socket.create_connection(("127.0.0.1", server.port), source_address=("127.0.0.2", 0))
                for _ in range(10)]
    idle_tls = [_context(server).wrap_socket(socket.create_connection(("127.0.0.1", server.port),
                                                                      source_address=("127.0.0.2", 0)),
                                             server_hostname="x") for _ in range(10)]
    served = _context(server).wrap_socket(socket.create_connection(("127.0.0.1", server.port)), server_hostname="x")
    assert _healthz(served)
    time.sleep(3.5)  # the request timeout is 2 s; the keep-alive time (75 s) is for connections that asked
    try:
        assert all(_closed(sock) for sock in idle_tcp + idle_tls)
        assert _healthz(served)
    finally:
        for sock in idle_tcp + idle_tls + [served]:
            sock.close()


def test_a_flood_of_connections_from_one_address_leaves_others_answered(server):
    """400 connections from one pod: past 40 per worker they are closed at accept; the API server's
    review, from another address, is answered in well under a second throughout."""
    flood: list[socket.socket] = []
    stop = threading.Event()

    def open_many() -> None:
        while not stop.is_set() and len(flood) < 400:
            try:
                flood.append(socket.create_connection(("127.0.0.1", server.port), timeout=2,
                                                      source_address=("127.0.0.3", 0)))
            except OSError:
                time.sleep(0.01)

    opener = threading.Thread(target=open_many, daemon=True)
    opener.start()
    try:
        times = []
        for _ in range(10):
            status, answer, took = _review_over_h2(server)
            assert status == 200 and answer["response"]["allowed"] is True
            times.append(took)
        assert max(times) < 1.0, times
        time.sleep(0.5)
        alive = [sock for sock in list(flood) if not _closed(sock)]
        assert len(alive) <= 2 * 40, len(alive)
    finally:
        stop.set()
        opener.join(5)
        for sock in flood:
            sock.close()


def _workers_rss(srv: Server) -> int:
    assert srv.process is not None
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = open(f"/proc/{pid}/status").read()
        except OSError:
            continue
        if f"PPid:\t{srv.process.pid}\n" in status:
            total += int(status.split("VmRSS:")[1].split()[0]) * 1024
    return total


def test_stalled_maximum_size_bodies_stay_under_the_memory_limit(server):
    """128 connections each announce the largest body and send 2 MiB of it, then stall: the workers
    hold at most their share of unfinished bytes (the largest holders are refused), stay far under the
    Deployment's 512 Mi, and an ordinary review is still answered."""
    head = (f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {MAX_BODY_BYTES}\r\n\r\n").encode()
    stalled = []
    chunk = b"x" * (2 * 1024 * 1024)
    try:
        for i in range(128):
            sock = _context(server).wrap_socket(
                socket.create_connection(("127.0.0.1", server.port), source_address=(f"127.0.1.{i + 1}", 0)),
                server_hostname="x")
            sock.settimeout(5)
            try:
                sock.sendall(head + chunk)
            except OSError:
                pass   # refused mid-send: the server had no room
            stalled.append(sock)
        rss = _workers_rss(server)
        status, answer, took = _review_over_h2(server)
        assert status == 200 and answer["response"]["allowed"] is True and took < 1.0
    finally:
        for sock in stalled:
            sock.close()
    assert rss < 400 * 1024 * 1024, f"workers hold {rss / 2**20:.0f} MiB"


def _pathological_pod(terms: int) -> dict:
    pod = example_pod()
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": f"k{i}", "operator": "In", "values": ["v"]}]}
                              for i in range(terms)]}}}
    return pod


def test_a_pathological_pod_is_refused_at_the_ceiling_quickly_and_blocks_no_one(server):
    """38,000 node-selector terms (a 3 MB review the API server accepts): refused on its byte count,
    before it is decoded, four at once, while an ordinary review is answered as usual."""
    review = review_of(_pathological_pod(38_000), namespace="ml-team")
    body = json.dumps(review).encode()
    results: list[tuple[int, dict, float]] = []

    def send() -> None:
        with https_session(server.ca) as session:
            started = time.monotonic()
            http = session.post(f"{server.url}/validate", data=body, timeout=30,
                                headers={"Content-Type": "application/json"})
            results.append((http.status_code, http.json()["response"], time.monotonic() - started))

    senders = [threading.Thread(target=send) for _ in range(4)]
    for thread in senders:
        thread.start()
    _, ordinary, took = _review_over_h2(server)
    for thread in senders:
        thread.join(30)
    assert ordinary["response"]["allowed"] is True and took < 1.0
    assert len(results) == 4
    for status, answer, seconds in results:
        assert status == 200 and answer["allowed"] is False
        assert f"more than {budget.MAX_KEYS:,} fields" in answer["status"]["message"]
        assert seconds < 3.0


def test_http2_connections_from_one_address_are_capped_too(server):
    """Each HTTP/2 connection holds a thread for its life: past the per-address cap (40 per worker
    here) they are closed at once, and the API server's review, from another address, is answered."""
    clients, refused = [], 0
    try:
        for _ in range(100):
            try:
                client = H2Client(server.port, server.ca, source="127.0.0.5", timeout=5)
                client.post("/validate", json.dumps(review_of(example_pod())).encode())
                clients.append(client)
            except (ConnectionError, OSError, ssl.SSLError):
                refused += 1
        assert _review_over_h2(server)[0] == 200
    finally:
        for client in clients:
            client.close()
    assert refused >= 20 and len(clients) <= 80
