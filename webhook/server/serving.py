"""Running the Flask app under gunicorn: threaded workers, keep-alive, TLS 1.2+ with live cert reload.

gunicorn (27) wraps every accepted connection with the SSLContext returned by its
``ssl_context(conf, default_factory)`` server hook; by default that builds a fresh context (and
re-reads the key files) per connection. ``webhook.certs.reload.CertReloader`` (its
``gunicorn_hook``) instead keeps one context per worker process, replaced when the files change.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger

from webhook import logs
from webhook.certs.reload import CertReloader
from webhook.server import metrics, workershared

_log = logging.getLogger(logs.SERVER_LOGGER)


class NoAccessLogLogger(GunicornLogger):
    """gunicorn's logger without its access log: every admission already has its own JSON line.

    gunicorn builds the access-log atoms of every request whenever a logging config is given (ours
    is), even with its ``gunicorn.access`` logger silenced: about 3% of a worker's time per review
    (measured with py-spy on the null webhook).
    """

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        return None


H2_STREAMS_PER_CONNECTION = 2
"""The HTTP/2 streams one connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS). gunicorn answers
a connection's streams one after another on one thread, so a stream waits behind the others of its
connection: at 8, with 256 concurrent creators on a loaded two-core machine, 137 of 480 creates
timed out at the validating webhook (HTTP/1.1, one call per connection, none). At 2 the API server
opens a connection per two calls in flight, each on its own thread, and the serial path keeps its one
connection."""
ALPN = ("h2", "http/1.1")
"""What the TLS handshake offers, preferred first (``--no-http2``: HTTP/1.1 alone)."""

GRACEFUL_TIMEOUT = 20
"""Seconds gunicorn's master gives a stopping worker (drain and in-flight requests) before SIGKILL."""

# Settings newer gunicorn releases have; skipped when the installed one does not know them.
_OPTIONAL_SETTINGS = frozenset({"control_socket_disable"})


class GunicornServer(BaseApplication):
    """A gunicorn application built from code (no config file), serving ``app_factory()``."""

    def __init__(self, app_factory: Callable[[], Any], options: dict[str, Any]) -> None:
        self._factory = app_factory
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            if key in _OPTIONAL_SETTINGS and key not in self.cfg.settings:
                continue  # an older gunicorn without this setting
            self.cfg.set(key, value)

    def load(self) -> Any:
        app = self._factory()
        # The app, its modules and the policy set live as long as the worker: frozen, they are left
        # out of the cyclic collector's full passes, which the garbage of every review triggers
        # (measured in-process on the realistic review: about 10-15 us less per review).
        gc.freeze()
        return app


def gunicorn_options(
    *,
    bind: str,
    workers: int,
    threads: int,
    certfile: Path,
    keyfile: Path,
    reloader: CertReloader,
    metrics_bind: tuple[str, int] | None = None,
    keepalive: int = 75,
    max_requests: int = 0,
    graceful_timeout: int = GRACEFUL_TIMEOUT,
    http2: bool = False,
) -> dict[str, Any]:
    """The gunicorn settings ``gpugate serve`` runs with, in one place.

    keepalive 75 s: the API server's Go client keeps idle connections for 90 s; closing them a
    little earlier than the client does avoids a request racing a server-side close, and keeps
    TLS handshakes rare under steady load. graceful_timeout 20 s: a stopping worker's drain and
    in-flight requests end well inside the pod's terminationGracePeriodSeconds (manifests/webhook).
    max_requests: recycle a worker after that many requests (0: never), with 10% jitter so the
    workers do not all restart at once.
    """
    return {
        "bind": [bind],
        "workers": workers,
        "threads": threads,
        "worker_class": "webhook.server.worker.AdmissionWorker",
        "worker_connections": 1000,
        # HTTP/2 from gunicorn itself (the ``http2`` extra, the h2 package) for clients that choose it
        # by ALPN, as the API server does; HTTP/1.1 for the rest.
        "http_protocols": "h2,h1" if http2 else "h1",
        # gunicorn answers a connection's streams one after another on one thread: with a few streams per
        # connection the API server opens more connections as its calls in flight grow, and those
        # spread over the workers and their threads.
        "http2_max_concurrent_streams": H2_STREAMS_PER_CONNECTION,
        "keepalive": keepalive,
        "timeout": 30,
        "graceful_timeout": graceful_timeout,
        "max_requests": max_requests,
        "max_requests_jitter": max_requests // 10,
        "certfile": str(certfile),
        "keyfile": str(keyfile),
        "ssl_context": reloader.gunicorn_hook,
        **_LOGGING,
        "proc_name": "gpugate",
        "worker_tmp_dir": "/dev/shm" if os.path.isdir("/dev/shm") else None,
        **_hooks(metrics_bind),
        "preload_app": False,
        # gunicorn >= 25 opens a control socket at one fixed path per user: several servers
        # (tests, benchmarks) would fight over it, and nothing here uses it.
        "control_socket_disable": True,
    }


_LOGGING: dict[str, Any] = {
    "accesslog": None,
    "logger_class": f"{__name__}.NoAccessLogLogger",
    "logconfig_dict": logs.LOGCONFIG,
}


def _hooks(metrics_bind: tuple[str, int] | None) -> dict[str, Any]:
    """The master's hooks: the metrics listener once ready, and the worker slots of ``workershared``."""

    def when_ready(server: Any) -> None:
        if metrics_bind is not None:
            metrics.start_plaintext_server(*metrics_bind)
            logs.log_event(_log, "metrics listening (plaintext, /metrics only)",
                           url=f"http://{metrics_bind[0]}:{metrics_bind[1]}/metrics")

    def child_exit(server: Any, gunicorn_worker: Any) -> None:
        # Whatever way the worker ended (exit, crash, kill by the worker timeout): its live gauges
        # go, its counters stay in the sums, and its balancing slot is freed.
        metrics.mark_process_dead(gunicorn_worker.pid)
        workershared.child_exit(server, gunicorn_worker)

    return {"when_ready": when_ready, "pre_fork": workershared.pre_fork, "child_exit": child_exit}
