"""Every PromQL expression gpugate ships, evaluated by Prometheus' own ``promtool test rules``.

The dashboard's targets (``manifests/observability/dashboard.json``, ``$__rate_interval`` as
Grafana fills it in), the alerting rules (``alerts.rules.yaml``) and the balancer's own DCGM
queries (``webhook.balancer.prometheus.query_text``) run on one set of recorded series: two
webhook and two balancer replicas (``b-1`` leads), kube-state-metrics' node labels, dcgm-exporter
series (whole GPUs, a GPU in MIG instances, a host under both label spellings, a pre-Volta GPU
without profiling metrics) and Argo CD's and the GPU Operator's series. Each expression's whole
answer is given (promtool fails on a missing or an extra sample), and a test fails unless every
dashboard target has its expected answer here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.dashboard import ALERTS, targets
from tests.promserver import binary
from webhook.balancer.prometheus import PROFILING_METRIC, UTIL_METRIC, query_text

EVAL = "20m"
NOW = 1200  # time() at EVAL
W1 = 'job="gpugate-webhook",namespace="gpugate-system",pod="w-1",instance="10.0.0.1:9090"'
W2 = 'job="gpugate-webhook",namespace="gpugate-system",pod="w-2",instance="10.0.0.2:9090"'
B1 = 'job="gpugate-balancer",namespace="gpugate-system",pod="b-1",instance="10.0.1.1:8080"'
B2 = 'job="gpugate-balancer",namespace="gpugate-system",pod="b-2",instance="10.0.1.2:8080"'
KSM = 'job="kube-state-metrics",namespace="monitoring",pod="ksm-0",instance="10.0.2.1:8080"'
DCGM = 'job="nvidia-dcgm-exporter",namespace="gpu-operator",pod="nvidia-dcgm-exporter-x",instance="10.0.3.1:9400"'
ARGO = 'job="argocd-metrics",namespace="argocd",instance="10.0.4.1:8082"'
OPERATOR = 'job="gpu-operator",namespace="gpu-operator",instance="10.0.5.1:8080"'


def gpu(name: str, host: str, index: int, value: float, *, spelling: str = "Hostname", profile: str = "",
        instance: int = 0) -> tuple[str, str]:
    """One dcgm-exporter series (labels as tests/dcgmexporter.py documents them), constant."""
    mig = f',GPU_I_PROFILE="{profile}",GPU_I_ID="{instance}"' if profile else ""
    return (f'{name}{{gpu="{index}",UUID="GPU-{host}-{index}",pci_bus_id="00000000:{index:02X}:00.0",'
            f'device="nvidia{index}",modelName="NVIDIA H100 80GB HBM3"{mig},{spelling}="{host}",'
            f'DCGM_FI_DRIVER_VERSION="580.95.05",{DCGM}}}', f"{value}+0x80")


# 15 s apart, 0..20 min: a counter "0+15x80" grows 1/s.
SERIES: list[tuple[str, str]] = [
    (f'gpugate_admissions_total{{endpoint="/mutate",operation="CREATE",policy="train@r1",result="allowed",{W1}}}',
     "0+15x80"),
    (f'gpugate_admissions_total{{endpoint="/mutate",operation="CREATE",policy="train@r1",result="allowed",{W2}}}',
     "0+30x80"),
    (f'gpugate_admissions_total{{endpoint="/mutate",operation="CREATE",policy="train@r1",result="denied",{W1}}}',
     "0+3x80"),
    (f'gpugate_admission_duration_seconds_bucket{{endpoint="/mutate",result="allowed",policy="train",le="0.005",{W1}}}',
     "0+12x80"),
    (f'gpugate_admission_duration_seconds_bucket{{endpoint="/mutate",result="allowed",policy="train",le="0.01",{W1}}}',
     "0+15x80"),
    (f'gpugate_admission_duration_seconds_bucket{{endpoint="/mutate",result="allowed",policy="train",le="+Inf",{W1}}}',
     "0+15x80"),
    (f"gpugate_policy_reloads_total{{{W1}}}", "0+0.25x80"),
    (f"gpugate_policy_reload_errors_total{{{W1}}}", "0+0x80"),
    # Both balancer replicas compute tiers; b-1 holds the Lease, b-2's view lags.
    *[(f'gpugate_balancer_nodes{{tier="{tier}",{b}}}', f"{n}+0x80")
      for b, counts in ((B1, (3, 2, 1)), (B2, (4, 1, 0))) for tier, n in zip(("idle", "busy", "congested"), counts,
                                                                             strict=True)],
    (f"gpugate_balancer_leader{{{B1}}}", "1+0x80"),
    (f"gpugate_balancer_leader{{{B2}}}", "0+0x80"),
    (f'gpugate_balancer_label_writes_total{{result="ok",{B1}}}', "0+15x80"),
    (f'gpugate_balancer_label_writes_total{{result="conflict",{B1}}}', "0+1.5x80"),
    (f"gpugate_balancer_coalesced_writes_total{{{B1}}}", "0+7.5x80"),
    (f"gpugate_balancer_pending_writes{{{B1}}}", "4+0x80"),
    (f"gpugate_balancer_pending_writes{{{B2}}}", "9+0x80"),
    (f'gpugate_balancer_api_errors_total{{operation="patch_node",{B1}}}', "0+0.75x80"),
    (f'gpugate_balancer_api_errors_total{{operation="list_pods",{B2}}}', "0+1.5x80"),
    (f'gpugate_balancer_relists_total{{resource="pods",{B1}}}', "0+0.25x80"),
    (f"gpugate_balancer_prometheus_last_success_timestamp_seconds{{{B1}}}", f"{NOW - 30}+0x80"),
    (f"gpugate_balancer_prometheus_last_success_timestamp_seconds{{{B2}}}", "0+0x80"),
    (f"gpugate_balancer_prometheus_up{{{B1}}}", "1+0x80"),
    (f"gpugate_balancer_prometheus_up{{{B2}}}", "0+0x80"),
    (f"gpugate_balancer_allocation_only{{{B1}}}", "0+0x80"),
    (f"gpugate_balancer_allocation_only{{{B2}}}", "1+0x80"),
    (f"gpugate_balancer_seconds_since_last_full_sync{{{B1}}}", "12+0x80"),
    (f"gpugate_balancer_seconds_since_last_full_sync{{{B2}}}", "700+0x80"),
    (f'gpugate_balancer_extender_requests_total{{verb="prioritize",result="ok",{B1}}}', "0+30x80"),
    (f'gpugate_balancer_extender_requests_total{{verb="prioritize",result="ok",{B2}}}', "0+15x80"),
    (f'gpugate_balancer_extender_requests_total{{verb="prioritize",result="not_ready",{B2}}}', "0+1.5x80"),
    (f'gpugate_balancer_extender_requests_total{{verb="filter",result="ok",{B1}}}', "0+150x80"),
    (f'gpugate_balancer_extender_request_duration_seconds_bucket{{verb="prioritize",le="0.001",{B1}}}', "0+24x80"),
    (f'gpugate_balancer_extender_request_duration_seconds_bucket{{verb="prioritize",le="0.002",{B1}}}', "0+30x80"),
    (f'gpugate_balancer_extender_request_duration_seconds_bucket{{verb="prioritize",le="+Inf",{B1}}}', "0+30x80"),
    (f"gpugate_balancer_extender_serving{{{B1}}}", "1+0x80"),
    (f"gpugate_balancer_extender_serving{{{B2}}}", "0+0x80"),
    (f"up{{{B1}}}", "1+0x80"),
    (f"up{{{B2}}}", "0+0x80"),
    (f"up{{{W1}}}", "0+0x80"),
    (f"gpugate_balancer_inventory_last_write_timestamp_seconds{{{B1}}}", f"{NOW - 60}+0x80"),
    (f"gpugate_balancer_inventory_last_write_timestamp_seconds{{{B2}}}", "0+0x80"),
    # kube-state-metrics with --metric-labels-allowlist=nodes=[gpugate.io/gpu-load].
    *[(f'kube_node_labels{{node="{n}",label_gpugate_io_gpu_load="{t}",{KSM}}}', "1+0x80")
      for n, t in (("n-whole", "idle"), ("n-mixed", "idle"), ("n-spell", "busy"), ("n-old", "busy"),
                   ("n-nodata", "busy"))],
    (f'kube_node_labels{{node="n-cpu",label_gpugate_io_gpu_load="",{KSM}}}', "1+0x80"),
    # dcgm-exporter: two whole GPUs; a whole GPU next to one cut in seven 1g instances; one GPU
    # reported under both spellings (an exporter upgrade); a pre-Volta GPU (GPU_UTIL only).
    gpu(PROFILING_METRIC, "n-whole", 0, 0.2), gpu(PROFILING_METRIC, "n-whole", 1, 0.6),
    gpu(UTIL_METRIC, "n-whole", 0, 99), gpu(UTIL_METRIC, "n-whole", 1, 99),
    gpu(PROFILING_METRIC, "n-mixed", 0, 1.0), gpu(UTIL_METRIC, "n-mixed", 0, 100),
    *[gpu(PROFILING_METRIC, "n-mixed", 1, 0.0, profile="1g.10gb", instance=i) for i in range(1, 8)],
    gpu(PROFILING_METRIC, "n-spell", 0, 0.2), gpu(PROFILING_METRIC, "n-spell", 0, 0.8, spelling="hostname"),
    gpu(UTIL_METRIC, "n-old", 0, 55),
    (f'argocd_app_info{{name="gpugate-webhook",project="gpugate",sync_status="Synced",health_status="Healthy",'
     f'dest_namespace="gpugate-system",{ARGO}}}', "1+0x80"),
    (f'argocd_app_info{{name="gpugate-gpu-operator",project="gpugate",sync_status="OutOfSync",'
     f'health_status="Progressing",dest_namespace="gpu-operator",{ARGO}}}', "1+0x80"),
    (f'argocd_app_info{{name="unrelated",project="default",sync_status="Synced",health_status="Healthy",'
     f'dest_namespace="default",{ARGO}}}', "1+0x80"),
    (f'argocd_app_sync_total{{name="gpugate-webhook",project="gpugate",phase="Succeeded",{ARGO}}}', "0+0.25x80"),
    (f'argocd_app_sync_total{{name="gpugate-gpu-operator",project="gpugate",phase="Failed",{ARGO}}}', "2+0x80"),
    *[(f"gpu_operator_nodes_upgrades_{state}{{{OPERATOR}}}", f"{n}+0x80")
      for state, n in (("pending", 3), ("available", 1), ("in_progress", 2), ("done", 5), ("failed", 1))],
    (f"gpu_operator_reconciliation_status{{{OPERATOR}}}", "1+0x80"),
    (f"gpu_operator_driver_auto_upgrade_enabled{{{OPERATOR}}}", "1+0x80"),
    # Idle allocations: the leader's last look (b-2, a standby, exports none) and its writes; it
    # paused for Prometheus at its last look, b-2 for being a standby.
    (f'gpugate_balancer_idle_gpus{{pod_namespace="team-a",owner_kind="StatefulSet",owner_name="notebook",{B1}}}',
     "1+0x80"),
    (f'gpugate_balancer_idle_gpus{{pod_namespace="team-b",owner_kind="Deployment",owner_name="infer",{B1}}}',
     "2.5+0x80"),
    (f'gpugate_balancer_idle_actions_total{{action="evict",result="ok",{B1}}}', "0+0.25x80"),
    (f'gpugate_balancer_idle_actions_total{{action="event",result="ok",{B1}}}', "0+0.5x80"),
    *[(f'gpugate_balancer_idle_paused{{reason="{r}",{b}}}', f"{int(on)}+0x80")
      for b, paused in ((B1, "prometheus"), (B2, "standby")) for r in ("standby", "prometheus", "dry_run")
      for on in (r == paused,)],
    # The gpugate-usage recording rules' series (evaluated themselves in tests/usage/test_usage_rules.py).
    *[(f'owner:gpugate_gpu_{m}:gpus{{pod_namespace="team-a",owner_kind="{k}",owner_name="{o}",kind="whole"}}',
       f"{v}+0x80")
      for m, k, o, v in (("allocated", "Deployment", "train", 4), ("allocated", "StatefulSet", "notebook", 1),
                         ("used", "Deployment", "train", 3.25), ("used", "StatefulSet", "notebook", 0.25),
                         ("idle", "Deployment", "train", 0.75), ("idle", "StatefulSet", "notebook", 0.75))],
    *[(f'node:gpugate_gpu_{m}:gpus{{node="n-whole"}}', f"{v}+0x80")
      for m, v in (("allocated", 5), ("unallocated", 3), ("physical", 8))],
]

BY_POLICY = '{{policy="train@r1",result="{}"}}'
DCGM_NODES = {"n-whole": 0.4, "n-mixed": 0.5, "n-spell": 0.5}
"""Per physical GPU, then per node: n-mixed is half busy (its MIG GPU is one GPU, not seven);
n-spell's one GPU under two spellings is one GPU (the mean of both)."""
TIERED = {**DCGM_NODES, "n-old": 0.55}
TIERS = {"n-whole": "idle", "n-mixed": "idle", "n-spell": "busy", "n-old": "busy"}
PER_NODE = [(f'{{label_gpugate_io_gpu_load="{TIERS[n]}",node="{n}"}}', v) for n, v in TIERED.items()]

