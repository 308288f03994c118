"""Kubernetes resource quantities, parsed once at the boundary into exact numbers.

Extended resources such as ``nvidia.com/gpu`` must be whole numbers; cpu and memory are
converted to integer millicores and bytes so that the scheduler model and the validator
compare ints, never strings.
"""

from __future__ import annotations

import re
from decimal import Decimal, DecimalException, Overflow

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
    "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
    "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}
# Kubernetes quantities fit in int64 (its canonical form allows at most ~19 digits): anything longer
# or larger is refused before Decimal or int see it, since "1e999999" would take seconds of CPU.
MAX_QUANTITY_CHARS = 64
MAX_EXPONENT = 18
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: object) -> Decimal:
    """Parse ``"500m"``, ``"16Gi"``, ``2`` or ``"1e3"`` into a Decimal."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    if len(value) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"{value[:20]!r}... is not a quantity (longer than {MAX_QUANTITY_CHARS} characters)")
    match = _QUANTITY.match(value.strip())
    if not match:
        raise QuantityError(f"{value!r} is not a quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        quantity = Decimal(number) * _SUFFIXES[suffix]
        too_large = quantity.is_finite() and quantity != 0 and quantity.adjusted() > MAX_EXPONENT
    except Overflow as err:  # "1e999999k": a number, far beyond any quantity
        raise QuantityError(f"{value!r} is out of range for a Kubernetes quantity") from err
    except DecimalException as err:
        raise QuantityError(f"{value!r} is not a quantity") from err
    if not quantity.is_finite() or too_large:
        raise QuantityError(f"{value!r} is out of range for a Kubernetes quantity")
    return quantity


def out_of_range(value: object) -> bool:
    """A value that fails only for its size (e.g. twenty 9s): worth saying "too large", not "not a number"."""
    text = str(value).strip()
    if text.isdigit():
        return len(text) > MAX_EXPONENT + 1 or int(text) >= 2**63
    try:
        parse_quantity(text)
    except QuantityError as err:
        return "out of range" in str(err) or "longer than" in str(err)
    return False


def count_problem(value: object) -> str | None:
    """Why ``value`` is not a whole count of devices, worded to follow "which" (None when it is one).

    The one wording for every GPU count a pod writes (a resource quantity, the gpus label), so a
    typo is named for what it is: "1e30" is too large, not "not a whole number", and "-1" is
    negative, not "not a quantity".
    """
    if whole_count(value) is not None:
        return None
    if out_of_range(value):
        return "is more than any node has"
    try:
        quantity = parse_quantity(value)
    except QuantityError:
        return "is not a number"
    return "is negative" if quantity < 0 else "is not a whole number"


def quantity_problem(value: object) -> str | None:
    """Why ``value`` is not a Kubernetes quantity, worded to follow "which" (None when it is one):
    too large for one, or not one at all."""
    try:
        parse_quantity(value)
    except QuantityError:
        return "is larger than a Kubernetes quantity can be" if out_of_range(value) else "is not a quantity"
    return None


def whole_count(value: object) -> int | None:
    """The whole number an extended-resource quantity stands for, or None if it is not one."""
    if type(value) is str and len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)  # "4", as nearly every GPU count is written: the full parse gives the same
    try:
        quantity = parse_quantity(value)
    except QuantityError:
        return None
    if quantity != quantity.to_integral_value() or quantity < 0:
        return None
    return int(quantity)


def millicores(value: object) -> int:
    """CPU quantity in millicores, rounded up as the kubelet does."""
    return int((parse_quantity(value) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def bytes_(value: object) -> int:
    """Memory quantity in bytes, rounded up."""
    return int(parse_quantity(value).to_integral_value(rounding="ROUND_CEILING"))
