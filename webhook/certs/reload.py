"""The serving certificate, reloaded while the server runs: one TLS context per process, replaced when the files change.

Used by the admission webhook (gunicorn's ``ssl_context`` server hook) and the balancer's
scheduler extender alike, so neither drags the other's dependencies in. Built on
``filewatch.LastGood``: at most once per ``interval`` a digest of the certificate and key files
is compared; when they changed and form a valid pair, a new context is built and swapped in.
Connections already open (and requests in flight on them) keep the context they were made
with, and new handshakes present the new certificate. A half-written or mismatched pair (the
files are replaced one at a time) is refused and the old context keeps serving until the pair
is whole.

TLS 1.2 is the floor; TLS 1.2 ciphers are limited to ECDHE with AEAD (TLS 1.3 suites are
OpenSSL's defaults, all AEAD).
"""

from __future__ import annotations

import hashlib
import logging
import os
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from webhook import filewatch, logs

_log = logging.getLogger(logs.SERVER_LOGGER)

TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def build_context(certfile: Path, keyfile: Path, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
    """A server-side SSLContext: TLS 1.2 or newer, forward-secret AEAD ciphers only; ``alpn``: the
    protocols offered by ALPN, preferred first (the admission server offers ``h2`` and ``http/1.1``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if alpn:
        context.set_alpn_protocols(list(alpn))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    context.load_cert_chain(certfile=str(certfile), keyfile=str(keyfile))
    return context


def files_digest(certfile: Path, keyfile: Path) -> str:
    """sha256 over the certificate and key files, in that order."""
    digest = hashlib.sha256()
    for path in (certfile, keyfile):
        digest.update(Path(path).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


class CertReloader:
    """One SSLContext per process, replaced when the certificate files change."""

    def __init__(self, certfile: Path, keyfile: Path, *, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, alpn: tuple[str, ...] = ()) -> None:
        self.certfile, self.keyfile = Path(certfile), Path(keyfile)
        self.alpn = alpn
        self.interval = interval
        self.reloads = 0
        self._watch = filewatch.LastGood(
            fingerprint=lambda: files_digest(self.certfile, self.keyfile),
            load=lambda: build_context(self.certfile, self.keyfile, self.alpn), initial=None,
            refuse=(ssl.SSLError, OSError), interval=interval, clock=clock,
            on_loaded=self._reloaded, on_refused=self._refused, on_unreadable=self._unreadable)
        # Loaded eagerly: a bad pair at start-up is the operator's error, reported before serving.
        digest = files_digest(self.certfile, self.keyfile)
        self._watch.adopt(build_context(self.certfile, self.keyfile, self.alpn), digest)

    def context(self) -> ssl.SSLContext:
        """The context for a new connection; checks the files when the interval has passed."""
        context = self._watch.poll()
        assert context is not None
        return context

    def _reloaded(self, context: ssl.SSLContext | None, previous: ssl.SSLContext | None) -> None:
        self.reloads += 1
        logs.log_event(_log, "certificate reloaded", certfile=str(self.certfile), pid=os.getpid())

    def _refused(self, error: str) -> None:
        logs.log_event(_log, "new certificate refused; keeping the current one", logging.ERROR,
                       certfile=str(self.certfile), keyfile=str(self.keyfile), error=error)

    def _unreadable(self, err: OSError) -> None:  # a file missing for a moment during a replace
        logs.log_event(_log, "certificate files unreadable; keeping the current certificate",
                       logging.WARNING, certfile=str(self.certfile), error=str(err))

    def gunicorn_hook(self, conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        """The ``ssl_context`` server hook: ignore the per-connection factory, use ours."""
        return self.context()
