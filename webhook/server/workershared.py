"""What gunicorn's master sets up before it forks and every worker inherits: the worker settings and
the table of open connections per worker that lets the workers balance without talking.

Split out of ``server.worker`` (one concept a module); ``gpugate serve`` calls ``configure`` once in the master
and ``serving.gunicorn_options`` installs the two hooks.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

from webhook.server.serverstate import MAX_BODY_BYTES


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    request_timeout: float = 5.0
    """Seconds a client has, from its first byte, to deliver a whole request (TLS handshake included on a
    new connection) and then to take the answer. The API server sends a review in one write; a client
    this slow is broken or hostile."""
    drain_seconds: float = 3.0
    """After SIGTERM, how long the worker keeps answering (with Connection: close) before it stops
    accepting: clients whose next request is already on its way are answered, not reset."""
    max_body_bytes: int = MAX_BODY_BYTES
    """Larger bodies get 413 from the loop, without being buffered: the largest review the API server
    can send (``serverstate.MAX_BODY_BYTES``), so it never gets a 413, only an answer."""
    max_header_bytes: int = 64 * 1024
    """A larger header block gets 431."""
    max_buffered_bytes: int = 96 * 1024 * 1024
    """Bytes of unfinished HTTP/1.1 requests one worker holds at most; past it the largest is refused
    (503). Two workers then stay under the Deployment's 512 Mi with stalled maximum-size bodies
    (``tests/server/test_cost_ceilings.py``), and a request being sent wins over one that stalled."""
    connections_per_source: int = 256
    """Open connections one source address may hold in one worker; more are closed at accept. The API
    server keeps a few (HTTP/2: one per about 8 calls in flight); a pod opening hundreds is refused."""
    discard_limit_bytes: int = MAX_BODY_BYTES
    """How much of an over-limit body is read and dropped so the client sees its 413 (instead of a
    reset from unread data); a client streaming more is cut off."""


_settings = WorkerSettings()
_table: ConnectionTable | None = None


def configure(settings: WorkerSettings, *, max_workers: int = 64) -> None:
    """Called once in the master, before gunicorn forks: the settings and the shared table."""
    global _settings, _table
    _settings = settings
    _table = ConnectionTable(max_workers * 4)  # HUP briefly runs old and new workers side by side


def settings() -> WorkerSettings:
    """The settings ``configure`` set (the defaults when it was not called)."""
    return _settings


def table() -> ConnectionTable | None:
    """The shared table, or None when ``configure`` was not called (no balancing)."""
    return _table


def publish(slot: int | None, connections: int, *, draining: bool) -> None:
    """This worker's open connections (and whether it drains), for its siblings to see."""
    if _table is not None and slot is not None:
        _table.publish(slot, os.getpid(), connections, draining=draining)


def siblings(slot: int | None) -> list[int] | None:
    """Open connections of each live sibling that is not draining (None without a table)."""
    if _table is None or slot is None:
        return None
    return _table.others(slot)


class ConnectionTable:
    """Open connections per worker, in anonymous shared memory, so workers can balance without talking.

    Slots are (pid, connections, draining) int64 triples. The master assigns a slot before each fork and
    frees it when the worker exits; a worker writes only its own slot. Reads race with writes, which is
    fine for a balancing heuristic (aligned 8-byte stores are atomic on the platforms gunicorn runs on).

    A header before the slots holds how many slots were ever handed out (the master only raises it),
    and a read looks at those alone: every turn of every worker's loop reads the table, and a scan
    of all 256 slots cost about 150 µs of CPU each time, as much as a third of a review, and made a
    worker waiting to accept burn about 6 ms/s doing nothing.
    """

    _SLOT = struct.Struct("qqq")
    _HEADER = struct.Struct("q")

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._memory = mmap.mmap(-1, self._HEADER.size + self._SLOT.size * slots)

    def assign(self, pid_placeholder: int = -1) -> int:
        for index in range(self.slots):
            pid, _, _ = self._read(index)
            if pid == 0:
                self._write(index, pid_placeholder, 0, 0)
                if index >= self._used():
                    self._HEADER.pack_into(self._memory, 0, index + 1)
                return index
        raise RuntimeError("no free worker slot in the connection table")

    def claim(self, index: int, pid: int) -> None:
        self._write(index, pid, 0, 0)

    def release_pid(self, pid: int) -> None:
        for index in range(self._used()):
            if self._read(index)[0] == pid:
                self._write(index, 0, 0, 0)

    def publish(self, index: int, pid: int, count: int, *, draining: bool) -> None:
        self._write(index, pid, count, int(draining))

    def others(self, index: int) -> list[int]:
        """Connection counts of the other live workers that are not draining."""
        start = self._HEADER.size
        used = self._memory[start:start + self._SLOT.size * self._used()]
        return [count for other, (pid, count, draining) in enumerate(self._SLOT.iter_unpack(used))
                if other != index and pid > 0 and not draining]

    def _used(self) -> int:
        """How many slots (from the first) were ever handed out."""
        return min(int(self._HEADER.unpack_from(self._memory, 0)[0]), self.slots)

    def _read(self, index: int) -> tuple[int, int, int]:
        pid, count, draining = self._SLOT.unpack_from(self._memory, self._HEADER.size + index * self._SLOT.size)
        return pid, count, draining

    def _write(self, index: int, pid: int, count: int, draining: int) -> None:
        self._SLOT.pack_into(self._memory, self._HEADER.size + index * self._SLOT.size, pid, count, draining)


def pre_fork(server: Any, worker: Any) -> None:
    """gunicorn hook (master): give the worker about to be forked a slot of the table."""
    if _table is not None:
        worker.gpugate_slot = _table.assign()


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook (master): free the slot of a worker that exited, however it exited."""
    if _table is not None:
        _table.release_pid(worker.pid)
