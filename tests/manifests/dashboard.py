"""The Grafana dashboard's queries as data: each panel target's PromQL, and how Grafana fills it in."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from tests.manifests.helpers import MANIFESTS

DASHBOARD = MANIFESTS / "observability" / "dashboard.json"
ALERTS = MANIFESTS / "observability" / "alerts.rules.yaml"
RATE_INTERVAL = "1m"
"""What Grafana substitutes for ``$__rate_interval`` with a 15 s scrape interval:
max(4 x scrape interval, step + scrape interval) = 1m at the dashboard's default resolution."""


@dataclass(frozen=True, slots=True)
class Target:
    """One query of one panel, as Prometheus receives it."""

    panel: int
    ref: str
    title: str
    expr: str


@cache
def load() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, the ones nested in collapsed rows included."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def targets() -> list[Target]:
    return [Target(p["id"], t["refId"], p["title"], t["expr"].replace("$__rate_interval", RATE_INTERVAL))
            for p in panels(load()) for t in p.get("targets", [])]


def dashboard_exprs() -> list[str]:
    """Every target's expression, ready for Prometheus."""
    return [t.expr for t in targets()]
