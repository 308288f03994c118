"""kube-scheduler's extender ``prioritize`` call over HTTPS (an edge; the scoring is ``webhook.placement``).

The scheduler's side (``pkg/scheduler/extender.go``, ``HTTPExtender.send``): a ``POST`` of the JSON
``ExtenderArgs`` to ``urlPrefix + "/" + prioritizeVerb`` with ``Content-Type: application/json``; any
status but 200 is an error; the body is decoded as a ``HostPriorityList``. The client is Go's
``http.Client`` with ``httpTimeout`` as its whole-request timeout and keep-alive connections, so the
server speaks HTTP/1.1 and keeps connections open. ``prioritizeNodes`` in
``pkg/scheduler/schedule_one.go`` ignores a failed prioritize call ("No score given by this
extender") whatever ``ignorable`` says: an extender that is down, slow or not ready costs the pod
the extender's opinion, never its scheduling.

TLS as the webhook serves it (``webhook.server.serving``): TLS 1.2 or newer, and the certificate
files re-read when the Secret behind them is replaced. The handshake runs in the connection's
thread, so a client that stalls in it holds one thread, not the listener.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

from webhook.balancer.listener import Listener, send
from webhook.balancer.metrics import Metrics
from webhook.certs.reload import CertReloader

log = logging.getLogger("gpugate.balancer.extender")

MAX_BODY = 8 << 20
"""Largest ExtenderArgs read: a pod (tens of KB) and 5,000 node names (~100 KB) fit many times over."""
READ_TIMEOUT = 10.0
"""Seconds a connection may sit idle (between requests, or in a handshake) before it is closed."""


class BadRequest(Exception):
    """The body is not an ExtenderArgs the scorer can read; answered 400 with the message."""


Answer = Callable[[Any], list[Any]]
"""ExtenderArgs (decoded JSON) -> HostPriorityList; raises BadRequest for what it cannot read."""


class _Server(ThreadingHTTPServer):
    """The listener, carrying what its handlers answer with."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], *, route: str, certs: CertReloader, answer: Answer,
                 ready: Callable[[], bool], metrics: Metrics) -> None:
        self.route = route
        self.certs = certs
        self.answer = answer
        self.ready = ready
        self.metrics = metrics
        self.ok = metrics.extender_requests.labels("prioritize", "ok")
        self.latency = metrics.extender_duration.labels("prioritize")
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away, failed the handshake or stalled: nothing to report per connection.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the scheduler's Go client reuses connections
    timeout = READ_TIMEOUT
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        self.request.settimeout(READ_TIMEOUT)
        # The status line and headers, then the body, go out as two writes: with Nagle's
        # algorithm the second waits for the client's delayed ACK (40 ms on Linux), which
        # was most of a call's time.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request = self.server.certs.context().wrap_socket(self.request, server_side=True)
        super().setup()

    def do_POST(self) -> None:
        started = time.perf_counter()
        served = self.server
        metrics = served.metrics
        length = int(self.headers.get("Content-Length") or -1)
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True  # the body is not read: the connection cannot go on
            metrics.extender_requests.labels("prioritize", "bad_request").inc()
            self._send(413 if length > MAX_BODY else 411, b'{"error": "body size"}\n')
            return
        body = self.rfile.read(length)  # read whatever the path, so the next request starts clean
        if self.path.split("?", 1)[0] != served.route:
            metrics.extender_requests.labels("unknown", "not_found").inc()
            self._send(404, b'{"error": "not found"}\n')
            return
        if not served.ready():
            metrics.extender_requests.labels("prioritize", "not_ready").inc()
            self._send(503, b'{"error": "caches not synced"}\n')
            return
        payload = self._answer(body)
        if payload is None:
            return
        # Counted before the answer goes out: whoever reads /metrics after the answer sees it.
        served.ok.inc()
        served.latency.observe(time.perf_counter() - started)
        self._send(200, payload)

    def _answer(self, body: bytes) -> bytes | None:
        """The HostPriorityList as JSON; None when an error was answered instead."""
        metrics = self.server.metrics
        try:
            args = orjson.loads(body)
            if not isinstance(args, dict):
                raise BadRequest("expected an ExtenderArgs object")
            return orjson.dumps(self.server.answer(args))
        except (BadRequest, orjson.JSONDecodeError) as err:
            metrics.extender_requests.labels("prioritize", "bad_request").inc()
            self._send(400, orjson.dumps({"error": str(err)[:300]}))
        except Exception:
            log.exception("prioritize failed")
            metrics.extender_requests.labels("prioritize", "error").inc()
            self._send(500, b'{"error": "internal error"}\n')
        return None

    def _send(self, code: int, body: bytes) -> None:
        send(self, code, "application/json", body)


class ExtenderServer(Listener):
    """``POST <path>/prioritize`` on an HTTPS listener; ``ready()`` False answers 503 (caches not synced)."""

    def __init__(self, host: str, port: int, *, path: str, certfile: Path, keyfile: Path, answer: Answer,
                 ready: Callable[[], bool], metrics: Metrics) -> None:
        self.certs = CertReloader(certfile, keyfile)  # a bad pair refuses to start: the operator's error
        super().__init__(_Server((host, port), route=path.rstrip("/") + "/prioritize", certs=self.certs,
                                 answer=answer, ready=ready, metrics=metrics), thread_name="extender")
