"""Running the Flask app under gunicorn: threaded workers, keep-alive, TLS 1.2+ with live cert reload.

gunicorn (27) wraps every accepted connection with the SSLContext returned by its
``ssl_context(conf, default_factory)`` server hook; by default that builds a fresh context (and
re-reads the key files) per connection. ``CertReloader`` instead keeps one context per worker
process and, at most once per ``interval``, compares a digest of the certificate and key files.
When they changed and form a valid pair, a new context is built and swapped in: connections
already open (and requests in flight on them) keep the context they were made with, and new
handshakes present the new certificate. A half-written or mismatched pair (the files are
replaced one at a time) is refused and the old context keeps serving until the pair is whole.

TLS 1.2 is the floor; TLS 1.2 ciphers are limited to ECDHE with AEAD (TLS 1.3 suites are
OpenSSL's defaults, all AEAD).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger

from webhook import logs
from webhook.admission import metrics, worker

_log = logging.getLogger(logs.SERVER_LOGGER)

TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def build_context(certfile: Path, keyfile: Path) -> ssl.SSLContext:
    """A server-side SSLContext: TLS 1.2 or newer, forward-secret AEAD ciphers only."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    context.load_cert_chain(certfile=str(certfile), keyfile=str(keyfile))
    return context


def _files_digest(certfile: Path, keyfile: Path) -> str:
    digest = hashlib.sha256()
    for path in (certfile, keyfile):
        digest.update(Path(path).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


class CertReloader:
    """One SSLContext per process, replaced when the certificate files change."""

    def __init__(self, certfile: Path, keyfile: Path, *, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.certfile, self.keyfile = Path(certfile), Path(keyfile)
        self.interval = interval
        self._clock = clock
        # Loaded eagerly: a bad pair at start-up is the operator's error, reported before serving.
        self._digest = _files_digest(self.certfile, self.keyfile)
        self._context = build_context(self.certfile, self.keyfile)
        self._refused_digest: str | None = None
        self._next_check = clock() + interval
        self._lock = threading.Lock()
        self.reloads = 0

    def context(self) -> ssl.SSLContext:
        """The context for a new connection; checks the files when the interval has passed."""
        if self._clock() >= self._next_check and self._lock.acquire(blocking=False):
            try:
                self._next_check = self._clock() + self.interval
                self._maybe_reload()
            finally:
                self._lock.release()
        return self._context

    def _maybe_reload(self) -> None:
        try:
            digest = _files_digest(self.certfile, self.keyfile)
        except OSError as err:  # a file missing for a moment during a replace
            logs.log_event(_log, "certificate files unreadable; keeping the current certificate",
                           logging.WARNING, certfile=str(self.certfile), error=str(err))
            return
        if digest == self._digest or digest == self._refused_digest:
            return
        try:
            context = build_context(self.certfile, self.keyfile)
        except (ssl.SSLError, OSError) as err:
            self._refused_digest = digest
            logs.log_event(_log, "new certificate refused; keeping the current one", logging.ERROR,
                           certfile=str(self.certfile), keyfile=str(self.keyfile), error=str(err))
            return
        self._context, self._digest = context, digest
        self.reloads += 1
        logs.log_event(_log, "certificate reloaded", certfile=str(self.certfile), pid=os.getpid())

    def gunicorn_hook(self, conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        """The ``ssl_context`` server hook: ignore the per-connection factory, use ours."""
        return self.context()


class NoAccessLogLogger(GunicornLogger):
    """gunicorn's logger without its access log: every admission already has its own JSON line.

    gunicorn builds the access-log atoms of every request whenever a logging config is given (ours
    is), even with its ``gunicorn.access`` logger silenced: about 3% of a worker's time per review
    (issue 28, py-spy on the null webhook).
    """

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        return None


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
) -> dict[str, Any]:
    """The gunicorn settings ``gpugate serve`` runs with, in one place.

    keepalive 75 s: the API server's Go client keeps idle connections for 90 s; closing them a
    little earlier than the client does avoids a request racing a server-side close, and keeps
    TLS handshakes rare under steady load. graceful_timeout 20 s: a stopping worker's drain and
    in-flight requests end well inside the pod's terminationGracePeriodSeconds (manifests/webhook).
    max_requests: recycle a worker after that many requests (0: never), with 10% jitter so the
    workers do not all restart at once.
    """

    def when_ready(server: Any) -> None:
        if metrics_bind is not None:
            metrics.start_plaintext_server(*metrics_bind)
            logs.log_event(_log, "metrics listening (plaintext, /metrics only)",
                           url=f"http://{metrics_bind[0]}:{metrics_bind[1]}/metrics")

    def child_exit(server: Any, gunicorn_worker: Any) -> None:
        # Whatever way the worker ended (exit, crash, kill by the worker timeout): its live gauges
        # go, its counters stay in the sums, and its balancing slot is freed.
        metrics.mark_process_dead(gunicorn_worker.pid)
        worker.child_exit(server, gunicorn_worker)

    return {
        "bind": [bind],
        "workers": workers,
        "threads": threads,
        "worker_class": "webhook.admission.worker.AdmissionWorker",
        "worker_connections": 1000,
        "keepalive": keepalive,
        "timeout": 30,
        "graceful_timeout": graceful_timeout,
        "max_requests": max_requests,
        "max_requests_jitter": max_requests // 10,
        "certfile": str(certfile),
        "keyfile": str(keyfile),
        "ssl_context": reloader.gunicorn_hook,
        "accesslog": None,
        "logger_class": f"{__name__}.NoAccessLogLogger",
        "logconfig_dict": logs.LOGCONFIG,
        "proc_name": "gpugate",
        "worker_tmp_dir": "/dev/shm" if os.path.isdir("/dev/shm") else None,
        "when_ready": when_ready,
        "pre_fork": worker.pre_fork,
        "child_exit": child_exit,
        "preload_app": False,
        # gunicorn >= 25 opens a control socket at one fixed path per user: several servers
        # (tests, benchmarks) would fight over it, and nothing here uses it.
        "control_socket_disable": True,
    }
