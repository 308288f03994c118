"""The eviction budget (never lends) and the one spelling of durations."""

from __future__ import annotations

import pytest

from webhook import durations
from webhook.usage.budget import EvictionBudget


def test_the_budget_starts_full_spends_to_zero_and_refills_at_its_hourly_rate() -> None:
    budget = EvictionBudget(per_hour=6, burst=3)
    assert budget.available(0) == 3
    for _ in range(5):  # more than it holds: it never goes below zero, so nothing is owed later
        budget.spend(0)
    assert budget.available(0) == 0
    assert budget.available(599) == 0
    assert budget.available(600) == 1  # six an hour: one every ten minutes
    assert budget.available(10 * 3600) == 3  # never more than the burst


def test_a_refused_eviction_is_given_back() -> None:
    budget = EvictionBudget(per_hour=1, burst=1)
    budget.spend(0)
    budget.refund(0)
    assert budget.available(0) == 1


def test_a_budget_of_zero_never_evicts() -> None:
    assert EvictionBudget(per_hour=0, burst=0).available(10**9) == 0


@pytest.mark.parametrize(("text", "seconds", "written"), [("90s", 90, "1m30s"), ("2h", 7200, "2h"),
                                                         ("1h30m", 5400, "1h30m"), ("7d", 604800, "7d")])
def test_a_duration_is_read_and_written_back_largest_units_first(text: str, seconds: int, written: str) -> None:
    assert durations.seconds(text) == seconds
    assert durations.text(seconds) == written


@pytest.mark.parametrize("text", ["1.5h", "90", "0s", "2 h", "-1h", "", "h"])
def test_anything_else_is_refused_with_the_spelling_expected(text: str) -> None:
    with pytest.raises(durations.DurationError, match="duration"):
        durations.seconds(text)
