"""Child processes of the harness: started with a log file, probed until ready, stopped by PID.

Why a module of its own: every component (etcd, the API server, the controller manager, any
number of schedulers) has the same life (pick free ports, start, wait for a health probe,
retry if a port was taken in between, stop with SIGTERM then SIGKILL), and the rule that
every process is stopped even when a test fails is easiest to keep in one place.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

PORT_IN_USE = "address already in use"
START_ATTEMPTS = 5
STOP_GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 10.0


class StartError(RuntimeError):
    """A component did not become ready; the message carries the tail of its log."""


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (another process may take it: see retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(connection: http.client.HTTPConnection, path: str) -> tuple[int, bytes]:
    """GET ``path`` on ``connection`` and close it: the status and the body.

    Why here: every probe and every test that reads a component's /healthz, /readyz or /metrics
    sends one request on a connection it made for that (plain, TLS unverified, or TLS checked
    against a CA and a name), and must close it whatever the answer.
    """
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def terminate(popen: subprocess.Popen[bytes], grace: float = STOP_GRACE_SECONDS) -> None:
    """Stop a child by its PID: SIGTERM, wait up to ``grace`` seconds, then SIGKILL.

    Why SIGTERM first: our servers drain on it (gunicorn's workers finish their requests, the
    balancer releases its Lease); SIGKILL only for one that does not exit in time.
    """
    if popen.poll() is not None:
        return
    try:
        os.kill(popen.pid, signal.SIGTERM)
        popen.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.kill(popen.pid, signal.SIGKILL)
        popen.wait(timeout=KILL_WAIT_SECONDS)
    except ProcessLookupError:
        pass  # it exited between poll() and kill()


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file ('' if there is none yet)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one component, given freshly picked ports (a retry picks new ones)."""

    name: str
    ports: int
    """How many free ports ``command`` needs."""
    command: Callable[[Sequence[int]], list[str]]
    probe: Callable[[Sequence[int]], bool]
    """True once the component answers; called every 100 ms until ``timeout``."""
    timeout: float = 90.0


class Process:
    """One running component: its Popen, the ports it was given and its log file."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], ports: Sequence[int], log: Path) -> None:
        self.name = name
        self.popen = popen
        self.ports = tuple(ports)
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; by PID, never by name."""
        terminate(self.popen, grace)

    def tail(self, lines: int = 30) -> str:
        return tail(self.log, lines)


def start(launch: Launch, logs: Path, *, env: dict[str, str] | None = None) -> Process:
    """Start ``launch`` and wait until its probe passes, retrying on a port taken meanwhile.

    Picking a free port and binding it later is a race other test processes can win; the
    component then exits with "address already in use", and we start it again on new ports.
    """
    log = logs / f"{launch.name}.log"
    for attempt in range(1, START_ATTEMPTS + 1):
        ports = [free_port() for _ in range(launch.ports)]
        process = _spawn(launch, ports, log, env)
        try:
            if _wait_ready(launch, process):
                return process
        except BaseException:
            process.stop()
            raise
        process.stop()
        if PORT_IN_USE not in process.tail(200).lower() or attempt == START_ATTEMPTS:
            raise StartError(f"{launch.name} did not become ready (exit code {process.popen.returncode}); "
                             f"last lines of {log}:\n{process.tail()}")
        log.rename(log.with_name(f"{launch.name}.attempt{attempt}.log"))
    raise AssertionError("unreachable")


def _spawn(launch: Launch, ports: Sequence[int], log: Path, env: dict[str, str] | None) -> Process:
    with log.open("ab") as out:
        popen = subprocess.Popen(
            launch.command(ports), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=env,
            # Its own session: a Ctrl-C meant for `cluster up` or pytest must not reach the
            # components first; we stop them ourselves, in order.
            start_new_session=True,
        )
    return Process(launch.name, popen, ports, log)


def _wait_ready(launch: Launch, process: Process) -> bool:
    """True when the probe passes; False when the process exited first; StartError on timeout."""
    deadline = time.monotonic() + launch.timeout
    while time.monotonic() < deadline:
        if not process.running():
            return False
        try:
            if launch.probe(process.ports):
                return True
        except (OSError, http.client.HTTPException):
            pass  # not listening yet, or not speaking HTTP yet
        time.sleep(0.1)
    process.stop()
    raise StartError(f"{launch.name} was not ready after {launch.timeout:.0f}s; last lines of "
                     f"{process.log}:\n{process.tail()}")
