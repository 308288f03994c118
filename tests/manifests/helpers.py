"""Paths and small readers shared by the manifest tests."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
POLICIES = REPO / "policies"
# The shared research folder sits next to the checkout, never inside it.
SHARED = REPO.parent / "shared"
SCHEMA_ROOT = SHARED / "schemas"


def require_schemas() -> None:
    """Skip (with the reason) when ../shared/schemas is absent, as in a fresh clone."""
    if not (SCHEMA_ROOT / "json").is_dir():
        pytest.skip(f"custom-resource schemas not checked: {SCHEMA_ROOT} is absent "
                    "(fresh clone without ../shared); the built-in kinds are still validated")
