"""The gpugate-usage recording rules on two recorded hours, evaluated by Prometheus' own ``promtool test rules``.

The recorded series are pages the real renderers wrote (``tests/usage/scenario.py``: dcgm-exporter's
format and the balancer's collector, two replicas of it), scraped as a ServiceMonitor labels them.
Every answer is whole (promtool fails on a missing or an extra sample) and computed independently
in Python from the same holdings. Checked: GPU-hours allocated, used and idle per namespace, owner
and unit kind as ``gpugate usage`` asks them; the identity allocated + unallocated = physical
(here exact: within 1 % is what the command checks); each pod's activity and idle measurement as
the balancer asks them.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.helpers import MANIFESTS
from tests.promserver import binary
from tests.usage import scenario
from webhook.usage import promql, report

RULES = MANIFESTS / "observability" / "usage-rules.yaml"
EVAL = "120m"
WINDOW = report.Window(seconds=7200, step=60)
STEPS = range(0, scenario.STEPS)
"""The steps a [2h:1m] subquery at 120m samples: Prometheus 2's ranges include both ends."""


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's ``spec``: the rule file Prometheus itself would load."""
    return dict(yaml.safe_load(RULES.read_text())["spec"])


def test_the_shipped_rules_are_the_expressions_of_the_usage_core() -> None:
    [group] = rule_groups()["groups"]
    assert group["interval"] == promql.RULE_INTERVAL
    assert [(r["record"], r["expr"]) for r in group["rules"]] == promql.recording_rules()


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    file = tmp_path / "usage.rules.yaml"
    file.write_text(yaml.safe_dump(rule_groups(), sort_keys=False, width=100000))
    done = subprocess.run([str(binary("promtool")), "check", "rules", str(file)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def rounded(expr: str) -> str:
    """promtool compares floats exactly and sums in its own order: both sides are rounded to 1e-9."""
    return f"round({expr}, 1e-9)"


def near(value: float) -> float:
    """What Prometheus' ``round(v, 1e-9)`` gives for ``value`` (``funcRound``: floor(v / to + 0.5) * to)."""
    inverse = 1 / 1e-9
    return math.floor(value * inverse + 0.5) / inverse


def _owner(key: tuple[str, str, str, str]) -> str:
    namespace, kind, name, unit = key
    return f'{{pod_namespace="{namespace}",owner_kind="{kind}",owner_name="{name}",kind="{unit}"}}'


def _samples(values: dict[tuple[str, str, str, str], float]) -> list[dict[str, Any]]:
    return [{"labels": _owner(k), "value": near(v)} for k, v in sorted(values.items())]


def usage_tests() -> list[dict[str, Any]]:
    """What ``gpugate usage --since 2h`` asks, with the answers the Python integration gives."""
    want = scenario.expected(STEPS)
    queries = report.usage_queries(WINDOW)
    identity = f'(sum({queries["allocated"]}) + ({queries["unallocated"]})) / ({queries["physical"]})'
    return [{"expr": rounded(queries["allocated"]), "eval_time": EVAL, "exp_samples": _samples(want.allocated)},
            {"expr": rounded(queries["used"]), "eval_time": EVAL, "exp_samples": _samples(want.used)},
            {"expr": rounded(queries["idle"]), "eval_time": EVAL, "exp_samples": _samples(want.idle)},
            {"expr": rounded(queries["unallocated"]), "eval_time": EVAL,
             "exp_samples": [{"labels": "{}", "value": near(want.unallocated)}]},
            {"expr": rounded(queries["physical"]), "eval_time": EVAL,
             "exp_samples": [{"labels": "{}", "value": near(want.physical)}]},
            {"expr": rounded(identity), "eval_time": EVAL, "exp_samples": [{"labels": "{}", "value": near(1.0)}]}]


def _pod(namespace: str, name: str, *, record: str = "") -> str:
    named = f'__name__="{record}",' if record else ""
    return f'{{{named}pod_namespace="{namespace}",pod_name="{name}"}}'


SECOND_HOUR_PODS = {("team-a", "train-6b7c-a1"), ("team-a", "notebook-0"), ("team-c", "dev-1"), ("team-c", "dev-2"),
                    ("team-d", "llm-5f-b2"), ("team-d", "batch-1-d4")}


def measurement_tests() -> list[dict[str, Any]]:
    """Each pod's activity now (the rule), and the balancer's idle measurement over the two hours."""
    now = [{"labels": _pod(ns, name, record=promql.POD_ACTIVITY), "value": scenario.ACTIVITY[name]}
           for ns, name in sorted(SECOND_HOUR_PODS)]
    query = promql.IdleQuery(window=7200, step=60)
    exprs = query.exprs()
    # Samples: the steps of its hour, and one more for the first hour's pod, whose last scrape an
    # activity range ending at the switch still holds.
    first = {("team-b", "infer-77-c3"): scenario.SWITCH + 1}
    later = {("team-d", "batch-1-d4"): scenario.STEPS - scenario.SWITCH}
    counts = {pod: first.get(pod, later.get(pod, scenario.STEPS)) for pod in SECOND_HOUR_PODS | set(first)}
    highest = [{"labels": _pod(ns, name), "value": scenario.ACTIVITY[name]} for ns, name in sorted(counts)]
    counted = [{"labels": _pod(ns, name), "value": n} for (ns, name), n in sorted(counts.items())]
    return [{"expr": promql.POD_ACTIVITY, "eval_time": EVAL, "exp_samples": now},
            {"expr": exprs["max_over_time"], "eval_time": EVAL, "exp_samples": highest},
            {"expr": exprs["count_over_time"], "eval_time": EVAL, "exp_samples": counted}]


def promtool_test(tmp_path: Path, groups: dict[str, Any], cases: list[dict[str, Any]]) -> subprocess.CompletedProcess:
    rules = tmp_path / "usage.rules.yaml"
    rules.write_text(yaml.safe_dump(groups, sort_keys=False, width=100000))
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m",
             "tests": [{"name": "two recorded hours", "interval": "1m",
                        "input_series": scenario.record().input_series(), "promql_expr_test": cases}]}
    file = tmp_path / "usage.test.yaml"
    file.write_text(yaml.safe_dump(tests, sort_keys=False, width=100000))
    return subprocess.run([str(binary("promtool")), "test", "rules", str(file)], capture_output=True, text=True,
                          timeout=300)


def test_promtool_evaluates_the_recorded_hours_to_the_integrated_answers(tmp_path: Path) -> None:
    done = promtool_test(tmp_path, rule_groups(), usage_tests() + measurement_tests())
    if done.returncode != 0:
        pytest.fail(f"promtool test rules:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}", pytrace=False)


def test_the_identity_catches_holdings_counted_once_per_balancer_replica(tmp_path: Path) -> None:
    """Summing the two replicas' series instead of taking their max bills every GPU twice: the
    identity check fails (as it would for a slot billed as a whole GPU, OpenCost's mistake)."""
    groups = rule_groups()
    [group] = groups["groups"]
    for rule in group["rules"]:
        rule["expr"] = rule["expr"].replace("max by (node, pod_namespace", "sum by (node, pod_namespace")
    done = promtool_test(tmp_path, groups, usage_tests()[-1:])
    got = re.search(r"got: \{\} ([0-9.E+-]+)", done.stdout + done.stderr)
    assert done.returncode != 0 and got, done.stdout + done.stderr
    assert float(got.group(1)) > 1 + report.IDENTITY_TOLERANCE


def test_the_recorded_hours_add_up_within_one_percent() -> None:
    """The identity the command checks, on the integrated answers (promtool holds them equal above)."""
    want = scenario.expected(STEPS)
    allocated = sum(want.allocated.values())
    assert abs(allocated + want.unallocated - want.physical) / want.physical < report.IDENTITY_TOLERANCE
    assert want.physical == pytest.approx(20 * scenario.STEPS / 60)


def test_every_recorded_series_the_dashboard_reads_is_a_shipped_rule() -> None:
    from tests.manifests.dashboard import dashboard_exprs

    read = set(re.findall(r"[a-z]+:gpugate_[a-z_]+:[a-z]+", "\n".join(dashboard_exprs())))
    assert read and read <= {record for record, _ in promql.recording_rules()}, read
