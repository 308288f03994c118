"""The policy set a server process answers with, and its hot reload from the policy folder.

The folder is polled: a digest of the files the loader reads (kopf keeps only a digest of the
files it watches) is compared every ``interval`` seconds, so nothing is held open and the check
costs a few small reads. Paths are read through symlinks, which makes the Kubernetes ConfigMap
volume layout (``name.yaml -> ..data/name.yaml``, ``..data -> ..2026_..``, swapped by one rename)
look like any other content change.

A change is loaded all-or-nothing (``loading.read_dir`` then ``parsing.parse``) and swapped in
with one reference assignment: a request that took ``current()`` keeps that set to its end, so no
answer mixes two revisions. If the folder changed again while it was being loaded (a swap in the
middle), the result is discarded and the next tick retries. An invalid set is refused with one
log line and one metric per distinct content, and the last good set keeps serving. A set with no
policy at all is refused too (a deleted ConfigMap key or an emptied folder must not silently lift
every deny rule) unless the operator allowed it.

The last good set outlives the process that loaded it: each accepted set's files are copied to
``snapshot_dir`` (shared by the workers of one server), and a process whose first load fails (a
worker started by a crash, a recycle or a HUP while the folder holds a bad edit) serves that copy
instead of nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from webhook import filewatch, logs
from webhook.errors import GpugateError
from webhook.policy import loading, parsing

if TYPE_CHECKING:  # the core is imported lazily so the edge can start (and report) without it
    from webhook.policy import PolicySet

_log = logging.getLogger(logs.SERVER_LOGGER)


def folder_digest(directory: Path) -> str:
    """sha256 over the names and contents of the policy files in ``directory`` (links followed)."""
    digest = hashlib.sha256()
    try:
        # The loader's own rule for which entries are policies; a broken link (a swap in
        # progress) is listed too, so the digest moves while the loader would fail.
        entries = sorted(p for p in Path(directory).iterdir() if loading.is_policy_file(p))
    except OSError as err:
        digest.update(f"unreadable:{err.strerror}".encode())
        return digest.hexdigest()
    for path in entries:
        digest.update(path.name.encode() + b"\0")
        try:
            if path.is_file():
                digest.update(path.read_bytes())
        except OSError as err:  # vanished between listing and reading: a swap in progress
            digest.update(f"unreadable:{err.strerror}".encode())
        digest.update(b"\0")
    return digest.hexdigest()


CHANGED_WHILE_LOADING = filewatch.CHANGED_WHILE_LOADING


@dataclass(frozen=True)
class ReloadOutcome:
    """What one check did: ``changed`` false means the folder's digest was unchanged."""

    changed: bool
    loaded: bool = False
    error: str = ""
    revision: str = ""


