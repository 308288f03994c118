"""Plaintext ``/healthz`` and ``/metrics`` for the kubelet and Prometheus (an edge)."""

from __future__ import annotations

import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from webhook.balancer.listener import Listener, send
from webhook.balancer.metrics import Metrics


class HealthServer(Listener):
    """Serves ``/healthz`` from ``status()`` (``{"ok": bool, ...}``: alive), ``/readyz`` from
    ``ready()`` (the caches hold a full list), ``/metrics`` from ``metrics``, and ``/extender/mix``
    from ``mix()``: the pod-shape mix the extender measures with, as the YAML ``--extender-mix``
    reads, so a mix the balancer learned can be pinned (404 when the extender is off)."""

    def __init__(self, host: str, port: int, *, metrics: Metrics, status: Callable[[], dict[str, Any]],
                 ready: Callable[[], bool] = lambda: True,
                 mix: Callable[[], list[dict[str, Any]] | None] = lambda: None) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    state = status()
                    self._send(200 if state.get("ok") else 503, "application/json",
                               json.dumps(state).encode())
                elif path == "/readyz":
                    ok = ready()
                    self._send(200 if ok else 503, "text/plain", b"ok\n" if ok else b"caches not synced\n")
                elif path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(outer.metrics.registry))
                elif path == "/extender/mix":
                    entries = mix()
                    if entries is None:
                        self._send(404, "text/plain", b"the scheduler extender is not served by this balancer\n")
                    else:
                        body = "# gpugate balance --extender-mix: the pod shapes the extender measures with\n"
                        self._send(200, "application/yaml",
                                   (body + yaml.safe_dump(entries, sort_keys=False)).encode())
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, code: int, content_type: str, body: bytes) -> None:
                send(self, code, content_type, body)

        self.metrics = metrics
        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        super().__init__(server, thread_name="balancer-health")
