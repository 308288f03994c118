"""kube-scheduler's extender ``prioritize`` call over HTTPS (an edge; the scoring is ``webhook.placement``).

The scheduler's side (``pkg/scheduler/extender.go``, ``HTTPExtender.send``): a ``POST`` of the JSON
``ExtenderArgs`` to ``urlPrefix + "/" + prioritizeVerb`` with ``Content-Type: application/json``; any
status but 200 is an error; the body is decoded as a ``HostPriorityList``. The client is Go's
``http.Client`` with ``httpTimeout`` as its whole-request timeout and keep-alive connections, so the
server speaks HTTP/1.1 and keeps connections open. ``prioritizeNodes`` in
``pkg/scheduler/schedule_one.go`` ignores a failed prioritize call ("No score given by this
extender") whatever ``ignorable`` says: an extender that is down, slow or not ready costs the pod
the extender's opinion, never its scheduling.

TLS as the webhook serves it (``webhook.admission.serving``): TLS 1.2 or newer, and the certificate
files re-read when the Secret behind them is replaced. The handshake runs in the connection's
thread, so a client that stalls in it holds one thread, not the listener.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

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


class ExtenderServer:
    """``POST <path>/prioritize`` on an HTTPS listener; ``ready()`` False answers 503 (caches not synced)."""

    def __init__(self, host: str, port: int, *, path: str, certfile: Path, keyfile: Path, answer: Answer,
                 ready: Callable[[], bool], metrics: Metrics) -> None:
        self.certs = CertReloader(certfile, keyfile)  # a bad pair refuses to start: the operator's error
        route = path.rstrip("/") + "/prioritize"
        ok = metrics.extender_requests.labels("prioritize", "ok")
        latency = metrics.extender_duration.labels("prioritize")
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the scheduler's Go client reuses connections
            timeout = READ_TIMEOUT

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                self.request.settimeout(READ_TIMEOUT)
                # The status line and headers, then the body, go out as two writes: with Nagle's
                # algorithm the second waits for the client's delayed ACK (40 ms on Linux), which
                # was most of a call's time.
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.request = outer.certs.context().wrap_socket(self.request, server_side=True)
                super().setup()

            def do_POST(self) -> None:
                started = time.perf_counter()
                length = int(self.headers.get("Content-Length") or -1)
                if not 0 <= length <= MAX_BODY:
                    self.close_connection = True  # the body is not read: the connection cannot go on
                    metrics.extender_requests.labels("prioritize", "bad_request").inc()
                    self._send(413 if length > MAX_BODY else 411, b'{"error": "body size"}\n')
                    return
                body = self.rfile.read(length)  # read whatever the path, so the next request starts clean
                if self.path.split("?", 1)[0] != route:
                    metrics.extender_requests.labels("unknown", "not_found").inc()
                    self._send(404, b'{"error": "not found"}\n')
                    return
                if not ready():
                    metrics.extender_requests.labels("prioritize", "not_ready").inc()
                    self._send(503, b'{"error": "caches not synced"}\n')
                    return
                try:
                    args = orjson.loads(body)
                    if not isinstance(args, dict):
                        raise BadRequest("expected an ExtenderArgs object")
                    payload = orjson.dumps(answer(args))
                except (BadRequest, orjson.JSONDecodeError) as err:
                    metrics.extender_requests.labels("prioritize", "bad_request").inc()
                    self._send(400, orjson.dumps({"error": str(err)[:300]}))
                    return
                except Exception:
                    log.exception("prioritize failed")
                    metrics.extender_requests.labels("prioritize", "error").inc()
                    self._send(500, b'{"error": "internal error"}\n')
                    return
                # Counted before the answer goes out: whoever reads /metrics after the answer sees it.
                ok.inc()
                latency.observe(time.perf_counter() - started)
                self._send(200, payload)

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client that went away, failed the handshake or stalled: nothing to report per connection.
                pass

        self._server = Server((host, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ExtenderServer:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="extender", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
