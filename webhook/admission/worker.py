"""gunicorn's threaded worker, except that a thread only ever sees a request that arrived whole.

Why a worker of our own (issue 12): gunicorn's ``gthread`` worker hands a connection to a thread
once its first bytes arrive, and the thread then blocks reading the rest. A client that sends
headers announcing a body and then stalls holds that thread; eight of them held every thread of
two workers, and ``/healthz`` and every admission timed out while they stayed. The webhook port
is open to every pod of the cluster, and validation runs with ``failurePolicy: Ignore``, so that
was a way for any pod to switch the deny rules off.

Here the event loop does the TLS handshake and reads each request without blocking, under one
deadline per request (``WorkerSettings.request_timeout``, from the connection's first byte, or
from the first byte of a request on a kept-alive connection, to the request's last byte). Only a
complete request goes to the thread pool, which parses it from memory with gunicorn's own parser,
runs the app and writes the answer (itself bounded by the same timeout). A client that stalls
costs a socket and its buffer until its deadline, then gets 408; a body over the limit gets 413
and a header block over the limit 431, answered by the loop without a thread. gunicorn's master,
signals, reloads and worker timeouts are unchanged.

The loop also:

- spreads connections over the workers: the API server keeps connections alive, and with one
  shared listening socket the kernel often gave most of them to one worker while the other idled.
  Each worker publishes its open-connection count in a table shared by all workers (made by the
  master before it forks), and accepts only while it has no more connections than the least
  loaded live worker; the others take the rest.
- drains on SIGTERM (gunicorn's graceful stop, also how HUP retires old workers): the app is told
  (``environ["gpugate.draining"]``) so ``/readyz`` answers 503 at once; for ``drain_seconds`` the
  worker keeps accepting and answering, each answer with ``Connection: close`` so every client
  closes between requests, never in the middle of one; then it stops accepting, closes idle
  connections, finishes what is in flight, and exits.
- never makes the master give up: gunicorn halts the whole server when a worker fails to boot,
  so an exception while this worker loads the app is logged and the worker exits with an ordinary
  failure after a pause, and the master starts another one.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import json
import logging
import mmap
import os
import re
import selectors
import socket
import ssl
import struct
import sys
import time
from dataclasses import dataclass
from email.utils import formatdate
from enum import Enum
from typing import Any

from gunicorn import http
from gunicorn import sock as gunicorn_sock
from gunicorn.http.errors import NoMoreData
from gunicorn.workers.gthread import TConn, ThreadWorker

from webhook import logs
from webhook.admission import framing, leanpath, metrics

_log = logging.getLogger(logs.SERVER_LOGGER)

DRAINING_KEY = "gpugate.draining"
"""WSGI environ key: True once this worker has been told to stop (``/readyz`` then answers 503)."""
LEAN_ROUTES = "gpugate.lean_routes"
"""Key of the app's ``extensions``: path -> ``leanpath.LeanRoute``, the routes the lean path serves."""
READ_CHUNK = 65536
_EXPECT_CONTINUE = re.compile(rb"\r\nexpect:[ \t]*100-continue[ \t]*(?=\r\n)", re.IGNORECASE)
MAX_READ_PER_EVENT = 1024 * 1024
IDLE_LINGER_SECONDS = 0.5
HEARTBEAT_SECONDS = 1.0
"""At most one heartbeat to the arbiter per second (its timeout is 30 s)."""
ACCEPT_RECHECK_SECONDS = 0.02
"""While a worker leaves new connections to a less loaded sibling, how often it looks at the
connection table again. Before issue 28 the pause was set once and then lay in the past, so the
loop polled with a zero timeout: a worker holding one kept-alive connection more than its sibling
burnt a whole core, and on the API server's kept-alive connections that was nearly always one of
the two workers (3.5 ms of CPU per admission instead of under 1 ms)."""


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    request_timeout: float = 5.0
    """Seconds a client has, from its first byte, to deliver a whole request (TLS handshake included on a
    new connection) and then to take the answer. The API server sends a review in one write; a client
    this slow is broken or hostile."""
    drain_seconds: float = 3.0
    """After SIGTERM, how long the worker keeps answering (with Connection: close) before it stops
    accepting: clients whose next request is already on its way are answered, not reset."""
    max_body_bytes: int = 3 * 1024 * 1024
    """Larger bodies get 413 from the loop, without being buffered (an object in etcd is at most ~1.5 MiB)."""
    max_header_bytes: int = 64 * 1024
    """A larger header block gets 431."""
    discard_limit_bytes: int = 16 * 1024 * 1024
    """How much of an over-limit body is read and dropped so the client sees its 413 (instead of a
    reset from unread data); a client streaming more is cut off."""


