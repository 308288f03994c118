"""The one "reload the last good file" watcher: a moved fingerprint loads, a bad load keeps
the last good value and is reported once per content, an unreadable fingerprint is tried again."""

from __future__ import annotations

import subprocess
import sys

from webhook.filewatch import CHANGED_WHILE_LOADING, LastGood


class Files:
    """Stands for files on disk: a fingerprint and a content the test changes."""

    def __init__(self) -> None:
        self.content = "good-1"
        self.unreadable = False
        self.move_during_load = False

    def fingerprint(self) -> str:
        if self.unreadable:
            raise FileNotFoundError(2, "No such file or directory")
        return self.content

    def load(self) -> str:
        if self.content.startswith("bad"):
            raise ValueError(f"cannot parse {self.content}")
        value = self.content.upper()
        if self.move_during_load:
            self.move_during_load = False
            self.content += "+"
        return value


def watch(files: Files, **kwargs):
    events: list[tuple[str, str]] = []
    last = LastGood(fingerprint=files.fingerprint, load=files.load, initial="", refuse=(ValueError,),
                    on_loaded=lambda new, old: events.append(("loaded", new)),
                    on_refused=lambda error: events.append(("refused", error)),
                    on_unreadable=lambda err: events.append(("unreadable", err.strerror)), **kwargs)
    return last, events


def test_a_change_loads_a_bad_one_keeps_the_last_good_value_and_is_reported_once():
    files = Files()
    last, events = watch(files)
    assert last.check().loaded and last.current == "GOOD-1"
    assert not last.check().changed
    files.content = "bad-2"
    outcome = last.check()
    assert outcome.changed and not outcome.loaded and "cannot parse bad-2" in outcome.error
    assert last.current == "GOOD-1" and not last.check().changed
    files.content = "good-3"
    assert last.check().loaded and last.current == "GOOD-3"
    assert events == [("loaded", "GOOD-1"), ("refused", "cannot parse bad-2"), ("loaded", "GOOD-3")]


def test_an_unreadable_fingerprint_keeps_the_value_and_is_tried_again():
    files = Files()
    last, events = watch(files)
    last.check()
    files.unreadable = True
    assert not last.check().changed and not last.check().changed
    files.unreadable, files.content = False, "good-2"
    assert last.check().loaded
    assert [kind for kind, _ in events] == ["loaded", "unreadable", "unreadable", "loaded"]


def test_files_that_move_during_a_load_are_not_swapped_in_with_recheck():
    files = Files()
    last, _ = watch(files, recheck=True)
    files.move_during_load = True
    torn = last.check(attempts=1)
    assert torn.error == CHANGED_WHILE_LOADING and last.current == ""
    assert last.check(attempts=1).loaded and last.current == "GOOD-1+"


def test_poll_checks_at_most_once_per_interval():
    now = [0.0]
    files = Files()
    last, _ = watch(files, interval=1.0, clock=lambda: now[0])
    assert last.poll() == "GOOD-1"
    files.content = "good-2"
    assert last.poll() == "GOOD-1"
    now[0] = 1.5
    assert last.poll() == "GOOD-2"


def test_the_balancer_extender_loads_neither_gunicorn_nor_the_admission_server():
    code = ("import sys, webhook.balancer.extenderserver; "
            "print(sorted(m for m in sys.modules\n"
            "             if m.split('.')[0] == 'gunicorn' or m.startswith('webhook.admission')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
