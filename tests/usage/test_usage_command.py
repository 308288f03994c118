"""``gpugate usage`` against a real Prometheus that scrapes the pages and evaluates the shipped rules.

Prometheus (Debian's) scrapes dcgm-exporter's page and two balancer replicas' pages of the second
hour of ``tests/usage/scenario.py`` every 500 ms and evaluates ``usage-rules.yaml`` every second
(the shipped interval is a minute; only the interval is changed). The command then reads a few
seconds of GPU-hours back: what it prints is Prometheus' arithmetic, checked here by its ratios
(each pod's used share is its devices' activity; 4 GPUs against 1) and the identity line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml
from click.testing import CliRunner

from tests.dcgmexporter import Exporter, render
from tests.promserver import Prometheus
from tests.usage import scenario
from tests.usage.cluster import T0, records
from tests.usage.recording import balancer_page
from tests.usage.test_usage_rules import rule_groups
from webhook.cli import main
from webhook.usage import idle
from webhook.usage.idle import Measurement

NOW = T0 + 4 * 3600


@dataclass
class Stack:
    prometheus: Prometheus
    pages: list[Exporter]


def idle_decisions() -> list[idle.Decision]:
    """The balancer's look: notebook-0 measured idle (the defaults: report)."""
    pods, _ = scenario.objects(True)
    found = records(pods)
    rules = {r.key: idle.rule_for(r, None) for r in found}
    snap = scenario.snapshots()[True]
    measured = {7200: {"team-a/notebook-0": Measurement(highest=0.012, mean=0.01, coverage=1.0)}}
    return idle.plan(idle.find(found, idle.held_gpus(snap.holdings), rules, measured, NOW), evictions_left=0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("usage-prometheus")
    groups = rule_groups()
    groups["groups"][0]["interval"] = "1s"
    rules = workdir / "usage.rules.yaml"
    rules.write_text(yaml.safe_dump(groups, sort_keys=False, width=100000))
    dcgm, b1, b2 = Exporter(), Exporter(), Exporter()
    pods, claims = scenario.objects(True)
    dcgm.show_text(render(scenario.readings(True)))
    page = balancer_page(scenario.NODES, pods, scenario.SLICES, claims, idle_decisions())
    b1.show_text(page)
    b2.show_text(page)
    prometheus = None
    try:
        prometheus = Prometheus(workdir, {"nvidia-dcgm-exporter": [dcgm.target],
                                          "gpugate-balancer": [b1.target, b2.target]},
                                interval="500ms", rule_files=[rules], evaluation_interval="1s")
        prometheus.wait_for("owner:gpugate_gpu_allocated:gpus")
        time.sleep(6)  # six evaluations: a 5 s window is full
        yield Stack(prometheus, [dcgm, b1, b2])
    finally:
        if prometheus is not None:
            prometheus.stop()
        for exporter in (dcgm, b1, b2):
            exporter.stop()


def usage(stack: Stack, *args: str) -> str:
    result = CliRunner().invoke(main, ["usage", "--prometheus", stack.prometheus.url, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_gpu_hours_per_owner_follow_holdings_and_activity_and_add_up(stack: Stack) -> None:
    found = json.loads(usage(stack, "--since", "5s", "--step", "1s", "-o", "json"))
    owners = {(o["namespace"], o["owner_kind"], o["owner"]): o for o in found["owners"]}
    train, notebook = owners[("team-a", "Deployment", "train")], owners[("team-a", "StatefulSet", "notebook")]
    assert train["allocated"] == pytest.approx(4 * notebook["allocated"])
    assert train["used"] / train["allocated"] == pytest.approx(0.8)
    assert notebook["used"] / notebook["allocated"] == pytest.approx(0.01)
    assert owners[("team-d", "Job", "batch-1")]["by_kind"] == {"share": pytest.approx(
        owners[("team-d", "Job", "batch-1")]["allocated"])}
    legacy = owners[("team-e", "Pod", "legacy")]  # its GPU's series name no pod: unmeasured, not idle
    assert legacy["used"] == legacy["idle"] == 0 and legacy["unmeasured"] == pytest.approx(legacy["allocated"])
    assert found["identity_error"] == pytest.approx(0, abs=1e-9)
    assert found["physical"] == pytest.approx(20 * found["allocated"] / 8)  # 8 of 20 GPUs held


def test_the_table_ends_with_the_identity_and_csv_has_one_row_per_owner(stack: Stack) -> None:
    table = usage(stack, "--since", "5s", "--step", "1s")
    assert table.splitlines()[0].split() == ["NAMESPACE", "OWNER", "UNITS", "ALLOCATED", "USED", "IDLE",
                                             "UNMEASURED", "USED%"]
    assert "allocated + unallocated = " in table and ": adds up, 0.00% from physical." in table
    rows = usage(stack, "--since", "5s", "--step", "1s", "-o", "csv").splitlines()
    assert rows[0].startswith("namespace,owner_kind,owner,allocated_gpu_hours")
    assert len(rows) == 1 + 7  # train, notebook, legacy, dev-1, dev-2 (bare pods own themselves), llm, batch-1
    assert any(r.startswith("team-c,Pod,dev-1,") for r in rows)


def test_idle_lists_the_balancers_findings(stack: Stack) -> None:
    lines = usage(stack, "--idle").splitlines()
    assert lines[0].split() == ["NAMESPACE", "OWNER", "POD", "GPUS", "MEAN", "MAX", "FOR", "POLICY", "ACTION"]
    assert lines[1].split() == ["team-a", "StatefulSet/notebook", "notebook-0", "1", "1.0%", "1.2%", "2h", "(default)",
                                "report"]
    [found] = json.loads(usage(stack, "--idle", "-o", "json"))
    assert found["pod"] == "notebook-0" and found["action"] == "report"


def test_prometheus_down_is_an_error_naming_it() -> None:
    result = CliRunner().invoke(main, ["usage", "--prometheus", "http://127.0.0.1:9", "--timeout", "2"])
    assert result.exit_code == 1 and "http://127.0.0.1:9" in result.output


@pytest.mark.parametrize("since", ["1.5h", "0s", "yesterday"])
def test_a_window_that_is_no_duration_is_a_usage_error(since: str) -> None:
    result = CliRunner().invoke(main, ["usage", "--prometheus", "http://127.0.0.1:9", "--since", since])
    assert result.exit_code == 2 and "duration" in result.output
