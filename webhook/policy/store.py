"""The policy set a server process answers with, and its hot reload from the policy folder.

The folder is polled: a digest of the files the loader reads (kopf keeps only a digest of the
files it watches) is compared every ``interval`` seconds, so nothing is held open and the check
costs a few small reads. Paths are read through symlinks, which makes the Kubernetes ConfigMap
volume layout (``name.yaml -> ..data/name.yaml``, ``..data -> ..2026_..``, swapped by one rename)
look like any other content change.

A change is loaded all-or-nothing (``PolicySet.from_dir``) and swapped in with one reference
assignment: a request that took ``current()`` keeps that set to its end, so no answer mixes two
revisions. If the folder changed again while it was being loaded (a swap in the middle), the
result is discarded and the next tick retries. An invalid set is refused with one log line and
one metric per distinct content, and the last good set keeps serving.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from webhook import logs
from webhook.errors import GpugateError
from webhook.policy import loading

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


def _load_from_dir(directory: Path) -> PolicySet:
    return loading.load_dir(directory)


CHANGED_WHILE_LOADING = "folder changed while loading; retrying"


@dataclass(frozen=True)
class ReloadOutcome:
    """What one check did: ``changed`` false means the folder's digest was unchanged."""

    changed: bool
    loaded: bool = False
    error: str = ""
    revision: str = ""


class PolicyStore:
    """Holds the current PolicySet of one process; ``check()`` reloads when the folder changed."""

    def __init__(
        self,
        directory: Path,
        *,
        load: Callable[[Path], PolicySet] = _load_from_dir,
        on_loaded: Callable[[PolicySet, PolicySet | None], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self._load = load
        self._on_loaded = on_loaded
        self._on_refused = on_refused
        self._current: PolicySet | None = None
        self._seen_digest: str | None = None     # last digest acted upon (loaded or refused)
        self._check_lock = threading.Lock()      # one check at a time; readers never take it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> PolicySet | None:
        """The set to answer with (None until one valid set has loaded). One read, no lock."""
        return self._current

    @property
    def ready(self) -> bool:
        return self._current is not None

    def check(self, *, attempts: int = 5) -> ReloadOutcome:
        """Reload if the folder's content differs from the last content acted upon.

        A folder that changes while it is being loaded (a ConfigMap swap in the middle) is read
        again at once, up to ``attempts`` times: a worker starting during a swap must not serve
        without any policy set until the next tick.
        """
        outcome = self._check_once()
        for _ in range(attempts - 1):
            if outcome.loaded or outcome.error != CHANGED_WHILE_LOADING:
                break
            outcome = self._check_once()
        return outcome

    def _check_once(self) -> ReloadOutcome:
        with self._check_lock:
            before = folder_digest(self.directory)
            if before == self._seen_digest:
                return ReloadOutcome(changed=False)
            try:
                loaded = self._load(self.directory)
            except GpugateError as err:
                return self._refuse(before, str(err))
            except Exception as err:  # a loader bug must not kill the watcher; the old set serves on
                _log.exception("policy load crashed", extra={"fields": {"directory": str(self.directory)}})
                return self._refuse(before, f"{type(err).__name__}: {err}")
            if folder_digest(self.directory) != before:
                # Changed while loading (e.g. a ConfigMap swap in the middle): retry next tick.
                return ReloadOutcome(changed=True, error=CHANGED_WHILE_LOADING)
            previous, self._current = self._current, loaded
            self._seen_digest = before
            logs.log_event(_log, "policy set loaded", directory=str(self.directory),
                           revision=loaded.revision, previous=previous.revision if previous else None,
                           policies=[p.name for p in loaded.policies])
            if self._on_loaded:
                self._on_loaded(loaded, previous)
            return ReloadOutcome(changed=True, loaded=True, revision=loaded.revision)

    def _refuse(self, digest: str, message: str) -> ReloadOutcome:
        self._seen_digest = digest  # one log line and one count per distinct bad content
        serving = self._current.revision if self._current else None
        logs.log_event(_log, "policy reload refused", logging.ERROR, directory=str(self.directory),
                       error=message, serving=serving)
        if self._on_refused:
            self._on_refused(message)
        return ReloadOutcome(changed=True, error=message)

    def start(self, interval: float) -> None:
        """Poll the folder every ``interval`` seconds on a daemon thread of this process."""
        if self._thread is not None or interval <= 0:
            return

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    self.check()
                except Exception:  # never let the watcher die silently
                    _log.exception("policy watcher failed", extra={"fields": {"directory": str(self.directory)}})

        self._thread = threading.Thread(target=run, name="gpugate-policy-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
