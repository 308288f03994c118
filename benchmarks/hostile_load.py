"""The hostile load of the admission server's cost ceilings, as threads against one served webhook.

What ``benchmarks/create_latency.py --hostile SECONDS`` runs beside an ordinary creator (and what the
tests in ``tests/server/test_cost_ceilings.py`` each run alone): one address opening connections
without end, TLS connections that handshake and never send a request, connections that announce
the largest body and stall after 1 MiB, and reviews of a pod with 38,000 node-selector terms, two at
a time. Every client comes from its own loopback address (127.0.0.2-127.0.1.x), as pods would.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

from webhook.admission import reviews
from webhook.server.serverstate import MAX_BODY_BYTES


def pathological_review() -> bytes:
    """A review of a pod with 38,000 node-selector terms (about 3 MB)."""
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "many-terms"},
                           "spec": {"containers": [{"name": "c", "image": "x",
                                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                        "nodeSelectorTerms": [{"matchExpressions": [
                                            {"key": f"k{i}", "operator": "In", "values": ["v"]}]}
                                            for i in range(38_000)]}}}}}
    return json.dumps(reviews.wrap_pod(pod, uid="hostile", namespace="ml-team")).encode()


class HostileLoad:
    """Starts the hostile clients on ``port``; ``stop`` ends them and closes every socket."""

    def __init__(self, port: int, ca: Path) -> None:
        self.port = port
        self.context = ssl.create_default_context(cafile=str(ca))
        self.context.check_hostname = False
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.counts = {"flood": 0, "idle_tls": 0, "stalled": 0, "pathological": 0}
        self._threads = [threading.Thread(target=target, daemon=True) for target in
                         (self._flood, self._idle_tls, self._stalled, self._pathological, self._pathological)]

    def start(self) -> HostileLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> dict[str, int]:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass
            self._sockets.clear()
        return dict(self.counts)

    def _connect(self, source: str) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10, source_address=(source, 0))
        with self._lock:
            self._sockets.append(sock)
        return sock

    def _flood(self) -> None:
        while not self._stop.is_set():
            try:
                self._connect("127.0.0.3")
                self.counts["flood"] += 1
            except OSError:
                time.sleep(0.01)
            if self.counts["flood"] % 100 == 0:
                time.sleep(0.05)

    def _idle_tls(self) -> None:
        while not self._stop.is_set():
            try:
                self.context.wrap_socket(self._connect("127.0.0.6"), server_hostname="x")
                self.counts["idle_tls"] += 1
            except (OSError, ssl.SSLError):
                time.sleep(0.05)

    def _stalled(self) -> None:
        head = (f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {MAX_BODY_BYTES}\r\n\r\n").encode()
        chunk = b"x" * (1024 * 1024)
        index = 0
        while not self._stop.is_set():
            index += 1
            try:
                sock = self.context.wrap_socket(self._connect(f"127.0.1.{index % 250 + 1}"), server_hostname="x")
                sock.sendall(head + chunk)
                self.counts["stalled"] += 1
            except (OSError, ssl.SSLError):
                time.sleep(0.05)
            if index % 64 == 0:
                time.sleep(1.0)

    def _pathological(self) -> None:
        body = pathological_review()
        head = (f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        while not self._stop.is_set():
            try:
                with self.context.wrap_socket(socket.create_connection(("127.0.0.1", self.port), timeout=10,
                                                                       source_address=("127.0.0.4", 0)),
                                              server_hostname="x") as sock:
                    sock.sendall(head + body)
                    sock.recv(65536)
                self.counts["pathological"] += 1
            except (OSError, ssl.SSLError):
                time.sleep(0.05)
