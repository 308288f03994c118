"""The cluster inventory file the webhook reads (a ConfigMap volume), re-read when it changes.

Checked at most once per interval (``filewatch.LastGood``), by a stat of the file (through the ConfigMap volume's
symlinks): a request never waits on more than that. An unreadable or invalid file leaves the last
good inventory in place, logged once per distinct problem; a file that never was good means no
inventory (``EMPTY``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from webhook import filewatch, logs
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
    """The inventory the webhook answers with: ``filewatch.LastGood`` over the file's stat."""

    def __init__(self, path: Path | None, *, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._problem = ""
        self._watch = filewatch.LastGood(fingerprint=self._stat, load=self._load, initial=inventory.EMPTY,
                                         refuse=(OSError, inventory.InventoryError), interval=interval, clock=clock,
                                         on_loaded=self._loaded, on_refused=self._report,
                                         on_unreadable=lambda err: self._report(f"cannot read {path}: {err.strerror}"))

    def current(self) -> inventory.Inventory:
        if self.path is None:
            return inventory.EMPTY
        return self._watch.poll()

    def _stat(self) -> tuple[int, int, int]:
        assert self.path is not None
        stat = os.stat(self.path)
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def _load(self) -> inventory.Inventory:
        assert self.path is not None
        try:
            return inventory.parse(self.path.read_bytes())
        except (OSError, inventory.InventoryError) as err:
            raise inventory.InventoryError(f"{self.path}: {err}") from err

    def _loaded(self, loaded: inventory.Inventory, previous: inventory.Inventory) -> None:
        self._problem = ""
        logs.log_event(_log, "inventory loaded", path=str(self.path),
                       default_priority_class=loaded.default_priority_class)

    def _report(self, problem: str) -> None:
        if problem != self._problem:
            self._problem = problem
            logs.log_event(_log, "inventory not used", logging.WARNING, error=problem,
                           serving="last good" if self._watch.current is not inventory.EMPTY else "none")