# --- process-wide state: set by the master before it forks, inherited by every worker ---------
_settings = WorkerSettings()
_table: ConnectionTable | None = None


def configure(settings: WorkerSettings, *, max_workers: int = 64) -> None:
    """Called once in the master, before gunicorn forks: the settings and the shared table."""
    global _settings, _table
    _settings = settings
    _table = ConnectionTable(max_workers * 4)  # HUP briefly runs old and new workers side by side


class ConnectionTable:
    """Open connections per worker, in anonymous shared memory, so workers can balance without talking.

    Slots are (pid, connections, draining) int64 triples. The master assigns a slot before each fork and
    frees it when the worker exits; a worker writes only its own slot. Reads race with writes, which is
    fine for a balancing heuristic (aligned 8-byte stores are atomic on the platforms gunicorn runs on).
    """

    _SLOT = struct.Struct("qqq")

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._memory = mmap.mmap(-1, self._SLOT.size * slots)

    def assign(self, pid_placeholder: int = -1) -> int:
        for index in range(self.slots):
            pid, _, _ = self._read(index)
            if pid == 0:
                self._write(index, pid_placeholder, 0, 0)
                return index
        raise RuntimeError("no free worker slot in the connection table")

    def claim(self, index: int, pid: int) -> None:
        self._write(index, pid, 0, 0)

    def release_pid(self, pid: int) -> None:
        for index in range(self.slots):
            if self._read(index)[0] == pid:
                self._write(index, 0, 0, 0)

    def publish(self, index: int, pid: int, count: int, *, draining: bool) -> None:
        self._write(index, pid, count, int(draining))

    def others(self, index: int) -> list[int]:
        """Connection counts of the other live workers that are not draining."""
        out = []
        for other in range(self.slots):
            pid, count, draining = self._read(other)
            if other != index and pid > 0 and not draining:
                out.append(count)
        return out

    def _read(self, index: int) -> tuple[int, int, int]:
        pid, count, draining = self._SLOT.unpack_from(self._memory, index * self._SLOT.size)
        return pid, count, draining

    def _write(self, index: int, pid: int, count: int, draining: int) -> None:
        self._SLOT.pack_into(self._memory, index * self._SLOT.size, pid, count, draining)


