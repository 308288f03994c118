"""Kubernetes' times, RFC 3339 in UTC (``2026-01-01T10:00:00Z``), to and from Unix seconds. Pure.

The API server writes ``metadata.creationTimestamp``, ``status.startTime``, condition and Event
times this way; the balancer writes Event times and quarantine holds the same way. Read and
written here once instead of by each module that meets one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def seconds(value: Any) -> float | None:
    """An RFC 3339 time as Unix seconds; None for a missing or unreadable one (a hand-made object)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rfc3339(moment: float) -> str:
    """Unix seconds as the API server writes a time (whole seconds, ``Z``)."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
