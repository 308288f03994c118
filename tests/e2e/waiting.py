"""Waiting for the cluster to get somewhere, with a message that says where it got stuck."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Self, TypeVar

T = TypeVar("T")


def wait_until(probe: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.1,
               what: str = "the condition", explain: Callable[[], str] | None = None) -> T:
    """Call ``probe`` until it returns something truthy, and return that.

    Why not a fixed sleep: a real control plane takes from milliseconds to seconds depending on
    the machine's load; polling returns as soon as it is done and only fails after ``timeout``,
    saying what was awaited and (``explain``) what the cluster looked like instead.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def stop_stream(stop: threading.Event, response: Any, thread: threading.Thread) -> None:
    """End a watch thread blocked reading a streaming ``response``: flag ``stop``, shut the response
    (best effort: it only unblocks the reader), wait up to 5 s for the thread."""
    stop.set()
    if response is not None:
        try:
            response.shutdown()
        except Exception:
            pass
    thread.join(timeout=5)


class WatchThread:
    """A daemon thread that follows a watch stream until :meth:`stop`; a subclass writes ``_loop``,
    checks ``_stopping`` and keeps the open stream in ``_response`` so that stop can unblock it.

    Why a base: every recorder of the harness (Applications, upgraded nodes) starts and stops the
    same way; only what it reads differs.
    """

    def __init__(self, name: str) -> None:
        self._stopping = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        stop_stream(self._stopping, self._response, self._thread)

    def _loop(self) -> None:
        raise NotImplementedError
