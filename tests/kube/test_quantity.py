"""Kubernetes quantities become exact numbers once, at the boundary."""

from __future__ import annotations

from decimal import Decimal

import pytest

from webhook.kube import quantity
from webhook.kube.quantity import QuantityError, bytes_, millicores, parse_quantity, whole_count


@pytest.mark.parametrize(("text", "expected"), [
    ("1", Decimal(1)),
    ("500m", Decimal("0.5")),
    ("100u", Decimal("0.0001")),
    ("2k", Decimal(2000)),
    ("1Ki", Decimal(1024)),
    ("16Gi", Decimal(16 * 2**30)),
    ("1M", Decimal(10**6)),
    ("1E", Decimal(10**18)),          # E alone is the exa suffix, not an exponent
    ("1e3", Decimal(1000)),           # an exponent needs digits after e
    ("1.5", Decimal("1.5")),
    (".5", Decimal("0.5")),
    ("+2", Decimal(2)),
    (3, Decimal(3)),
    (0.25, Decimal("0.25")),
], ids=lambda v: repr(v))
def test_a_quantity_parses_to_its_exact_value(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", ".", "1e", "2K", "1 Gi", "1gi", "Gi", True, None, [1], {}],
                         ids=repr)
def test_a_non_quantity_is_refused_with_its_value_named(text):
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(("value", "expected"), [
    ("2", 2), (2, 2), ("1.0", 1), ("1000m", 1), ("0", 0), (2.0, 2),
    ("500m", None),                   # half a GPU is not a device count
    ("1.5", None), (2.5, None),
    ("-1", None),                     # negative counts are not counts
    ("two", None), (True, None), (None, None),
], ids=repr)
def test_whole_count_accepts_only_non_negative_whole_numbers(value, expected):
    assert whole_count(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("1", 1000), ("100m", 100), ("0.1", 100), ("1.0005", 1001), ("250m", 250), (2, 2000),
], ids=repr)
def test_cpu_is_counted_in_millicores_rounded_up(value, expected):
    assert millicores(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("1Ki", 1024), ("1.5Ki", 1536), ("1k", 1000), ("1m", 1), ("128Mi", 128 * 2**20), ("1e3", 1000),
], ids=repr)
def test_memory_is_counted_in_bytes_rounded_up(value, expected):
    assert bytes_(value) == expected


@pytest.mark.parametrize("value", ["1e999999k", "1e999999", "1e19", "9" * 70, "NaN", "inf"],
                         ids=["overflow-with-suffix", "huge-exponent", "beyond-int64", "too-long", "nan", "inf"])
def test_absurd_quantities_are_refused_quickly(value: str) -> None:
    """A label value is user input: refused before Decimal or int spend seconds on it (before this
    rule, "1e999999" parsed into a million-digit int in 25 s and "1e999999k" raised Overflow)."""
    with pytest.raises(QuantityError):
        parse_quantity(value)
    assert whole_count(value) is None


@pytest.mark.parametrize(("value", "too_large"), [
    ("99999999999999999999", True), ("1e999999", True), ("9" * 80, True),
    ("12", False), ("1.5", False), ("abc", False), ("-3", False),
])
def test_out_of_range_tells_too_large_from_not_a_number(value: str, too_large: bool) -> None:
    assert quantity.out_of_range(value) is too_large
