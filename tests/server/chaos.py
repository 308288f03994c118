"""Steady load on a real server while everything that happens to a webhook pod happens to it.

Used by ``tests/server/test_lifecycle.py`` (about a minute) and ``benchmarks/chaos.py`` (ten
minutes); no pytest here. In turn, repeatedly: a valid policy edit, an invalid policy, a serving
certificate rotation, SIGTERM to one worker, SIGHUP to the master, SIGKILL to one worker. Every
request is recorded with its time and outcome; only requests in flight on the worker that was
killed may fail.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import requests

from tests.server.harness import ConfigMapVolume, Server, example_pod, https_session, repo_policies, review_of
from webhook.certs import pki

EVENTS = ("policy-edit", "policy-invalid", "cert-rotation", "worker-term", "master-hup", "worker-kill")
KILL_GRACE_SECONDS = 3.0
"""After a SIGKILL, how long a failure may still be blamed on it (the killed worker's connections)."""


@dataclass
class Outcome:
    started: float
    ended: float
    status: int | None
    error: str = ""


@dataclass
class ChaosReport:
    outcomes: list[Outcome] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    revisions: list[str] = field(default_factory=list)

    def kill_times(self) -> list[float]:
        return [t for t, name in self.events if name == "worker-kill"]

    def excused(self, outcome: Outcome) -> bool:
        """A failure in flight when a worker was SIGKILLed (or on a connection it held)."""
        return any(kill - 0.5 <= outcome.started <= kill + KILL_GRACE_SECONDS for kill in self.kill_times())

    def unexcused_failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200 and not self.excused(o)]

    def counts(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for o in self.outcomes:
            if o.status == 200:
                out["answered 200"] += 1
            elif self.excused(o):
                out["failed, in flight on a killed worker"] += 1
            else:
                out["failed otherwise"] += 1
        for _, name in self.events:
            out[f"event {name}"] += 1
        return dict(out)

    def summary(self) -> str:
        lines = [f"  {key:<40}{value:>8}" for key, value in sorted(self.counts().items())]
        for o in self.unexcused_failures()[:5]:
            lines.append(f"  unexcused failure at +{o.started:.2f}s: {o.status} {o.error[:150]}")
        return "\n".join(lines)


class Chaos:
    """Drives a ``Server`` started with ``--cert/--key`` from ``tls_dir`` and policies in ``volume``."""

    def __init__(self, server: Server, volume: ConfigMapVolume, tls_dir: Path, *, clients: int = 6) -> None:
        self.server, self.volume, self.tls_dir = server, volume, tls_dir
        self.clients = clients
        self.report = ChaosReport()
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._edits = 0

    # --- load ------------------------------------------------------------------------------------
    def _client(self) -> None:
        session = https_session(self.tls_dir / pki.CA_CERT_FILE)
        while not self._stop.is_set():
            started = time.monotonic() - self._t0
            try:
                response = session.post(f"{self.server.url}/mutate", json=review_of(example_pod()), timeout=10)
                outcome = Outcome(started, time.monotonic() - self._t0, response.status_code,
                                  "" if response.status_code == 200 else response.text[:200])
            except requests.RequestException as err:
                outcome = Outcome(started, time.monotonic() - self._t0, None, f"{type(err).__name__}: {err}")
                session.close()
                session = https_session(self.tls_dir / pki.CA_CERT_FILE)
            with self._lock:
                self.report.outcomes.append(outcome)
        session.close()

    # --- events ----------------------------------------------------------------------------------
    def _workers(self) -> list[int]:
        assert self.server.process is not None
        path = Path(f"/proc/{self.server.process.pid}/task/{self.server.process.pid}/children")
        return sorted(int(pid) for pid in path.read_text().split())

    def _event(self, name: str) -> None:
        self.report.events.append((time.monotonic() - self._t0, name))
        if name == "policy-edit":
            self._edits += 1
            files = repo_policies()
            files["training.yaml"] += f"\n# chaos edit {self._edits}\n"
            self.volume.publish(files)
        elif name == "policy-invalid":
            files = repo_policies()
            files["training.yaml"] = files["training.yaml"].replace("max: 8", "max: eight")
            self.volume.publish(files)
        elif name == "cert-rotation":
            old = pki.read_bundle(self.tls_dir)
            assert old is not None
            new = pki.create_bundle(service="gpugate-webhook", namespace="gpugate-system",
                                    now=datetime.now(UTC), ca_cert=old.ca_cert, ca_key=old.ca_key)
            pki.write_bundle(new, self.tls_dir)
        elif name == "worker-term":
            os.kill(self._workers()[0], signal.SIGTERM)
        elif name == "master-hup":
            assert self.server.process is not None
            self.server.process.send_signal(signal.SIGHUP)
        elif name == "worker-kill":
            os.kill(self._workers()[-1], signal.SIGKILL)

    def _settle(self, name: str) -> None:
        """After a policy change, restore a valid set so the next event starts from a good state."""
        if name == "policy-invalid":
            time.sleep(1.0)
            self.volume.publish(repo_policies())

    def run(self, duration: float, *, on_event: Callable[[str], None] | None = None) -> ChaosReport:
        threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]
        for thread in threads:
            thread.start()
        rounds = max(int(duration // 60), 1)
        gap = max(duration / (len(EVENTS) * rounds + 1), 1.5)
        deadline = time.monotonic() + duration
        for name in _cycle(EVENTS):
            if time.monotonic() + gap > deadline:
                break
            time.sleep(gap)
            self._event(name)
            if on_event:
                on_event(name)
            self._settle(name)
        while time.monotonic() < deadline:
            time.sleep(0.1)
        self._stop.set()
        for thread in threads:
            thread.join(timeout=15)
        return self.report


def _cycle(names: tuple[str, ...]):  # type: ignore[no-untyped-def]
    while True:
        yield from names
