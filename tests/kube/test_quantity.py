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


@pytest.mark.parametrize(("value", "why"), [
    ("4", None), ("0", None), ("2000m", None),
    ("1e30", "is more than any node has"),            # was "not a whole number"
    ("1e999999k", "is more than any node has"),       # Decimal overflows: was "not a number"
    ("99999999999999999999", "is more than any node has"),
    ("-1", "is negative"), ("-2.5", "is negative"),
    ("1.5", "is not a whole number"), ("500m", "is not a whole number"),
    ("two", "is not a number"), ("", "is not a number"), (True, "is not a number"),
], ids=repr)
def test_count_problem_names_what_is_wrong_with_a_count(value: object, why: str | None) -> None:
    assert quantity.count_problem(value) == why


@pytest.mark.parametrize(("value", "why"), [
    ("20Gi", None), ("1e3", None),
    ("99999999999Ti", "is larger than a Kubernetes quantity can be"),   # was "not a quantity"
    ("9" * 70, "is larger than a Kubernetes quantity can be"),
    ("lots", "is not a quantity"), ("1 Gi", "is not a quantity"),
], ids=repr)
def test_quantity_problem_tells_too_large_from_not_a_quantity(value: str, why: str | None) -> None:
    assert quantity.quantity_problem(value) == why