def pre_fork(server: Any, worker: Any) -> None:
    """gunicorn hook (master): give the worker about to be forked a slot of the table."""
    if _table is not None:
        worker.gpugate_slot = _table.assign()


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook (master): free the slot of a worker that exited, however it exited."""
    if _table is not None:
        _table.release_pid(worker.pid)


class Phase(Enum):
    HANDSHAKE = "handshake"
    READING = "reading"
    IDLE = "idle"          # kept alive, waiting for the next request
    BUSY = "busy"          # a thread has the request
    DISCARDING = "discarding"  # answered 413; reading and dropping the rest of the body
    CLOSING = "closing"    # FIN sent; waiting for the peer's, so unread bytes do not turn into a reset


class Conn(TConn):
    """One client connection and what the loop knows about it."""

    def __init__(self, cfg: Any, sock: Any, client: Any, server: Any) -> None:
        super().__init__(cfg, sock, client, server)
        self.buffer = bytearray()
        self.phase = Phase.HANDSHAKE
        self.deadline = 0.0
        self.continue_sent = False
        self.discard_left = 0
        self.last_activity = time.monotonic()
        self.events = 0
        self.generation = 0   # bumped whenever the deadline changes, so stale heap entries are skipped
        self.request_id = 0   # bumped for each request handed to a thread
        self.rearmed = False  # the thread that answered has put the socket back in the poller
        self.lean: leanpath.LeanRequest | None = None  # the request, when it takes the lean path
        self.unsent: tuple[bytes, bool] | None = None  # an answer the loop could not send whole; keep-alive


class AdmissionWorker(ThreadWorker):
    """gthread with whole-request reads in the loop, balanced accepts and a drain on SIGTERM."""

    wsgi: Any  # the app; set by gunicorn's load_wsgi
    alive: bool  # gunicorn sets it; False once the worker is told to stop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = _settings
        self.conns: set[Conn] = set()
        self._deadlines: list[tuple[float, int, int, Conn]] = []
        self._tiebreak = itertools.count()
        self._accept_paused_until = 0.0
        self.slot: int | None = None
        self.lean_routes: dict[str, leanpath.LeanRoute] = {}
        self.lean_inline = False

    # --- boot --------------------------------------------------------------------------------
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

    def init_process(self) -> None:
        self.slot = getattr(self, "gpugate_slot", None)  # given by pre_fork in the master
        if _table is not None and self.slot is not None:
            _table.claim(self.slot, os.getpid())
        super().init_process()

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        self.poller.register(self.method_queue.fileno(), selectors.EVENT_READ, self.method_queue.run_callbacks)
        self.set_accept_enabled(True)
        beat = 0.0
        while self.alive:
            now = time.monotonic()
            if now - beat >= HEARTBEAT_SECONDS:
                # The arbiter only needs a sign of life within its timeout (30 s); gunicorn's own
                # loop sends one per turn, a file-metadata syscall for every burst of requests.
                self.notify()
                beat = now
            self._balance()
            self._dispatch(self._timeout())
            if not self.is_parent_alive():
                break
            self._expire()
        self._drain()

    def _dispatch(self, timeout: float) -> None:
        try:
            events = self.poller.select(timeout)
        except OSError as err:
            if err.errno != errno.EINTR:
                raise
            return
        for key, mask in events:
            callback = key.data
            if isinstance(callback, _ConnCallback):
                callback.conn.events = mask
                callback(key.fileobj)
            else:
                callback(key.fileobj)

    def _timeout(self) -> float:
        timeout = 1.0
        if self._deadlines:
            timeout = min(timeout, max(self._deadlines[0][0] - time.monotonic(), 0.0))
        if not self._accepting and self.alive and self._accept_paused_until:
            timeout = min(timeout, max(self._accept_paused_until - time.monotonic(), 0.0))
        return timeout

    # --- accepting, balanced -----------------------------------------------------------------
    def _publish(self) -> None:
        if _table is not None and self.slot is not None:
            _table.publish(self.slot, os.getpid(), self.nr_conns, draining=not self.alive)

    def _siblings(self) -> list[int] | None:
        """Open connections of each live sibling that is not draining (None without a table)."""
        if _table is None or self.slot is None:
            return None
        return _table.others(self.slot)

    def _may_accept(self) -> bool:
        if self.nr_conns >= self.worker_connections:
            return False
        others = self._siblings()
        if not self.alive:
            # Draining: a sibling that is not stopping takes new clients (a HUP's new workers, the
            # other worker of a single TERM); only a whole-server stop keeps answering them here.
            return not others
        return not others or self.nr_conns <= min(others)

    def _balance(self) -> None:
        wanted = self._may_accept()
        if not wanted:
            now = time.monotonic()
            if now >= self._accept_paused_until:  # look again after a pause, never in a busy loop
                self._accept_paused_until = now + ACCEPT_RECHECK_SECONDS
        if wanted != self._accepting:
            self.set_accept_enabled(wanted)

    def accept(self, listener: socket.socket) -> None:
        if not self._may_accept():
            self._accept_paused_until = time.monotonic() + ACCEPT_RECHECK_SECONDS
            self.set_accept_enabled(False)
            return
        try:
            sock, client = listener.accept()
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                return
            raise
        sock.setblocking(False)
        now = time.monotonic()
        if self.cfg.is_ssl:
            context = gunicorn_sock.ssl_context(self.cfg)
            sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False,
                                       suppress_ragged_eofs=True)
        conn = Conn(self.cfg, sock, client, listener.getsockname())
        metrics.CONNECTIONS.inc()
        self.nr_conns += 1
        self.conns.add(conn)
        self._publish()
        self._set_deadline(conn, now + self.settings.request_timeout)
        self.poller.register(conn.sock, selectors.EVENT_READ, _ConnCallback(self, conn))
        if self.cfg.is_ssl:
            self._handshake(conn)
        else:
            conn.initialized = True
            conn.phase = Phase.IDLE
            self._set_deadline(conn, now + self.cfg.keepalive)

    # --- per-connection state machine --------------------------------------------------------
    def on_event(self, conn: Conn) -> None:
        if conn.phase is Phase.BUSY:
            if not conn.rearmed:
                return
            self._resume(conn)  # the next request came before the loop heard the last one was answered
        if conn.phase is Phase.HANDSHAKE:
            self._handshake(conn)
        elif conn.phase in (Phase.READING, Phase.IDLE, Phase.DISCARDING, Phase.CLOSING):
            self._read(conn)

    def _watch(self, conn: Conn, events: int) -> None:
        # Registered or not is looked up, not found out from modify's KeyError: its message formats
        # the socket's repr, a getsockname and getpeername per request (issue 28).
        if conn.sock.fileno() in self.poller.get_map():
            self.poller.modify(conn.sock, events, _ConnCallback(self, conn))
        else:
            self.poller.register(conn.sock, events, _ConnCallback(self, conn))

    def _unwatch(self, conn: Conn) -> None:
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass

    def _handshake(self, conn: Conn) -> None:
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
            return
        except (ssl.SSLError, OSError):
            self._close(conn)
            return
        conn.initialized = True
        conn.last_activity = time.monotonic()
        # Connected: the request deadline starts with the request's first byte, like on a kept-alive
        # connection. An idle connection costs a socket, never a thread.
        conn.phase = Phase.IDLE
        self._set_deadline(conn, time.monotonic() + self.cfg.keepalive)
        self._watch(conn, selectors.EVENT_READ)
        self._read(conn)

    def _read(self, conn: Conn) -> None:
        received = 0
        while received < MAX_READ_PER_EVENT:
            try:
                chunk = conn.sock.recv(READ_CHUNK)
            except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                break
            except ssl.SSLWantWriteError:
                self._watch(conn, selectors.EVENT_WRITE)
                return
            except (ssl.SSLError, OSError):
                self._close(conn)
                return
            if not chunk:
                self._close(conn)
                return
            received += len(chunk)
            if conn.phase is Phase.CLOSING:
                continue
            if conn.phase is Phase.DISCARDING:
                conn.discard_left -= len(chunk)
                if conn.discard_left <= 0:
                    self._close_gracefully(conn)
                    return
                continue
            if conn.phase is Phase.IDLE:
                conn.phase = Phase.READING
                self._set_deadline(conn, time.monotonic() + self.settings.request_timeout)
            conn.buffer += chunk
            if len(conn.buffer) > self.settings.max_header_bytes + self.settings.max_body_bytes + READ_CHUNK:
                break
        if conn.phase is Phase.READING:
            self._examine(conn)

    def _examine(self, conn: Conn) -> None:
        """Act on what the buffer holds: wait for more, answer, or refuse. Requests the loop answers
        itself (``_answer_inline``) are taken one after another, so pipelined ones need no recursion."""
        while conn.phase is Phase.READING:
            found = framing.frame(conn.buffer, max_header_bytes=self.settings.max_header_bytes,
                                  max_body_bytes=self.settings.max_body_bytes)
            if found.state is framing.State.INCOMPLETE:
                if found.expects_continue and not conn.continue_sent:
                    conn.continue_sent = True
                    self._send_now(conn, b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            if found.state in (framing.State.COMPLETE, framing.State.MALFORMED):
                data = bytes(conn.buffer[:found.end])
                del conn.buffer[:found.end]
                if conn.continue_sent:  # answered already: the parser must not send a second 100
                    data = _EXPECT_CONTINUE.sub(b"", data, count=1)
                conn.continue_sent = False
                body_start = found.body_start if found.state is framing.State.COMPLETE else -1
                request = (leanpath.lean_request(data, body_start, self.lean_routes)
                           if body_start > 0 and self.lean_routes else None)
                if request is not None and self.lean_inline:
                    self._answer_inline(conn, request)
                else:
                    self._run(conn, data, request)
            elif found.state is framing.State.TOO_LARGE:
                self._too_large(conn, found)
            else:
                self._refuse(conn, 431, "Request Header Fields Too Large",
                             f"the header block exceeds {self.settings.max_header_bytes} bytes")

    def _too_large(self, conn: Conn, found: framing.Framing) -> None:
        length = found.declared_length
        received = len(conn.buffer) - found.body_start
        limit = self.settings.max_body_bytes
        message = (f"body of {length} bytes exceeds the {limit}-byte limit" if length is not None
                   else f"body exceeds the {limit}-byte limit")
        left = (length - received) if length is not None else self.settings.discard_limit_bytes
        self._refuse(conn, 413, "Payload Too Large", message, discard=min(left, self.settings.discard_limit_bytes))

    def _answer_inline(self, conn: Conn, request: leanpath.LeanRequest) -> None:
        """Answer a lean request on the loop's own thread (routes that do no I/O, ``lean_inline``).

        Handing a request to a pool thread costs two thread wake-ups per review, and on a loaded
        machine each is a wait for a core (issue 28); the GIL runs one thread at a time anyway. The
        answer goes out without blocking; should the socket not take it whole (a client that does not
        read), a pool thread sends it under the request timeout, as it sends every other answer.
        """
        answered = self._lean_answer(request)
        if answered is None:  # the route failed: the full path answers, on a thread
            self._run(conn, request.raw, None)
            return
        data, keep = answered
        try:
            sent = conn.sock.send(data)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            sent = 0
        except (ssl.SSLError, OSError):
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
        the body), and two trips through the kernel's loopback or network path per answer (issue 28).
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
        on the same kept-alive connection) waited for that wake-up too (issue 28). The thread no
        longer touches the socket; the loop's own bookkeeping (``_resume``) runs on whichever comes
        first, the next request's bytes or the finished-request callback.
        """
        try:
            conn.sock.setblocking(False)
            conn.rearmed = True
            self.poller.register(conn.sock, selectors.EVENT_READ, _ConnCallback(self, conn))
        except (OSError, KeyError, ValueError):
            conn.rearmed = False  # the loop's finish_request watches it as before

    def _resume(self, conn: Conn) -> None:
        """A connection whose answer went out waits for its next request (loop bookkeeping)."""
        conn.rearmed = False
        conn.phase = Phase.IDLE
        conn.last_activity = time.monotonic()
        self._set_deadline(conn, time.monotonic() + self.cfg.keepalive)

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

    # --- answers the loop gives itself ---------------------------------------------------------
    def _refuse(self, conn: Conn, status: int, reason: str, message: str, *, discard: int = 0) -> None:
        body = json.dumps({"error": message, "code": status}).encode()
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        result = {413: "too_large", 408: "timeout", 431: "bad_request"}.get(status, "bad_request")
        endpoint = _endpoint_of(conn.buffer)
        metrics.ADMISSIONS.labels(endpoint, "", "", result).inc()
        logs.log_event(_log, "request refused", logging.WARNING, result=result, code=status, error=message,
                       endpoint=endpoint, client=_client(conn))
        self._send_now(conn, head + body)
        conn.buffer.clear()
        if discard > 0:
            conn.phase = Phase.DISCARDING
            conn.discard_left = discard
            self._set_deadline(conn, time.monotonic() + self.settings.request_timeout)
            self._watch(conn, selectors.EVENT_READ)
        else:
            self._close_gracefully(conn)

    def _send_now(self, conn: Conn, data: bytes) -> None:
        """A short answer from the loop: sent without blocking, or the connection is dropped."""
        try:
            sent = conn.sock.send(data)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            sent = 0
        except (ssl.SSLError, OSError):
            self._close(conn)
            return
        if sent < len(data):  # the client does not read: nothing more is owed to it
            self._close(conn)

    # --- deadlines -----------------------------------------------------------------------------
    def _set_deadline(self, conn: Conn, when: float) -> None:
        conn.deadline = when
        conn.generation += 1
        heapq.heappush(self._deadlines, (when, next(self._tiebreak), conn.generation, conn))

    def _clear_deadline(self, conn: Conn) -> None:
        conn.generation += 1
        conn.deadline = 0.0

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, generation, conn = heapq.heappop(self._deadlines)
            if generation != conn.generation or conn not in self.conns:
                continue
            if conn.phase is Phase.READING and conn.buffer:
                self._refuse(conn, 408, "Request Timeout",
                             f"the request did not arrive whole within {self.settings.request_timeout:g} s")
            elif conn.phase is Phase.BUSY:
                continue
            else:  # idle keep-alive, a stalled handshake, a discard or a close that took too long
                self._close(conn)

    # --- closing -------------------------------------------------------------------------------
    def _close_gracefully(self, conn: Conn) -> None:
        """Send FIN, then read until the peer closes (bounded), so unread bytes do not become a reset."""
        if conn not in self.conns:
            return
        try:
            conn.sock.setblocking(False)
            if isinstance(conn.sock, ssl.SSLSocket):
                raw = socket.socket(fileno=conn.sock.fileno())
                try:
                    raw.shutdown(socket.SHUT_WR)
                finally:
                    raw.detach()
            else:
                conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.phase = Phase.CLOSING
        self._set_deadline(conn, time.monotonic() + 2.0)
        self._watch(conn, selectors.EVENT_READ)

    def _close(self, conn: Conn) -> None:
        if conn not in self.conns:
            return
        self.conns.discard(conn)
        self._unwatch(conn)
        self._clear_deadline(conn)
        try:
            conn.sock.close()
        except OSError:
            pass
        self.nr_conns -= 1
        self._publish()

    # --- stopping ------------------------------------------------------------------------------
    def _drain(self) -> None:
        """Stop the way a client can live with: answer, then close between requests, never in one."""
        started = time.monotonic()
        self._publish()  # siblings now see this worker draining and take the new clients
        drain_end = started + self.settings.drain_seconds
        while time.monotonic() < drain_end and self.is_parent_alive():
            self.notify()
            self.set_accept_enabled(self._may_accept())
            self._dispatch(min(self._timeout(), 0.05, max(drain_end - time.monotonic(), 0.0)))
            self._expire()
        self.set_accept_enabled(False)
        if not self._siblings():
            self._accept_backlog()  # the last to stop: take what the kernel queued, then close
        for listener in self.sockets:
            try:
                listener.close()
            except OSError:
                pass
        give_up = started + self.cfg.graceful_timeout - 1.0
        while self.conns and time.monotonic() < give_up:
            self.notify()
            now = time.monotonic()
            # An idle connection is closed once it has been quiet for a moment: a client that was
            # about to send on it has done so (and is answered with Connection: close).
            for conn in [c for c in self.conns if c.phase in (Phase.IDLE, Phase.HANDSHAKE)
                         and now - c.last_activity >= IDLE_LINGER_SECONDS]:
                self._close_gracefully(conn)
            self._dispatch(min(self._timeout(), 0.05))
            self._expire()
        for conn in list(self.conns):
            self._close(conn)
        self.tpool.shutdown(wait=False)
        self.poller.close()
        self.method_queue.close()

    def _accept_backlog(self) -> None:
        for listener in self.sockets:
            for _ in range(self.worker_connections):
                before = self.nr_conns
                try:
                    listener.setblocking(False)
                    self.accept(listener)
                except OSError:
                    break
                if self.nr_conns == before:
                    break


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


class _ConnCallback:
    """The poller's data for a connection: calls back into the worker with it."""

    __slots__ = ("worker", "conn")

    def __init__(self, worker: AdmissionWorker, conn: Conn) -> None:
        self.worker, self.conn = worker, conn

    def __call__(self, _fileobj: Any) -> None:
        self.worker.on_event(self.conn)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ConnCallback) and other.conn is self.conn

    def __hash__(self) -> int:
        return id(self.conn)


def _endpoint_of(buffer: bytes | bytearray) -> str:
    line = bytes(buffer[:200]).split(b"\r\n", 1)[0].split(b" ")
    if len(line) >= 2 and line[1].lstrip(b"/") in (b"mutate", b"validate"):
        return line[1].lstrip(b"/").decode()
    return "other"


def _client(conn: Conn) -> str:
    client = conn.client
    return f"{client[0]}:{client[1]}" if isinstance(client, tuple) and len(client) >= 2 else str(client)
