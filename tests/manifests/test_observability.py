"""The observability component: ServiceMonitors that find the Services, and the Grafana dashboard."""

from __future__ import annotations

import json
import re

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


def test_gpu_load_per_node_puts_what_the_tiers_read_next_to_the_tier_label() -> None:
    """Issue 13, item 8: the tiers read DCGM_FI_PROF_GR_ENGINE_ACTIVE first (DCGM_FI_DEV_GPU_UTIL / 100
    only where it is missing), averaged over the balancer's window: so must the GPU panels."""
    _, dashboard = _dashboard()
    panels = [p for p in _panels(dashboard) if "DCGM_" in _exprs(p)]
    assert panels
    for panel in panels:
        expr = _exprs(panel)
        assert "kube_node_labels" in expr and "label_gpugate_io_gpu_load" in expr
        assert "group_left" in expr  # the tier is joined onto each node's utilization
        assert '"Hostname"' in expr and '"hostname"' in expr  # both dcgm-exporter label spellings
        profiling, fallback = expr.find("DCGM_FI_PROF_GR_ENGINE_ACTIVE"), expr.find("DCGM_FI_DEV_GPU_UTIL")
        assert 0 <= profiling < fallback and "\n  or\n" in expr[profiling:fallback], panel["title"]
        assert "DCGM_FI_DEV_GPU_UTIL[5m])" in expr and ") / 100" in expr  # the fallback in the same 0..1 unit
        assert "avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[5m])" in expr
        assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert any(p["type"] == "table" for p in panels)


def test_nodes_per_tier_reads_the_leaders_series_only() -> None:
    """Both replicas compute tiers; summing their gauges showed every node twice."""
    _, dashboard = _dashboard()
    [panel] = [p for p in _panels(dashboard) if "gpugate_balancer_nodes" in _exprs(p)]
    expr = _exprs(panel)
    assert "gpugate_balancer_leader == 1" in expr and " and on (" in expr
    assert not expr.startswith("sum")


@pytest.mark.parametrize(("title_word", "metric"), [
    ("leader", "gpugate_balancer_leader"),
    ("API errors", "gpugate_balancer_api_errors_total"),
    ("relists", "gpugate_balancer_relists_total"),
    ("writes/s", "gpugate_balancer_label_writes_total"),
    ("writes/s", "gpugate_balancer_pending_writes"),
    ("freshness", "gpugate_balancer_prometheus_last_success_timestamp_seconds"),
    ("freshness", "gpugate_balancer_allocation_only"),
    # Issue 16: the scheduler extender's calls, latency, and whether any replica serves it.
    ("extender", "gpugate_balancer_extender_requests_total"),
    ("extender", "gpugate_balancer_extender_request_duration_seconds_bucket"),
    ("extender down", "gpugate_balancer_extender_serving"),
    # Issue 17: how old the GPUInventory the webhook right-sizes by is.
    ("inventory", "gpugate_balancer_inventory_last_write_timestamp_seconds"),
])
def test_dashboard_shows_the_balancers_health(title_word: str, metric: str) -> None:
    _, dashboard = _dashboard()
    assert [p for p in _panels(dashboard) if title_word.lower() in p["title"].lower() and metric in _exprs(p)], \
        f"no panel titled with {title_word!r} reads {metric}"


def test_every_balancer_series_the_dashboard_reads_exists() -> None:
    from prometheus_client import CollectorRegistry

    from webhook.balancer.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    known = {family.name + ("_total" if family.type == "counter" else "") for family in registry.collect()}
    known |= {family.name + suffix for family in registry.collect() if family.type == "histogram"
              for suffix in ("_bucket", "_count", "_sum")}
    _, dashboard = _dashboard()
    used = set(re.findall(r"gpugate_balancer_[a-z_]+", "\n".join(_exprs(p) for p in _panels(dashboard))))
    assert used and used <= known, sorted(used - known)


# --- issue 14: the GPU stack's rollout on the dashboard ---------------------------------------------

@pytest.mark.parametrize(("title_word", "metric", "labels"), [
    ("Argo CD", "argocd_app_info", {"sync_status", "health_status", "name"}),
    ("Argo CD", "argocd_app_sync_total", {"phase"}),
    ("Driver upgrade", "gpu_operator_nodes_upgrades_in_progress", set()),
    ("Driver upgrade", "gpu_operator_nodes_upgrades_pending", set()),
    ("Driver upgrade", "gpu_operator_nodes_upgrades_done", set()),
    ("Driver upgrade", "gpu_operator_nodes_upgrades_failed", set()),
    ("reconciliation", "gpu_operator_reconciliation_status", set()),
])
def test_dashboard_shows_the_gpu_stack_rollout(title_word: str, metric: str, labels: set[str]) -> None:
    """docs/gitops.md promises Argo CD sync state and the operator's upgrade progress on the dashboard;
    a failed driver upgrade is visible nowhere else (no status condition says it)."""
    _, dashboard = _dashboard()
    panels = [p for p in _panels(dashboard) if title_word.lower() in p["title"].lower() and metric in _exprs(p)]
    assert panels, f"no panel titled with {title_word!r} reads {metric}"
    assert all(label in _exprs(panels[0]) for label in labels)
    if "argocd_" in metric:
        assert 'project="gpugate"' in _exprs(panels[0])


def test_a_failed_driver_upgrade_turns_a_panel_red() -> None:
    _, dashboard = _dashboard()
    [stat] = [p for p in _panels(dashboard)
              if p["type"] == "stat" and "gpu_operator_nodes_upgrades_failed" in _exprs(p)]
    steps = stat["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": 1}
