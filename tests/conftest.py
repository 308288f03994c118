"""Suite-wide settings: the repository root, and where ../shared (schemas, trace) is if present."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the clone; tests that need it skip with the reason on a fresh clone."""
    if not SHARED.is_dir():
        pytest.skip("../shared is absent (a fresh clone has no schemas or trace beside it)")
    return SHARED

