"""The tier function: allocation with plain thresholds, utilization with hysteresis."""

from __future__ import annotations

import pytest

from webhook.placement.tiers import ThresholdError, TierThresholds, tier

T = TierThresholds()  # busy 0.5 / congested 1.0 allocated; busy 0.6 / congested 0.9 utilization; margin 0.1


@pytest.mark.parametrize(("previous", "allocated", "util", "expected"), [
    # allocation alone (no Prometheus): plain thresholds, previous tier irrelevant
    (None, 0.0, None, "idle"),
    (None, 0.49, None, "idle"),
    (None, 0.5, None, "busy"),
    ("congested", 0.75, None, "busy"),
    ("idle", 1.0, None, "congested"),
    # utilization without history: plain thresholds
    (None, 0.0, 0.59, "idle"),
    (None, 0.0, 0.6, "busy"),
    (None, 0.0, 0.9, "congested"),
    # moving up is immediate at the boundary
    ("idle", 0.0, 0.65, "busy"),
    ("busy", 0.0, 0.92, "congested"),
    ("idle", 0.0, 0.95, "congested"),
    # moving down needs the margin: inside the band the old tier stays
    ("busy", 0.0, 0.55, "busy"),
    ("busy", 0.0, 0.51, "busy"),
    ("busy", 0.0, 0.49, "idle"),
    ("congested", 0.0, 0.85, "congested"),
    ("congested", 0.0, 0.79, "busy"),
    ("congested", 0.0, 0.3, "idle"),
    # the worse of allocation and utilization wins
    ("idle", 1.0, 0.1, "congested"),
    ("idle", 0.5, 0.1, "busy"),
    ("idle", 0.1, 0.95, "congested"),
    # a tier held by utilization survives allocation dropping while utilization is in the band
    ("busy", 0.0, 0.52, "busy"),
    # an unknown previous label (someone edited it) is ignored
    ("bogus", 0.0, 0.55, "idle"),
])
def test_tier_moves_down_only_when_utilization_leaves_the_band(previous, allocated, util, expected) -> None:
    assert tier(allocated=allocated, utilization=util, previous=previous, thresholds=T) == expected


def test_a_value_hovering_at_a_boundary_does_not_flap() -> None:
    previous = None
    seen = []
    for util in (0.61, 0.58, 0.62, 0.55, 0.6, 0.57, 0.63):
        previous = tier(allocated=0.0, utilization=util, previous=previous, thresholds=T)
        seen.append(previous)
    assert seen == ["busy"] * 7


def test_zero_hysteresis_follows_the_plain_thresholds() -> None:
    sharp = TierThresholds(hysteresis=0.0)
    assert tier(allocated=0.0, utilization=0.59, previous="busy", thresholds=sharp) == "idle"


@pytest.mark.parametrize("kwargs", [
    {"busy_utilization": 0.95, "congested_utilization": 0.9},
    {"busy_allocated": 0.0},
    {"congested_allocated": 1.5},
    {"hysteresis": 0.6},
])
def test_thresholds_that_cannot_order_three_tiers_are_refused(kwargs) -> None:
    with pytest.raises(ThresholdError):
        TierThresholds(**kwargs)
