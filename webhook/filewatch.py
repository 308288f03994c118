"""Reload the last good file: one watcher for every file a server re-reads while it runs.

The policy folder (``policy.store``), the cluster inventory file (``server.inventoryfile``) and
the serving certificate (``certs.reload``) all follow one rule, kept here once: a cheap
fingerprint of the files (a digest, or a stat) is compared with the last one acted upon; only
when it moved are the files loaded, and only a load that succeeds replaces the value being
served. A load that fails keeps the last good value and is reported once per distinct content
(its fingerprint is remembered as seen); a fingerprint that cannot be taken (a file missing for
a moment during a replace) is reported and tried again next time. Readers never wait: ``poll``
checks at most once per interval and skips the check while another thread runs one.

Kubernetes swaps a ConfigMap or Secret volume by one rename of its ``..data`` link, so reading
through the links makes a swap look like any other content change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from webhook import logs

T = TypeVar("T")

_log = logging.getLogger(logs.SERVER_LOGGER)

CHANGED_WHILE_LOADING = "changed while loading; retrying"


@dataclass(frozen=True)
class Reload:
    """What one check did: ``changed`` false means the fingerprint had not moved (or could not be taken)."""

    changed: bool
    loaded: bool = False
    error: str = ""


class LastGood(Generic[T]):
    """The last good value loaded from some files; re-loaded when their fingerprint moves.

    ``fingerprint`` may raise ``OSError`` (reported through ``on_unreadable``); ``load`` raises
    one of ``refuse`` for a bad content (reported through ``on_refused``, the old value serves on).
    With ``recheck`` the fingerprint is taken again after a load, and a load of files that moved
    meanwhile is thrown away (a swap in the middle) and retried.
    """

    def __init__(self, *, fingerprint: Callable[[], Hashable], load: Callable[[], T], initial: T,
                 refuse: tuple[type[Exception], ...] = (Exception,), interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, recheck: bool = False,
                 on_loaded: Callable[[T, T], None] | None = None,
                 on_refused: Callable[[str], None] | None = None,
                 on_unreadable: Callable[[OSError], None] | None = None) -> None:
        self._fingerprint, self._load, self._refuse = fingerprint, load, refuse
        self.interval = interval
        self._clock = clock
        self._recheck = recheck
        self._on_loaded, self._on_refused, self._on_unreadable = on_loaded, on_refused, on_unreadable
        self._current = initial
        self._seen: Hashable | None = None       # the last fingerprint acted upon (loaded or refused)
        self._next = 0.0                         # the first poll checks at once
        self._lock = threading.Lock()            # one check at a time; readers never take it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def current(self) -> T:
        """The value being served. One read, no lock."""
        return self._current

    def adopt(self, value: T, fingerprint: Hashable | None = None) -> None:
        """Serve ``value`` (loaded elsewhere, e.g. at start-up or from a snapshot); ``fingerprint``
        marks the files it came from as seen. ``poll`` leaves it one interval before the next check."""
        self._current = value
        self._next = self._clock() + self.interval
        if fingerprint is not None:
            self._seen = fingerprint

    def poll(self) -> T:
        """The value, after a check when the interval has passed and no other thread is checking."""
        if self._clock() >= self._next and self._lock.acquire(blocking=False):
            try:
                self._next = self._clock() + self.interval
                self._check_locked()
            finally:
                self._lock.release()
        return self._current

    def check(self, *, attempts: int = 1) -> Reload:
        """Check now (waiting for a check under way); a swap in the middle is retried up to ``attempts`` times."""
        outcome = Reload(changed=False)
        for _ in range(max(attempts, 1)):
            with self._lock:
                outcome = self._check_locked()
            if outcome.loaded or outcome.error != CHANGED_WHILE_LOADING:
                break
        return outcome

    def _check_locked(self) -> Reload:
        try:
            before = self._fingerprint()
        except OSError as err:
            if self._on_unreadable:
                self._on_unreadable(err)
            return Reload(changed=False, error=str(err))
        if before == self._seen:
            return Reload(changed=False)
        try:
            loaded = self._load()
        except self._refuse as err:
            self._seen = before  # one report per distinct bad content
            if self._on_refused:
                self._on_refused(str(err))
            return Reload(changed=True, error=str(err))
        if self._recheck and self._fingerprint() != before:
            return Reload(changed=True, error=CHANGED_WHILE_LOADING)
        previous, self._current, self._seen = self._current, loaded, before
        if self._on_loaded:
            self._on_loaded(loaded, previous)
        return Reload(changed=True, loaded=True)

    def start(self, interval: float, *, name: str) -> None:
        """Check every ``interval`` seconds on a daemon thread of this process (``stop`` ends it)."""
        if self._thread is not None or interval <= 0:
            return

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    self.check()
                except Exception:  # never let the watcher die silently
                    _log.exception("file watcher failed", extra={"fields": {"watcher": name}})

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