IDLE_BY_OWNER = [('{pod_namespace="team-b",owner_kind="Deployment",owner_name="infer"}', 2.5),
                 ('{pod_namespace="team-a",owner_kind="StatefulSet",owner_name="notebook"}', 1)]
"""The leader's idle GPUs by owner, largest first (the panel sorts them)."""

EXPECTED: dict[tuple[int, str], list[tuple[str, float]]] = {
    (2, "A"): [(BY_POLICY.format("allowed"), 3), (BY_POLICY.format("denied"), 0.2)],
    (3, "A"): [('{endpoint="/mutate",policy="train",result="allowed"}', 0.00975)],
    (3, "B"): [('{endpoint="/mutate",policy="train",result="allowed"}', 0.003125)],
    (4, "A"): [("{}", 1)],
    (4, "B"): [("{}", 0)],
    (6, "A"): [('{tier="idle"}', 3), ('{tier="busy"}', 2), ('{tier="congested"}', 1)],  # the leader's only
    (7, "A"): PER_NODE,
    (8, "A"): PER_NODE,
    (10, "A"): [('{pod="b-1"}', 1), ('{pod="b-2"}', 0)],
    (11, "A"): [('{result="ok"}', 1), ('{result="conflict"}', 0.1)],
    (11, "B"): [("{}", 0.5)],
    (11, "C"): [("{}", 4)],
    (12, "A"): [('{operation="patch_node"}', 0.05), ('{operation="list_pods"}', 0.1)],
    (13, "A"): [('{resource="pods"}', 1)],
    (14, "A"): [('{pod="b-1"}', 30)],  # b-2 never succeeded: no age rather than 20 minutes
    (14, "B"): [('{pod="b-1"}', 0), ('{pod="b-2"}', 1)],
    (15, "A"): [('{pod="b-1"}', 12), ('{pod="b-2"}', 700)],
    (17, "A"): [('{result="ok"}', 3), ('{result="not_ready"}', 0.1)],
    (18, "A"): [("{}", 0.000625)],
    (18, "B"): [("{}", 0.00195)],
    (19, "A"): [("{}", 1)],
    (19, "B"): [("{}", 1)],
    (20, "A"): [("{}", 60)],
    (902, "A"): [('{name="gpugate-webhook",sync_status="Synced",health_status="Healthy"}', 1),
                 ('{name="gpugate-gpu-operator",sync_status="OutOfSync",health_status="Progressing"}', 1)],
    (903, "A"): [('{name="gpugate-webhook",phase="Succeeded"}', 15),
                 ('{name="gpugate-gpu-operator",phase="Failed"}', 0)],
    (904, "A"): [("{}", 3)],
    (904, "B"): [("{}", 1)],
    (904, "C"): [("{}", 2)],
    (904, "D"): [("{}", 5)],
    (904, "E"): [("{}", 1)],
    (905, "A"): [("{}", 1)],
    (906, "A"): [("{}", 1)],
    (906, "B"): [("{}", 1)],
    (402, "A"): IDLE_BY_OWNER,
    **{(403, ref): [('{pod_namespace="team-a"}', gpus)] for ref, gpus in zip("ABC", (5, 3.5, 1.5), strict=True)},
    **{(404, ref): [("{}", gpus)] for ref, gpus in zip("ABC", (5, 3, 8), strict=True)},  # allocated, unallocated, all
    (405, "A"): [('{action="evict",result="ok"}', 1), ('{action="event",result="ok"}', 2)],
    (405, "B"): [('{reason="prometheus"}', 1)],  # the leader's reason only
}

