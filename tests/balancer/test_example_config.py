"""The shipped example balancer config names every settings key at its default.

The documented ``gpugate balance ... --config`` once pointed at a file that did not exist; a key added to
the settings without the example, or a default changed in one place only, fails here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from webhook.balancer.settings import BalancerSettings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "webhook" / "examples" / "balancer.yaml"


def keys_of(value: Any, prefix: str = "") -> set[str]:
    """Dotted names of every leaf field of a settings dataclass."""
    out: set[str] = set()
    for field in dataclasses.fields(value):
        inner = getattr(value, field.name)
        if dataclasses.is_dataclass(inner):
            out |= keys_of(inner, f"{prefix}{field.name}.")
        else:
            out.add(f"{prefix}{field.name}")
    return out


def leaves(data: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in data.items():
        nested = isinstance(value, dict) and value  # an empty mapping (labels: {}) is a value, not a section
        out |= leaves(value, f"{prefix}{key}.") if nested else {f"{prefix}{key}"}
    return out


def test_the_example_has_every_key_and_loads_as_the_defaults() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    assert leaves(data) == keys_of(BalancerSettings())
    assert BalancerSettings.from_file(EXAMPLE) == BalancerSettings()


def test_the_balancer_page_names_the_example() -> None:
    assert "--config webhook/examples/balancer.yaml" in (ROOT / "docs" / "balancer.md").read_text()
