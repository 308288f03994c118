"""The observability component: ServiceMonitors that find the Services, and the Grafana dashboard.

What each dashboard query answers is Prometheus' to say: test_observability_promql.py runs every
target (and the alert rules) through ``promtool test rules`` with expected values.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.manifests import dashboard
from tests.manifests.helpers import arg_value, find, one, render_variant

VARIANT = "webhook+balancer+observability"


def _dashboard() -> tuple[dict, dict]:
    config_map = one(render_variant(VARIANT), "ConfigMap", "gpugate-dashboard")
    [text] = config_map["data"].values()
    return config_map, json.loads(text)


def _panels(dashboard: dict) -> list[dict]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def _exprs(panel: dict) -> str:
    return "\n".join(t.get("expr", "") for t in panel.get("targets", []))


def test_the_rendered_dashboard_is_the_file_promtool_evaluates() -> None:
    _, rendered = _dashboard()
    assert rendered == dashboard.load()


@pytest.mark.parametrize("name", ["gpugate-webhook", "gpugate-balancer"])
def test_service_monitor_selects_a_service_with_the_scraped_port(name: str) -> None:
    objs = render_variant(VARIANT)
    monitor = one(objs, "ServiceMonitor", name)
    namespaces = monitor["spec"]["namespaceSelector"]["matchNames"]
    selected = [s for s in find(objs, "Service") if s["metadata"]["namespace"] in namespaces
                and monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in selected] == [name]
    ports = {p["name"] for p in selected[0]["spec"]["ports"]}
    assert all(endpoint["port"] in ports for endpoint in monitor["spec"]["endpoints"])


def test_webhook_metrics_port_is_the_servers_metrics_listener() -> None:
    objs = render_variant(VARIANT)
    service = one(objs, "Service", "gpugate-webhook")
    metrics = next(p for p in service["spec"]["ports"] if p["name"] == "metrics")
    container = one(objs, "Deployment", "gpugate-webhook")["spec"]["template"]["spec"]["containers"][0]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    bind_port = int(arg_value(container, "--metrics-bind").rpartition(":")[2])
    assert named.get(metrics["targetPort"], metrics["targetPort"]) == bind_port


def test_dashboard_configmap_is_labelled_for_the_grafana_sidecar() -> None:
    config_map, dashboard = _dashboard()
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in _panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel.get("targets"), panel["title"]


def test_every_balancer_series_the_dashboard_reads_exists() -> None:
    from prometheus_client import CollectorRegistry

    from webhook.balancer.idlereclaim import IdleMetrics
    from webhook.balancer.metrics import Metrics
    from webhook.balancer.usagesource import UsageSource

    registry = CollectorRegistry()
    Metrics(registry)
    IdleMetrics(registry)
    registry.register(UsageSource(None, None, ready=lambda: False))  # type: ignore[arg-type]  # never read unready
    known = {family.name + ("_total" if family.type == "counter" else "") for family in registry.collect()}
    known |= {family.name + suffix for family in registry.collect() if family.type == "histogram"
              for suffix in ("_bucket", "_count", "_sum")}
    _, dashboard = _dashboard()
    used = set(re.findall(r"gpugate_balancer_[a-z_]+", "\n".join(_exprs(p) for p in _panels(dashboard))))
    assert used and used <= known, sorted(used - known)


def test_a_failed_driver_upgrade_turns_a_panel_red() -> None:
    _, dashboard = _dashboard()
    [stat] = [p for p in _panels(dashboard)
              if p["type"] == "stat" and "gpu_operator_nodes_upgrades_failed" in _exprs(p)]
    steps = stat["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": 1}
