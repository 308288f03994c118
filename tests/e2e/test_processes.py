"""The process rules the harness relies on, checked with tiny Python children (no cluster needed):
a port taken between picking and binding is retried on new ports, a child that ignores SIGTERM
is killed, and a child that dies says why in the error."""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from webhook.localcluster import processes

# Listens on argv[1] like a Go server would, or fails with Go's wording when the port is taken.
LISTENER = """
import socket, sys, time
sock = socket.socket()
try:
    sock.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    print(f"listen tcp 127.0.0.1:{sys.argv[1]}: bind: address already in use", flush=True)
    sys.exit(1)
sock.listen()
print("listening", flush=True)
time.sleep(60)
"""


def connects(ports: Sequence[int]) -> bool:
    with socket.create_connection(("127.0.0.1", ports[0]), timeout=1):
        return True


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_port_taken_meanwhile_is_retried_on_a_new_one(tmp_path: Path, taken_port: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    picks = iter([taken_port])
    real_free_port = processes.free_port
    monkeypatch.setattr(processes, "free_port", lambda: next(picks, None) or real_free_port())
    launch = processes.Launch(name="listener", ports=1, timeout=10,
                              probe=lambda ports: "listening" in processes.tail(tmp_path / "listener.log"),
                              command=lambda ports: [sys.executable, "-c", LISTENER, str(ports[0])])

    process = processes.start(launch, tmp_path)
    try:
        assert process.ports[0] != taken_port
        assert "address already in use" in (tmp_path / "listener.attempt1.log").read_text()
    finally:
        process.stop()
    assert not process.running()


def test_a_child_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('up', flush=True); time.sleep(60)")
    launch = processes.Launch(name="stubborn", ports=0, timeout=10,
                              command=lambda ports: [sys.executable, "-c", stubborn],
                              probe=lambda ports: "up" in processes.tail(tmp_path / "stubborn.log"))
    process = processes.start(launch, tmp_path)

    process.stop(grace=0.5)

    assert process.popen.returncode == -signal.SIGKILL


def test_a_child_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    broken = "print('flag provided but not defined: --nope'); raise SystemExit(2)"
    launch = processes.Launch(name="broken", ports=1, timeout=10, probe=connects,
                              command=lambda ports: [sys.executable, "-c", broken])

    with pytest.raises(processes.StartError, match="flag provided but not defined"):
        processes.start(launch, tmp_path)