BALANCER_QUERIES = [
    (query_text(PROFILING_METRIC, "5m"), [(f'{{node="{n}"}}', v) for n, v in DCGM_NODES.items()]),
    (query_text(UTIL_METRIC, "5m"), [('{node="n-whole"}', 99), ('{node="n-mixed"}', 100), ('{node="n-old"}', 55)]),
]
"""What ``gpugate balance`` sends, on the dashboard's series: the panel shows what the tiers read."""

ALERTS_NOW: list[dict[str, Any]] = [
    {"alertname": "GpugateBalancerNoLeader", "exp_alerts": []},
    {"alertname": "GpugateBalancerStale", "exp_alerts": []},  # b-2's 700 s are a standby's
    {"alertname": "GpugateBalancerWithoutUtilization", "exp_alerts": [{
        "exp_labels": {"severity": "warning", "pod": "b-2"},
        "exp_annotations": {
            "summary": "Balancer b-2 cannot query Prometheus: tiers from allocation only.",
            "description": "Check --prometheus (prometheus.url) and the NetworkPolicy between the balancer and "
                           "Prometheus."}}]},
    {"alertname": "GpugateNodeWithoutDCGMData", "exp_alerts": [{
        "exp_labels": {"severity": "warning", "node": "n-nodata"},
        "exp_annotations": {
            "summary": "No DCGM data for GPU node n-nodata: its gpugate tier reads allocation only.",
            "description": "Check the nvidia-dcgm-exporter pod on that node and its ServiceMonitor."}}]},
]


