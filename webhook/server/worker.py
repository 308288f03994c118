"""gunicorn's threaded worker, serving HTTP/2 with gunicorn's own code and HTTP/1.1 only once a request is whole.

HTTP/2 (what the API server speaks when the TLS handshake offers it by ALPN): the connection is
handed, once its handshake is done, to gunicorn's own HTTP/2 server (``gunicorn.http2``, the ``h2``
package) and its ``gthread`` stream loop (``ThreadWorker.handle_http2``), on a thread of its own for
the connection's life. gunicorn frames, multiplexes, flow-controls and times out the streams; its
idle timeout (``keepalive``) and per-read stream timeout bound what a connection holds.

HTTP/1.1 (health probes, ``gpugate admit``, clients without ALPN): gunicorn's ``gthread`` hands a
connection to a thread as soon as its first bytes arrive, and the thread then blocks reading the
rest with no deadline. Eight TLS connections that announced a body and stalled held every thread of
two workers (``tests/server/test_gunicorn_gaps.py`` measures it on a stock gunicorn), and with
validation failing closed that is an outage any pod can cause. The event loop (``requestloop``)
reads each HTTP/1.1 request whole under a deadline first; a pool thread then parses it with
gunicorn's parser, from memory, and runs the app.

A worker whose app fails to load never makes the master give up: gunicorn halts the whole server
when a worker fails to boot, so the exception is logged and the worker exits with an ordinary
failure after a pause, and the master starts another one.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import selectors
import ssl
import sys
import threading
import time
from collections import Counter
from typing import Any

from gunicorn import http
from gunicorn.http.errors import NoMoreData
from gunicorn.http2.errors import HTTP2ConnectionError, HTTP2ProtocolError

from webhook import logs
from webhook.server import metrics
from webhook.server.connection import Conn, Phase
from webhook.server.requestloop import RequestLoop

_log = logging.getLogger(logs.SERVER_LOGGER)

DRAINING_KEY = "gpugate.draining"
"""WSGI environ key: True once this worker has been told to stop (``/readyz`` then answers 503)."""
H2_CONNECTIONS = 128
"""HTTP/2 connections one worker serves at once, each on a thread of its own (gunicorn serves a
connection's streams on one thread): an idle thread blocked in a read costs a few KB, and the cap
bounds what a flood of connections can hold."""
H2_PER_SOURCE = 96
"""HTTP/2 connections one source address may hold in one worker. The API server opens one more each
time its calls in flight pass the stream limit (8 per connection): 256 concurrent creates need about
32 per webhook. A pod opening hundreds is refused here, and the API server keeps room beside it."""


class AdmissionWorker(RequestLoop):
    """The loop's whole HTTP/1.1 requests answered on the thread pool; HTTP/2 connections by gunicorn."""

    wsgi: Any  # the app; set by gunicorn's load_wsgi

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h2_sources: Counter[str] = Counter()
        self.h2_conns: set[Conn] = set()
        self.h2_wake = os.pipe()
        """Written once when the worker stops; every HTTP/2 connection's idle read watches it."""

    def load_wsgi(self) -> None:
        try:
            super().load_wsgi()
        except Exception:
            # gunicorn would halt the whole server ("Worker failed to boot"); one worker's bad boot
            # must instead cost only that worker. The pause keeps a persistent failure from spinning.
            _log.exception("worker could not load the app; exiting so the master starts another",
                           extra={"fields": {"pid": os.getpid()}})
            time.sleep(1.0)
            sys.exit(1)
        inner = self.wsgi

        def app(environ: dict[str, Any], start_response: Any) -> Any:
            environ[DRAINING_KEY] = not self.alive
            return inner(environ, start_response)

        self.wsgi = app

    # --- HTTP/2 --------------------------------------------------------------------------------
    def _take_h2(self, conn: Conn) -> None:
        """A connection whose handshake chose ``h2``: gunicorn's HTTP/2 server takes it, on a thread."""
        source = str(conn.client[0]) if isinstance(conn.client, tuple) else str(conn.client)
        if len(self.h2_conns) >= H2_CONNECTIONS or self.h2_sources[source] >= H2_PER_SOURCE:
            metrics.CONNECTIONS_REFUSED.labels("h2_limit").inc()
            self._close(conn)
            return
        metrics.HTTP2_CONNECTIONS.inc()
        self._unwatch(conn)
        self._clear_deadline(conn)
        conn.phase = Phase.BUSY
        conn.is_http2 = True
        self.h2_conns.add(conn)
        self.h2_sources[source] += 1
        conn.h2_source = source
        # A daemon thread, not the pool: a connection lives long, and Ctrl-C (SIGINT to every process)
        # must not wait for one blocked in a read.
        threading.Thread(target=self._serve_h2, args=(conn,), name="h2", daemon=True).start()

    def _serve_h2(self, conn: Conn) -> None:  # its own thread
        try:
            conn.sock.setblocking(True)
            wakeable = _WakeableSocket(conn.sock, self.h2_wake)
            conn.parser = http.get_parser(self.cfg, wakeable, conn.client, http2_connection=True)
            conn.parser.initiate_connection()
            self._streams(conn, conn.parser)
        except (NoMoreData, HTTP2ConnectionError, HTTP2ProtocolError, ssl.SSLError, OSError) as err:
            self.log.debug("HTTP/2 connection ended: %s", err)
        except Exception:
            self.log.exception("HTTP/2 connection failed")
        finally:
            self.method_queue.defer(self._h2_done, conn)

    def _streams(self, conn: Conn, h2: Any) -> None:  # its own thread
        """gunicorn's stream loop (``handle_http2``), ending with GOAWAY when the worker stops.

        gunicorn's own loop, once the worker stops, reads the socket with ``receive_data(b"")``, which
        marks the connection closed by the peer, and so never sends the GOAWAY it means to: the API
        server then writes its next call into a connection about to close and gets "unexpected EOF"
        (500, and a refused pod with validation failing closed). Here GOAWAY names the last stream
        answered, and Go's client sends anything after it again on a new connection. A connection
        opened while the worker drains is kept while it is busy (the single server of a restart
        still answers) and goes away once idle or when the drain ends.
        """
        last = 0
        while not h2.is_closed:
            for request in h2.receive_data():
                self._serve_http2_stream(request, conn, h2)
                last = request.stream.stream_id
            if conn.h2_goaway and not h2.is_closed:
                h2.close(last_stream_id=last)

    def _h2_done(self, conn: Conn) -> None:  # back on the loop
        self.h2_conns.discard(conn)
        source = getattr(conn, "h2_source", "")
        self.h2_sources[source] -= 1
        if self.h2_sources[source] <= 0:
            del self.h2_sources[source]
        # FIN, then read until the peer closes: closing with its last frames unread would reset the
        # connection, and a reset can drop the answer the client has not read yet (its "unexpected EOF").
        self._close_gracefully(conn)

    def _drain_h2(self) -> None:
        """The worker stops: every HTTP/2 connection open now ends with GOAWAY (naming the last stream
        served) after the stream it is answering, or at once when idle, so the API server sends its
        next call on a new connection, to a server that is not stopping."""
        for conn in self.h2_conns:
            conn.h2_goaway = True
        try:
            os.write(self.h2_wake[1], b"x")
        except OSError:
            pass

    def _stop_h2(self) -> None:
        """The drain is over: the connections opened during it go away too, after their current stream
        (an idle one within ``WAKE_GRACE_SECONDS``: its reads are woken already)."""
        for conn in self.h2_conns:
            conn.h2_goaway = True

    # --- HTTP/1.1 -------------------------------------------------------------------------------
    def _take(self, conn: Conn, data: bytes, body_start: int) -> None:
        """Hand one whole request to a thread; the loop stops watching the socket meanwhile."""
        self._unwatch(conn)
        self._clear_deadline(conn)
        conn.phase = Phase.BUSY
        conn.parser = http.get_parser(self.cfg, iter([data]), conn.client)
        self.enqueue_req(conn)

    def handle(self, conn: Conn) -> bool:  # runs in a pool thread
        req = None
        try:
            # The request is in memory; only the answer touches the socket, bounded by the timeout.
            conn.sock.settimeout(self.settings.request_timeout)
            req = next(conn.parser)
            if not req:
                return False
            return bool(self._keepalive_after(conn, self.handle_request(req, conn)))
        except (NoMoreData, StopIteration):
            return False
        except ssl.SSLError as err:
            self.log.debug("TLS error while answering: %s", err)
        except OSError as err:
            if err.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, None):
                self.log.exception("socket error while answering")
        except Exception as err:  # gunicorn's parser refused the request: it answers 400 itself
            self.handle_error(req, conn.sock, conn.client, err)
        return False

    def finish_request(self, conn: Conn, fs: Any) -> None:  # back on the loop
        try:
            keep = bool(fs.result()) and not fs.cancelled()
        except Exception:
            keep = False
        if conn not in self.conns:
            return
        if not keep:
            self._close_gracefully(conn)
            return
        try:
            conn.sock.setblocking(False)
        except OSError:
            self._close(conn)
            return
        self._resume(conn)
        self._watch(conn, selectors.EVENT_READ)
        if conn.buffer:  # the client sent its next request behind the last one
            conn.phase = Phase.READING
            self._set_deadline(conn, time.monotonic() + self.settings.request_timeout)
            self._examine(conn)
        elif isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending():
            self._read(conn)


WAKE_GRACE_SECONDS = 0.5
"""Once the worker stops, how long a read still waits for bytes before the connection goes away."""


class _WakeableSocket:
    """The TLS socket as gunicorn's HTTP/2 connection reads it: a read that waits for the peer also
    watches ``wake``, and once it is written the read times out as an idle connection's does, so
    gunicorn closes the connection with GOAWAY. A read with TLS data already buffered is not delayed."""

    def __init__(self, sock: ssl.SSLSocket, wake: tuple[int, int]) -> None:
        self._sock = sock
        self._wake = wake[0]
        self._timeout: float | None = None

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout
        self._sock.settimeout(timeout)

    def recv(self, size: int) -> bytes:
        if not self._sock.pending():
            ready, _, _ = select.select([self._sock, self._wake], [], [], self._timeout)
            if ready and self._sock not in ready:  # woken: bytes on their way (a body) still get a moment
                ready, _, _ = select.select([self._sock], [], [], WAKE_GRACE_SECONDS)
            if not ready:
                raise TimeoutError("idle, or the worker stops")
        return self._sock.recv(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

