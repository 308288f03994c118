"""What a test needs from outside the clone (../shared, chart packages, the trace, schemas, helm,
kubectl, built binaries), and the one rule for when it is absent.

On a user's fresh clone a missing prerequisite skips the test and says why and how to get it.
With ``CI`` set it fails the run with the same reason: ``.ci/run`` provides every prerequisite,
so a CI that lost one must not pass green on skipped evidence.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """``CI`` set to anything non-empty (GitHub Actions, GitLab and ``.ci/run`` set ``CI=true``)."""
    return bool(os.environ.get("CI"))


def missing(reason: str) -> NoReturn:
    """Skip with ``reason`` outside CI; fail with it under CI."""
    if in_ci():
        pytest.fail(f"CI is set and {reason}", pytrace=False)
    pytest.skip(reason)


def needed(path: Path, what: str) -> Path:
    """``path`` when it exists, else :func:`missing` naming it and ``what`` it holds."""
    if not path.exists():
        missing(f"{path} is absent ({what})")
    return path


def optional(path: Path, what: str) -> Path | None:
    """``path`` when it exists; None outside CI (the test runs without it, minus ``what``);
    under CI its absence fails the test."""
    if path.exists():
        return path
    if in_ci():
        missing(f"{path} is absent, so {what} would be left out")
    return None
