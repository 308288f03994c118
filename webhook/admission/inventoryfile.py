"""The cluster inventory file the webhook reads (a ConfigMap volume), re-read when it changes.

Checked at most once per interval, by a stat of the file (through the ConfigMap volume's
symlinks): a request never waits on more than that. An unreadable or invalid file leaves the last
good inventory in place, logged once per distinct problem; a file that never was good means no
inventory (``EMPTY``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from webhook import logs
from webhook.errors import InputError
from webhook.kube import inventory

_log = logging.getLogger(logs.SERVER_LOGGER)


def read(path: Path) -> inventory.Inventory:
    """The GPUInventory in ``path`` (an offline command's ``--inventory``, a golden case's);
    InputError names the file. The same parser as the server's watched file: both judge one file alike.
    """
    try:
        return inventory.parse(path.read_bytes())
    except OSError as err:
        raise InputError(f"{path}: cannot read the inventory: {err.strerror}") from err
    except inventory.InventoryError as err:
        raise InputError(f"{path}: not a GPUInventory: {err}") from err


class InventoryFile:
    def __init__(self, path: Path | None, *, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.interval = interval
        self._clock = clock
        self._current = inventory.EMPTY
        self._seen: tuple[int, int, int] | None = None
        self._problem = ""
        self._next = 0.0
        self._lock = threading.Lock()

    def current(self) -> inventory.Inventory:
        if self.path is not None and self._clock() >= self._next and self._lock.acquire(blocking=False):
            try:
                self._next = self._clock() + self.interval
                self._refresh()
            finally:
                self._lock.release()
        return self._current

    def _refresh(self) -> None:
        assert self.path is not None
        try:
            stat = os.stat(self.path)
        except OSError as err:
            self._report(f"cannot read {self.path}: {err.strerror}")
            return
        key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if key == self._seen:
            return
        try:
            loaded = inventory.parse(self.path.read_bytes())
        except (OSError, inventory.InventoryError) as err:
            self._report(f"{self.path}: {err}")
            return
        self._seen, self._current, self._problem = key, loaded, ""
        logs.log_event(_log, "inventory loaded", path=str(self.path),
                       default_priority_class=loaded.default_priority_class)

    def _report(self, problem: str) -> None:
        if problem != self._problem:
            self._problem = problem
            logs.log_event(_log, "inventory not used", logging.WARNING, error=problem,
                           serving="last good" if self._current is not inventory.EMPTY else "none")
