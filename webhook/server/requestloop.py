"""The worker's event loop: TLS handshakes, whole HTTP/1.1 requests, balanced accepts, limits, the drain.

Each HTTP/1.1 request is read without blocking, under one deadline from its first byte to its last
(``WorkerSettings.request_timeout``); only a whole request is acted on (``_take``, in
``server.worker``), so a stalled client costs a socket until its deadline (then 408), never a thread;
413 and 431 are answered by the loop. A connection whose handshake chose HTTP/2 goes to ``_take_h2``.
The loop also balances connections over the workers (each publishes its count in ``workershared``'s
table and accepts only while it has no more than the least loaded sibling), enforces the per-worker
ceilings (connections per source address, unfinished request bytes), and drains on SIGTERM: ``/readyz``
turns 503, answers carry ``Connection: close`` for ``drain_seconds``, then idle connections close and
in-flight requests finish. docs/server.md says what each part protects and which test shows it.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import json
import logging
import os
import re
import selectors
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gunicorn import sock as gunicorn_sock
from gunicorn.workers.gthread import ThreadWorker

from webhook import logs
from webhook.server import drain, framing, metrics, workershared
from webhook.server.connection import Conn, ConnCallback, Phase, client_name, endpoint_of, send_without_blocking

_log = logging.getLogger(logs.SERVER_LOGGER)

READ_CHUNK = 65536
_EXPECT_CONTINUE = re.compile(rb"\r\nexpect:[ \t]*100-continue[ \t]*(?=\r\n)", re.IGNORECASE)
MAX_READ_PER_EVENT = 1024 * 1024
HEARTBEAT_SECONDS = 1.0
"""At most one heartbeat to the arbiter per second (its timeout is 30 s)."""
ACCEPT_RECHECK_SECONDS = 0.25
"""While a worker leaves new connections to a less loaded sibling, how often it looks at the table
again: never a busy loop, and rarely enough that an idle worker costs almost no CPU (docs/server.md)."""


class RequestLoop(ThreadWorker):
    """gthread's worker with whole-request reads in the loop, balanced accepts and a drain on SIGTERM;
    what is done with a whole request is the subclass's ``_take``."""

    alive: bool  # gunicorn sets it; False once the worker is told to stop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = workershared.settings()
        self.conns: set[Conn] = set()
        self._deadlines: list[tuple[float, int, int, Conn]] = []
        self._tiebreak = itertools.count()
        self._accept_paused_until = 0.0
        self.slot: int | None = None
        self.sources: Counter[str] = Counter()
        """Open connections per source address."""
        self.buffered = 0
        """Bytes of unfinished requests held in the connections' buffers."""

    def init_process(self) -> None:
        self.slot = getattr(self, "gpugate_slot", None)  # given by pre_fork in the master
        if (table := workershared.table()) is not None and self.slot is not None:
            table.claim(self.slot, os.getpid())
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
            if isinstance(callback, ConnCallback):
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
    def _may_accept(self) -> bool:
        if self.nr_conns >= self.worker_connections:
            return False
        others = workershared.siblings(self.slot)
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
        source = str(client[0]) if isinstance(client, tuple) else str(client)
        if self.sources[source] >= self.settings.connections_per_source:
            # One client (one pod) may not hold what the others need: its extra connections end at once.
            metrics.CONNECTIONS_REFUSED.labels("per_source").inc()
            sock.close()
            return
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # As Go's net/http does for every connection it accepts: an answer the loop could not send
            # whole is finished by a pool thread, and Nagle would hold that small tail until the client
            # acknowledged the first part, a delayed ACK (up to 40 ms on Linux) later.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        now = time.monotonic()
        if self.cfg.is_ssl:
            context = gunicorn_sock.ssl_context(self.cfg)
            sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False,
                                       suppress_ragged_eofs=True)
        conn = Conn(self.cfg, sock, client, listener.getsockname())
        conn.source = source
        self.sources[source] += 1
        metrics.CONNECTIONS.inc()
        self.nr_conns += 1
        self.conns.add(conn)
        workershared.publish(self.slot, self.nr_conns, draining=not self.alive)
        self._set_deadline(conn, now + self.settings.request_timeout)
        self.poller.register(conn.sock, selectors.EVENT_READ, ConnCallback(self, conn))
        if self.cfg.is_ssl:
            self._handshake(conn)
        else:
            conn.initialized = True
            conn.phase = Phase.IDLE
            self._set_deadline(conn, now + self.cfg.keepalive)

    # --- per-connection state machine --------------------------------------------------------
    def on_event(self, conn: Conn) -> None:
        if conn.phase is Phase.BUSY:
            return
        if conn.phase is Phase.HANDSHAKE:
            self._handshake(conn)
        elif conn.phase in (Phase.READING, Phase.IDLE, Phase.DISCARDING, Phase.CLOSING):
            self._read(conn)

    def _watch(self, conn: Conn, events: int) -> None:
        # Registered or not is looked up, not found out from modify's KeyError: its message formats
        # the socket's repr, a getsockname and getpeername per request.
        key = self.poller.get_map().get(conn.sock.fileno())
        if key is None:
            self.poller.register(conn.sock, events, ConnCallback(self, conn))
        elif key.events != events or key.data != ConnCallback(self, conn):
            self.poller.modify(conn.sock, events, ConnCallback(self, conn))

    def _unwatch(self, conn: Conn) -> None:
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass

    def _tls_step(self, conn: Conn, step: Callable[[], Any]) -> tuple[bool, Any]:
        """One non-blocking step on the socket (handshake, read): (True, its result), or (False, None)
        when it must wait (the socket is watched for what it waits on) or failed (it is closed)."""
        try:
            return True, step()
        except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
            self._watch(conn, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
        except (ssl.SSLError, OSError):
            self._close(conn)
        return False, None

    def _handshake(self, conn: Conn) -> None:
        if not self._tls_step(conn, conn.sock.do_handshake)[0]:
            return
        conn.initialized = True
        conn.last_activity = time.monotonic()
        if conn.sock.selected_alpn_protocol() == "h2":
            self._take_h2(conn)
            return
        # Connected: the first request must start within the request timeout (a connection that never
        # sends one is closed then, not kept for the keep-alive time); after a request, the keep-alive
        # time applies. An idle connection costs a socket, never a thread.
        conn.phase = Phase.IDLE
        self._set_deadline(conn, time.monotonic() + self.settings.request_timeout)
        self._watch(conn, selectors.EVENT_READ)
        self._read(conn)

    def _read(self, conn: Conn) -> None:
        received = 0
        while received < MAX_READ_PER_EVENT:
            done, chunk = self._tls_step(conn, lambda: conn.sock.recv(READ_CHUNK))
            if not done:
                if conn not in self.conns:
                    return
                break
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
            if self.buffered + len(chunk) > self.settings.max_buffered_bytes and not self._make_room(conn, len(chunk)):
                return
            conn.buffer += chunk
            self.buffered += len(chunk)
            if len(conn.buffer) > self.settings.max_header_bytes + self.settings.max_body_bytes + READ_CHUNK:
                break
        if conn.phase is Phase.READING:
            self._examine(conn)

    def _make_room(self, reading: Conn, size: int) -> bool:
        """Unfinished requests hold this worker's whole share of memory: refuse the largest of them,
        or ``reading`` itself when it is the largest. 128 stalled maximum-size bodies would otherwise
        take the pod past its memory limit; a client that keeps sending wins over one that stalled."""
        while self.buffered + size > self.settings.max_buffered_bytes:
            largest = max((c for c in self.conns if c.phase is Phase.READING), key=lambda c: len(c.buffer),
                          default=reading)
            if largest is reading or len(largest.buffer) <= len(reading.buffer):
                largest = reading
            self._refuse(largest, 503, "Service Unavailable",
                         "the server holds too many unfinished requests; send the request whole, quicker")
            if largest is reading:
                return False
        return True

    def _examine(self, conn: Conn) -> None:
        """Act on what the buffer holds: wait for more, take a whole request, or refuse. Requests the
        loop answers itself are taken one after another, so pipelined ones need no recursion."""
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
                self.buffered -= found.end
                if conn.continue_sent:  # answered already: the parser must not send a second 100
                    data = _EXPECT_CONTINUE.sub(b"", data, count=1)
                conn.continue_sent = False
                body_start = found.body_start if found.state is framing.State.COMPLETE else -1
                self._take(conn, data, body_start)
            elif found.state is framing.State.TOO_LARGE:
                self._too_large(conn, found)
            else:
                self._refuse(conn, 431, "Request Header Fields Too Large",
                             f"the header block exceeds {self.settings.max_header_bytes} bytes")

    def _too_large(self, conn: Conn, found: framing.Framing) -> None:
        length = found.declared_length
        received = len(conn.buffer) - found.body_start
        limit = self.settings.max_body_bytes
        message = framing.too_large(limit, length)
        left = (length - received) if length is not None else self.settings.discard_limit_bytes
        self._refuse(conn, 413, "Payload Too Large", message, discard=min(left, self.settings.discard_limit_bytes))

    def _take(self, conn: Conn, data: bytes, body_start: int) -> None:
        """Act on one whole request (``body_start`` -1 when its framing is broken): the subclass answers."""
        raise NotImplementedError

    def _take_h2(self, conn: Conn) -> None:
        """Serve a connection whose handshake chose HTTP/2: the subclass does."""
        raise NotImplementedError

    def _drain_h2(self) -> None:
        """The drain begins: HTTP/2 connections are told to go away (the subclass has them)."""

    def _stop_h2(self) -> None:
        """The drain is over: end the HTTP/2 connections (the subclass has them)."""

    def _resume(self, conn: Conn) -> None:
        """A connection whose answer went out waits for its next request (loop bookkeeping)."""
        conn.phase = Phase.IDLE
        conn.last_activity = time.monotonic()
        self._set_deadline(conn, time.monotonic() + self.cfg.keepalive)

    # --- answers the loop gives itself ---------------------------------------------------------
    def _refuse(self, conn: Conn, status: int, reason: str, message: str, *, discard: int = 0) -> None:
        body = json.dumps({"error": message, "code": status}).encode()
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        result = {413: "too_large", 408: "timeout", 431: "bad_request", 503: "busy"}.get(status, "bad_request")
        endpoint = endpoint_of(conn.buffer)
        metrics.ADMISSIONS.labels(endpoint, "", "", result).inc()
        logs.log_event(_log, "request refused", logging.WARNING, result=result, code=status, error=message,
                       endpoint=endpoint, client=client_name(conn))
        self._send_now(conn, head + body)
        self.buffered -= len(conn.buffer)
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
        sent = send_without_blocking(conn, data)
        if sent is None or sent < len(data):  # broken, or the client does not read: nothing more is owed to it
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
        self.buffered -= len(conn.buffer)
        conn.buffer.clear()
        self.sources[conn.source] -= 1
        if self.sources[conn.source] <= 0:
            del self.sources[conn.source]
        self._unwatch(conn)
        self._clear_deadline(conn)
        try:
            conn.sock.close()
        except OSError:
            pass
        self.nr_conns -= 1
        workershared.publish(self.slot, self.nr_conns, draining=not self.alive)

    # --- stopping ------------------------------------------------------------------------------
    def _drain(self) -> None:
        """Stop the way a client can live with: answer, then close between requests, never in one."""
        drain.stop(self)