class PolicyStore:
    """Holds the current PolicySet of one process; ``check()`` reloads when the folder changed.

    The watching itself (digest compared, load, keep the last good set) is ``filewatch.LastGood``'s;
    this class adds what is particular to policies: the empty-set rule, the snapshot a sibling
    process can fall back on, and the log lines.
    """

    def __init__(
        self,
        directory: Path,
        *,
        read: Callable[[Path], loading.Texts] = loading.read_dir,
        on_loaded: Callable[[PolicySet, PolicySet | None], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
        allow_empty: bool = False,
        snapshot_dir: Path | None = None,
    ) -> None:
        self.directory = Path(directory)
        self._read = read
        self.allow_empty = allow_empty
        self.snapshot_dir = snapshot_dir
        self._on_loaded = on_loaded
        self._on_refused = on_refused
        self._texts: loading.Texts = []             # what the last successful load read (for the snapshot)
        self._watch: filewatch.LastGood[PolicySet | None] = filewatch.LastGood(
            fingerprint=lambda: folder_digest(self.directory), load=self._load, initial=None,
            refuse=(GpugateError,), recheck=True, interval=0, on_loaded=self._loaded, on_refused=self._refused)

    def current(self) -> PolicySet | None:
        """The set to answer with (None until one valid set has loaded). One read, no lock."""
        return self._watch.current

    @property
    def ready(self) -> bool:
        return self._watch.current is not None

    def check(self, *, attempts: int = 5) -> ReloadOutcome:
        """Reload if the folder's content differs from the last content acted upon.

        A folder that changes while it is being loaded (a ConfigMap swap in the middle) is read
        again at once, up to ``attempts`` times: a worker starting during a swap must not serve
        without any policy set until the next tick.
        """
        outcome = self._watch.check(attempts=attempts)
        current = self._watch.current
        return ReloadOutcome(changed=outcome.changed, loaded=outcome.loaded, error=outcome.error,
                             revision=current.revision if outcome.loaded and current else "")

    def _load(self) -> PolicySet:
        try:
            texts = self._read(self.directory)
            loaded = loading.require_servable(parsing.parse(texts), self.directory, allow_empty=self.allow_empty)
        except GpugateError:
            raise
        except Exception as err:  # a loader bug must not kill the watcher; the old set serves on
            _log.exception("policy load crashed", extra={"fields": {"directory": str(self.directory)}})
            raise GpugateError(f"{type(err).__name__}: {err}") from err
        self._texts = texts
        return loaded

    def _loaded(self, loaded: PolicySet | None, previous: PolicySet | None) -> None:
        assert loaded is not None
        self._save_snapshot(self._texts)
        logs.log_event(_log, "policy set loaded", directory=str(self.directory),
                       revision=loaded.revision, previous=previous.revision if previous else None,
                       policies=[p.name for p in loaded.policies])
        if self._on_loaded:
            self._on_loaded(loaded, previous)

    def _refused(self, message: str) -> None:
        if self._watch.current is None:
            self._serve_snapshot()
        current = self._watch.current
        logs.log_event(_log, "policy reload refused", logging.ERROR, directory=str(self.directory),
                       error=message, serving=current.revision if current else None)
        if self._on_refused:
            self._on_refused(message)

    def _save_snapshot(self, texts: loading.Texts) -> None:
        """Copy the accepted files to the snapshot folder: a new folder, then one rename over the old."""
        if self.snapshot_dir is None:
            return
        try:
            self.snapshot_dir.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.snapshot_dir))
            for index, (name, data) in enumerate(texts):
                (staging / f"{index:04d}-{Path(name).name}").write_bytes(data)
            target = self.snapshot_dir / "last-good"
            old = self.snapshot_dir / f".old-{os.getpid()}-{threading.get_ident()}"
            if target.exists():
                target.rename(old)
            staging.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as err:  # the snapshot is a safety net; failing to write it must not fail the load
            logs.log_event(_log, "could not save the last good policy set", logging.WARNING,
                           snapshot_dir=str(self.snapshot_dir), error=str(err))

    def _serve_snapshot(self) -> None:
        """On a failed first load, take the last set a sibling process accepted, if there is one."""
        folder = self.snapshot_dir / "last-good" if self.snapshot_dir else None
        if folder is None or not folder.is_dir():
            return
        try:
            texts = [(p.name.split("-", 1)[1], p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()]
            loaded = parsing.parse(texts)
        except (GpugateError, OSError, IndexError) as err:
            logs.log_event(_log, "the last good policy set could not be read", logging.WARNING, error=str(err))
            return
        self._watch.adopt(loaded)
        logs.log_event(_log, "serving the last good policy set", logging.WARNING, directory=str(self.directory),
                       revision=loaded.revision, policies=[p.name for p in loaded.policies])
        if self._on_loaded:
            self._on_loaded(loaded, None)

    def start(self, interval: float) -> None:
        """Poll the folder every ``interval`` seconds on a daemon thread of this process."""
        self._watch.start(interval, name="gpugate-policy-watch")

    def stop(self) -> None:
        self._watch.stop()
