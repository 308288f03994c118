"""The observability component: ServiceMonitors that find the Services, and the Grafana dashboard."""

from __future__ import annotations

import json

import pytest

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


@pytest.mark.parametrize(("title_word", "metric", "split_by"), [
    ("Admissions/s", "gpugate_admissions_total", {"result", "policy"}),
    ("latency", "gpugate_admission_duration_seconds_bucket", {"result", "policy"}),
    ("reloads", "gpugate_policy_reloads_total", set()),
    ("reloads", "gpugate_policy_reload_errors_total", set()),
    ("tier", "gpugate_balancer_nodes", {"tier"}),
])
def test_dashboard_has_the_panel(title_word: str, metric: str, split_by: set[str]) -> None:
    _, dashboard = _dashboard()
    panels = [p for p in _panels(dashboard) if title_word.lower() in p["title"].lower() and metric in _exprs(p)]
    assert panels, f"no panel titled with {title_word!r} reads {metric}"
    for label in split_by:
        assert any(f"by ({label}" in _exprs(p) or f", {label}" in _exprs(p) for p in panels), label


def test_gpu_load_per_node_puts_dcgm_utilization_next_to_the_tier_label() -> None:
    _, dashboard = _dashboard()
    panels = [p for p in _panels(dashboard) if "DCGM_FI_DEV_GPU_UTIL" in _exprs(p)]
    assert panels
    for panel in panels:
        expr = _exprs(panel)
        assert "kube_node_labels" in expr and "label_gpugate_io_gpu_load" in expr
        assert "group_left" in expr  # the tier is joined onto each node's utilization
        assert '"Hostname"' in expr and '"hostname"' in expr  # both dcgm-exporter label spellings
    assert any(p["type"] == "table" for p in panels)
