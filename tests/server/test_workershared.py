"""The connection table the workers balance on (``server.workershared``): reads look only at the
slots ever handed out (a scan of all 256 cost ~150 µs on every turn of the loop)."""

from __future__ import annotations

import pytest

from webhook.server.workershared import ConnectionTable


def test_others_sees_every_live_sibling_that_is_not_draining() -> None:
    table = ConnectionTable(256)
    slots = [table.assign() for _ in range(3)]
    for slot, (pid, count, draining) in zip(slots, [(100, 2, False), (101, 5, False), (102, 7, True)], strict=True):
        table.claim(slot, pid)
        table.publish(slot, pid, count, draining=draining)
    assert slots == [0, 1, 2]
    assert table.others(slots[0]) == [5]
    assert table.others(slots[1]) == [2]
    assert sorted(table.others(slots[2])) == [2, 5]


def test_a_freed_slot_is_reused_and_a_slot_handed_out_later_is_seen() -> None:
    """HUP: new workers get slots after the old ones; an old worker's exit frees its slot."""
    table = ConnectionTable(256)
    first, second = table.assign(), table.assign()
    table.claim(first, 100)
    table.claim(second, 101)
    table.release_pid(100)
    assert table.others(second) == []
    assert table.assign() == first  # the lowest free slot again
    late = [table.assign() for _ in range(40)][-1]
    table.claim(late, 140)
    table.publish(late, 140, 9, draining=False)
    assert 9 in table.others(second)
    assert table.others(late).count(9) == 0


def test_a_full_table_refuses_a_new_worker() -> None:
    table = ConnectionTable(2)
    table.assign()
    table.assign()
    with pytest.raises(RuntimeError, match="no free worker slot"):
        table.assign()
