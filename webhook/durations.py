"""Durations as Prometheus writes them (``90s``, ``2h``, ``1h30m``), read once into seconds. Pure.

A policy's ``spec.idle.after``, ``gpugate usage --since`` and the ranges of the queries built from
them share this one spelling, so what an author writes is what Prometheus is asked.
"""

from __future__ import annotations

import re

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
PATTERN = r"^([0-9]+[dhms])+$"
_PART = re.compile(r"([0-9]+)([dhms])")


class DurationError(ValueError):
    """Not a duration; str() names the text and the expected spelling."""


def seconds(text: str) -> int:
    """``1h30m`` -> 5400; DurationError for anything else (``1.5h``, ``90``, ``0s``)."""
    if not isinstance(text, str) or not re.fullmatch(PATTERN, text):
        raise DurationError(f"{text!r} is not a duration: write whole numbers with a unit, e.g. 90s, 30m, 2h, 1h30m")
    total = sum(int(n) * UNITS[u] for n, u in _PART.findall(text))
    if total <= 0:
        raise DurationError(f"{text!r} is not a duration: it must be longer than 0s")
    return total


def text(total: int) -> str:
    """Seconds written the way Prometheus reads them, largest units first: 5400 -> ``1h30m``."""
    if total <= 0:
        raise DurationError(f"{total} seconds: a duration must be longer than 0s")
    out = ""
    for unit, size in UNITS.items():
        count, total = divmod(total, size)
        if count:
            out += f"{count}{unit}"
    return out
