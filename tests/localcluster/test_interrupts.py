"""Ctrl-C and SIGTERM for the local-cluster commands, with real signals in a child interpreter (a
handler that is not in place would otherwise stop pytest itself)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from webhook.localcluster import interrupts


def _child(body: str) -> subprocess.CompletedProcess[str]:
    script = "import os, signal, threading\nfrom webhook.localcluster import interrupts\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_sent_the_moment_the_announcement_is_read_ends_the_wait_not_the_process(signum: int) -> None:
    # The demo's CI failure: SIGINT arrived between "Ctrl-C stops everything." and the handler.
    done = _child(f"""
        with interrupts.raised():
            got = interrupts.announce_and_wait(lambda: os.kill(os.getpid(), {int(signum)}))
            interrupts.stopping()
            print("stopping after", signal.Signals(got).name)
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"stopping after {signal.Signals(signum).name}\n"


def test_a_signal_while_starting_unwinds_what_has_started_and_a_second_one_does_not_cut_the_teardown_short() -> None:
    done = _child("""
        class Started:
            def __enter__(self):
                print("started")
            def __exit__(self, *exc):
                os.kill(os.getpid(), signal.SIGINT)  # a second, impatient Ctrl-C while stopping
                print("stopped")
        try:
            with interrupts.raised(), Started():
                os.kill(os.getpid(), signal.SIGTERM)
                print("never")
        except interrupts.Interrupted as stop:
            print("interrupted by", stop)
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["started", "stopped", "interrupted by SIGTERM"]


def test_the_handlers_before_are_put_back() -> None:
    # SIGINT's handler before is whatever the child started with: Python's default_int_handler, or
    # SIG_IGN when its parent ignores SIGINT (a job started in the background, as CI may run it).
    done = _child("""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        before = signal.getsignal(signal.SIGINT)
        with interrupts.raised():
            assert signal.getsignal(signal.SIGINT) is not before
        print(signal.getsignal(signal.SIGINT) is before, signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
        """)
    assert done.stdout == "True True\n", done.stderr


def test_outside_the_main_thread_it_installs_nothing_rather_than_fail() -> None:
    failures: list[BaseException] = []

    def body() -> None:
        try:
            with interrupts.raised():
                interrupts.stopping()
        except BaseException as err:  # reported by the assertion below
            failures.append(err)

    before = signal.getsignal(signal.SIGINT)
    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert failures == [] and signal.getsignal(signal.SIGINT) is before
