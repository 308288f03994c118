"""The device plugin's allocation model: one rule for the extender and the replayed cluster."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.placement import devices


@pytest.mark.parametrize(("left", "milli", "policy", "expected"), [
    ((1000, 600, 300), 250, "distributed", 0),   # most left
    ((1000, 600, 300), 250, "packed", 2),        # least left that fits
    ((1000, 600, 300), 400, "packed", 1),
    ((600, 600, 300), 250, "distributed", 0),    # ties: lowest index
    ((300, 600, 600), 500, "packed", 1),
    ((100, 200), 250, "distributed", -1),        # nothing fits
])
def test_a_share_lands_where_the_device_plugin_would_put_it(left, milli, policy, expected) -> None:
    assert devices.share_device(left, milli, policy) == expected


def test_whole_gpus_are_the_lowest_index_fully_free_ones() -> None:
    assert devices.whole_devices((1000, 500, 1000, 1000), 2) == (0, 2)
    assert devices.allocate((1000, 500), 2, 0) is None
    assert devices.allocate((1000, 500, 1000), 2, 0) == ((0, 2), (0, 500, 0))


lefts = st.lists(st.sampled_from([0, 50, 190, 250, 500, 530, 750, 1000]), min_size=0, max_size=8)


@given(lefts, st.integers(0, 3), st.sampled_from([0, 100, 250, 470, 810]), st.sampled_from(devices.POLICIES))
def test_the_multiset_rule_agrees_with_the_per_device_rule(left, gpus, share, policy) -> None:
    """The measure's memo key (sorted GPUs left; in device order for DRA's first fit) moves exactly as
    the device plugin (or the DRA allocator) allocates."""
    if gpus and share:
        share = 0
    found = devices.allocate(tuple(left), gpus, share, policy)
    key = devices.ordered_signature(left) if policy == "first" else devices.signature(left)
    after = devices.after_sorted(key, gpus, share, policy)
    if found is None:
        assert after is None
    else:
        assert after == devices.signature(found[1])
