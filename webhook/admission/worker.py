"""gunicorn's threaded worker, except that a thread only ever sees a request that arrived whole.

Why a worker of our own: gunicorn's ``gthread`` worker hands a connection to a thread
once its first bytes arrive, and the thread then blocks reading the rest. A client that sends
headers announcing a body and then stalls holds that thread; eight of them held every thread of
two workers, and ``/healthz`` and every admission timed out while they stayed. The webhook port
is open to every pod of the cluster, and validation runs with ``failurePolicy: Ignore``, so that
was a way for any pod to switch the deny rules off.

The event loop (``requestloop``) reads each request whole, under a deadline. Then, to keep the CPU per review low:

- the API server's admission calls (``leanpath``: ``POST /mutate|/validate`` over HTTP/1.1 with a
  ``Content-Length``) go to the app's lean routes (body in, status and JSON out), without gunicorn's
  parser, WSGI or Flask's request objects. The loop runs them itself when they do no I/O (two
  thread wake-ups less per review) and a pool thread otherwise;
- every other request goes to the thread pool, which parses it from memory with gunicorn's own
  parser, runs the Flask app and writes the answer in one write (bounded by the request timeout).

A worker whose app fails to load never makes the master give up: gunicorn halts the whole server
when a worker fails to boot, so the exception is logged and the worker exits with an ordinary
failure after a pause, and the master starts another one.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import ssl
import sys
import time
from email.utils import formatdate
from typing import Any

from gunicorn import http
from gunicorn.http.errors import NoMoreData

from webhook import logs
from webhook.admission import leanpath
from webhook.admission.connection import Conn, ConnCallback, Phase, send_without_blocking
from webhook.admission.requestloop import RequestLoop

_log = logging.getLogger(logs.SERVER_LOGGER)

DRAINING_KEY = "gpugate.draining"
"""WSGI environ key: True once this worker has been told to stop (``/readyz`` then answers 503)."""
LEAN_ROUTES = "gpugate.lean_routes"
"""Key of the app's ``extensions``: a ``leanpath.LeanRoutes``, the routes the lean path serves."""


