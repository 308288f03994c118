"""One client connection of the worker's loop, and where it is in its life (``Phase``).

Split out of ``server.worker`` so that each module holds one concept and stays small.
"""

from __future__ import annotations

import ssl
import time
from enum import Enum
from typing import Any, Protocol

from gunicorn.workers.gthread import TConn


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
        self.source = ""      # the client's address, for the per-source limits
        self.is_http2 = False
        self.h2_source = ""
        self.h2_goaway = False  # end this HTTP/2 connection with GOAWAY after its current stream


class EventHandler(Protocol):
    """The loop, as a connection's poller callback sees it."""

    def on_event(self, conn: Conn) -> None: ...


class ConnCallback:
    """The poller's data for a connection: calls back into the worker with it."""

    __slots__ = ("worker", "conn")

    def __init__(self, worker: EventHandler, conn: Conn) -> None:
        self.worker, self.conn = worker, conn

    def __call__(self, _fileobj: Any) -> None:
        self.worker.on_event(self.conn)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConnCallback) and other.conn is self.conn

    def __hash__(self) -> int:
        return id(self.conn)


def endpoint_of(buffer: bytes | bytearray) -> str:
    """The admission endpoint a request's line names, whatever its query string (the API server
    adds ``?timeout=5s``), so its refusals (413, 408) are counted where they belong."""
    line = bytes(buffer[:200]).split(b"\r\n", 1)[0].split(b" ")
    path = line[1].split(b"?", 1)[0].lstrip(b"/") if len(line) >= 2 else b""
    return path.decode() if path in (b"mutate", b"validate") else "other"


def client_name(conn: Conn) -> str:
    client = conn.client
    return f"{client[0]}:{client[1]}" if isinstance(client, tuple) and len(client) >= 2 else str(client)



def send_without_blocking(conn: Conn, data: bytes) -> int | None:
    """Bytes of ``data`` the socket took at once (0 when it would block), or None if the connection broke.

    The loop never waits on a client: what is not taken is either finished by a pool thread or the
    connection is dropped, as the caller decides.
    """
    try:
        return int(conn.sock.send(data))
    except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
        return 0
    except (ssl.SSLError, OSError):
        return None
