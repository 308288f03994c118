"""Ctrl-C and SIGTERM for the commands that start a local cluster (``gpugate demo``, ``cluster up``).

Both signals raise :class:`Interrupted` at whatever the main thread is doing, so a stop while the
control plane is still starting unwinds the ``with`` blocks that own etcd, kube-apiserver and the
rest, and nothing is left running. Python's default turns only SIGINT into an exception (SIGTERM
kills the interpreter, leaving the children), and only once the default is in place: a handler
installed *after* "Ctrl-C stops everything" is printed loses to a user, or a test, who presses it
at once (a CI run of the demo did, and exited through click's "Aborted!" with status 1).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_STATUS = 130
"""What a shell reports for a command stopped by Ctrl-C (128 + SIGINT)."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, as KeyboardInterrupt is, so ``except Exception``
    on the way up does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame: FrameType | None) -> None:
    stopping()
    raise Interrupted(signum)


def stopping() -> None:
    """Ignore SIGINT and SIGTERM from now until :func:`raised` ends: once stopping has begun, a second
    Ctrl-C must not cut the teardown short and leave etcd or kube-apiserver running (they run in
    sessions of their own, so the terminal's Ctrl-C never reaches them)."""
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


@contextmanager
def raised() -> Iterator[None]:
    """While inside, the first SIGINT or SIGTERM raises :class:`Interrupted` and later ones are
    ignored; the handlers before are put back after. Outside the main thread (where Python allows
    no handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.getsignal(signum) for signum in SIGNALS}
    for signum in SIGNALS:
        signal.signal(signum, _raise)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def announce_and_wait(announce: Callable[[], None]) -> int:
    """Inside :func:`raised`: call ``announce`` (which tells the user how to stop), then block until
    SIGINT or SIGTERM and return its number. The handlers are in place before ``announce`` runs, so
    a signal sent the moment the announcement is read ends the wait, not the process."""
    try:
        announce()
        while True:
            threading.Event().wait(3600)
    except Interrupted as stop:
        return stop.signum