class AdmissionWorker(RequestLoop):
    """The loop's whole requests answered: lean admission calls inline, the rest on the thread pool."""

    wsgi: Any  # the app; set by gunicorn's load_wsgi

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lean_routes: dict[str, leanpath.LeanRoute] = {}
        self.lean_inline = False

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
        lean = getattr(inner, "extensions", {}).get(LEAN_ROUTES)
        if isinstance(lean, leanpath.LeanRoutes):
            self.lean_routes, self.lean_inline = dict(lean.routes), lean.inline

        def app(environ: dict[str, Any], start_response: Any) -> Any:
            environ[DRAINING_KEY] = not self.alive
            return inner(environ, start_response)

        self.wsgi = app

    def _take(self, conn: Conn, data: bytes, body_start: int) -> None:
        request = (leanpath.lean_request(data, body_start, self.lean_routes)
                   if body_start > 0 and self.lean_routes else None)
        if request is not None and self.lean_inline:
            self._answer_inline(conn, request)
        else:
            self._run(conn, data, request)

    def _answer_inline(self, conn: Conn, request: leanpath.LeanRequest) -> None:
        """Answer a lean request on the loop's own thread (routes that do no I/O, ``lean_inline``).

        Handing a request to a pool thread costs two thread wake-ups per review, and on a loaded
        machine each is a wait for a core; the GIL runs one thread at a time anyway. The
        answer goes out without blocking; should the socket not take it whole (a client that does not
        read), a pool thread sends it under the request timeout, as it sends every other answer.
        """
        answered = self._lean_answer(request)
        if answered is None:  # the route failed: the full path answers, on a thread
            self._run(conn, request.raw, None)
            return
        data, keep = answered
        sent = send_without_blocking(conn, data)
        if sent is None:
            self._close(conn)
            return
        if sent < len(data):
            self._run(conn, b"", None, unsent=(data[sent:], keep))
            return
        if not keep:
            self._close_gracefully(conn)
            return
        conn.last_activity = time.monotonic()
        if conn.buffer:  # the next request is already here (pipelined)
            self._set_deadline(conn, time.monotonic() + self.settings.request_timeout)
        else:
            conn.phase = Phase.IDLE
            self._set_deadline(conn, time.monotonic() + self.cfg.keepalive)

    def _run(self, conn: Conn, data: bytes, lean: leanpath.LeanRequest | None,
             unsent: tuple[bytes, bool] | None = None) -> None:
        """Hand one whole request (or the rest of an answer, ``unsent``) to a thread; the loop stops
        watching the socket meanwhile."""
        self._unwatch(conn)
        self._clear_deadline(conn)
        conn.phase = Phase.BUSY
        conn.lean, conn.unsent = lean, unsent
        if lean is None and unsent is None:
            conn.parser = http.get_parser(self.cfg, iter([data]), conn.client)
        conn.request_id += 1
        conn.rearmed = False
        self.enqueue_req(conn)

    def enqueue_req(self, conn: Conn) -> None:
        request_id = conn.request_id
        done = self.tpool.submit(self.handle, conn)
        done.add_done_callback(lambda fs: self.method_queue.defer(self.finish_request, conn, fs, request_id))

    def handle(self, conn: Conn) -> bool:  # runs in a pool thread
        req = None
        try:
            # The request is in memory; only the answer touches the socket, bounded by the timeout.
            conn.sock.settimeout(self.settings.request_timeout)
            if conn.unsent is not None or conn.lean is not None:
                keep = self._answer_lean(conn)
                if keep is not None:
                    if keep and not conn.buffer:
                        self._rearm(conn)
                    return keep
            req = next(conn.parser)
            if not req:
                return False
            keep = bool(self._keepalive_after(conn, self._answer_in_one_write(req, conn)))
            if keep and not conn.buffer:
                self._rearm(conn)
            return keep
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

    def _answer_lean(self, conn: Conn) -> bool | None:  # runs in a pool thread
        """Send a lean request's answer (or the rest of one the loop could not send without blocking);
        whether the connection stays open. None: the route failed and the full path answers."""
        if conn.unsent is not None:
            (data, keep), conn.unsent = conn.unsent, None
        else:
            assert conn.lean is not None
            request, conn.lean = conn.lean, None
            answered = self._lean_answer(request)
            if answered is None:
                conn.parser = http.get_parser(self.cfg, iter([request.raw]), conn.client)
                return None
            data, keep = answered
        conn.sock.sendall(data)
        return keep

    def _lean_answer(self, request: leanpath.LeanRequest) -> tuple[bytes, bool] | None:
        """The answer's bytes through the route's function, without gunicorn's parser, WSGI or Flask
        (``leanpath``), and whether the connection stays open; None if the function failed (a bug)."""
        try:
            status, body = self.lean_routes[request.path](request.body)
        except Exception:
            self.log.exception("lean path failed; answering through the full path")
            return None
        # What gunicorn's handle_request decides about the connection, for the same request.
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.alive = False
        close = request.closes or not self.alive or not self.cfg.keepalive
        return leanpath.answer(status, body, close=close, date=formatdate(usegmt=True)), not close

    def _answer_in_one_write(self, req: Any, conn: Conn) -> bool:
        """gunicorn's handle_request, with the whole answer sent in one write (one TLS record).

        gunicorn writes the status line and headers, then the body, each with its own ``sendall``:
        two TLS records, two wake-ups of the client (which reads the headers, then waits again for
        the body), and two trips through the kernel's loopback or network path per answer.
        """
        real = conn.sock
        buffered = _AnswerBuffer(real)
        conn.sock = buffered
        try:
            return bool(self.handle_request(req, conn))
        finally:
            conn.sock = real
            buffered.flush()

    def _rearm(self, conn: Conn) -> None:  # runs in the pool thread, after the answer is sent
        """Put the answered connection back in the poller from the thread that answered it.

        Left to the loop, the socket was watched again only once the loop had woken up for the
        finished request: on a busy machine the API server's next call (validate right after mutate,
        on the same kept-alive connection) waited for that wake-up too. The thread no
        longer touches the socket; the loop's own bookkeeping (``_resume``) runs on whichever comes
        first, the next request's bytes or the finished-request callback.
        """
        try:
            conn.sock.setblocking(False)
            conn.rearmed = True
            self.poller.register(conn.sock, selectors.EVENT_READ, ConnCallback(self, conn))
        except (OSError, KeyError, ValueError):
            conn.rearmed = False  # the loop's finish_request watches it as before

    def finish_request(self, conn: Conn, fs: Any, request_id: int | None = None) -> None:  # back on the loop
        try:
            keep = bool(fs.result()) and not fs.cancelled()
        except Exception:
            keep = False
        if conn not in self.conns:
            return
        if request_id is not None and (request_id != conn.request_id or conn.phase is not Phase.BUSY):
            return  # the next request's bytes came first and resumed the connection already
        if not keep:
            if conn.rearmed:
                self._unwatch(conn)
                conn.rearmed = False
            self._close_gracefully(conn)
            return
        if conn.rearmed:
            self._resume(conn)
        else:
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


class _AnswerBuffer:
    """Stands in for a connection's socket while gunicorn writes an answer: writes are kept, then
    sent together by ``flush``. Everything else goes to the real socket."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._parts: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self._parts.append(bytes(data))

    def send(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        """Send what was written, in one ``sendall`` (the socket's timeout bounds it)."""
        if self._parts:
            data, self._parts = b"".join(self._parts), []
            self._sock.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)