def _samples(expected: list[tuple[str, float]]) -> list[dict[str, Any]]:
    return [{"labels": labels, "value": value} for labels, value in expected]


def _series(series: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"series": s, "values": v} for s, v in series]


def promtool_tests() -> dict[str, Any]:
    """The ``promtool test rules`` file: one scenario for the dashboard, the balancer and the alerts,
    and two for the alerts that cannot fire in it (the leader stuck, no replica at all)."""
    dashboard = [{"expr": t.expr, "eval_time": EVAL, "exp_samples": _samples(EXPECTED[(t.panel, t.ref)])}
                 for t in targets()]
    balancer = [{"expr": q, "eval_time": EVAL, "exp_samples": _samples(want)} for q, want in BALANCER_QUERIES]
    stuck = [(f"gpugate_balancer_leader{{{B1}}}", "1+0x80"),
             (f"gpugate_balancer_seconds_since_last_full_sync{{{B1}}}", "100+15x80")]  # 1300 s at 20m
    return {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "15s",
        "tests": [
            {"name": "dashboard, balancer queries and alerts", "interval": "15s", "input_series": _series(SERIES),
             "promql_expr_test": dashboard + balancer,
             "alert_rule_test": [{"eval_time": EVAL, **a} for a in ALERTS_NOW]},
            {"name": "the leader stopped passing over the nodes", "interval": "15s", "input_series": _series(stuck),
             "alert_rule_test": [
                 # Over 600 s from 8m30s on (100 + 15 s per 15 s); pending 5 minutes, firing from 13m30s on.
                 {"eval_time": "13m", "alertname": "GpugateBalancerStale", "exp_alerts": []},
                 {"eval_time": EVAL, "alertname": "GpugateBalancerStale", "exp_alerts": [{
                     "exp_labels": {"severity": "warning"},
                     "exp_annotations": {
                         "summary": "The leading gpugate balancer last passed over every node 21m 40s ago.",
                         "description": "Its tiers are not being recomputed; see /readyz and the pod's log."}}]}]},
            {"name": "no balancer replica at all", "interval": "15s",
             "input_series": _series([(f"up{{{W1}}}", "1+0x80")]),
             "alert_rule_test": [{"eval_time": EVAL, "alertname": "GpugateBalancerNoLeader", "exp_alerts": [{
                 "exp_labels": {"severity": "critical"},
                 "exp_annotations": {
                     "summary": "No gpugate balancer replica leads; node load labels are frozen.",
                     "description": "Check the gpugate-balancer pods' logs and the Lease "
                                    "gpugate-system/gpugate-balancer."}}]}]},
        ],
    }


def test_every_dashboard_target_has_an_expected_answer() -> None:
    keys = [(t.panel, t.ref) for t in targets()]
    assert len(keys) == len(set(keys))
    assert set(keys) == set(EXPECTED), (sorted(set(keys) - set(EXPECTED)), sorted(set(EXPECTED) - set(keys)))


def test_the_alert_rules_are_valid_for_promtool() -> None:
    done = subprocess.run([str(binary("promtool")), "check", "rules", str(ALERTS)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    names = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    tested = {a["alertname"] for a in ALERTS_NOW}
    assert names == tested


def test_promtool_evaluates_every_expression_to_its_expected_answer(tmp_path: Path) -> None:
    promtool = binary("promtool")
    file = tmp_path / "gpugate.test.yaml"
    file.write_text(yaml.safe_dump(promtool_tests(), sort_keys=False, width=1000))
    done = subprocess.run([str(promtool), "test", "rules", str(file)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.fail(f"promtool test rules {file}:\n{done.stdout}\n{done.stderr}", pytrace=False)
