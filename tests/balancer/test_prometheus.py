"""The DCGM query edge against a real Prometheus scraping pages shaped like dcgm-exporter's.

Prometheus (Debian's package; ``.ci/run`` installs it) evaluates every query here: nothing in
the test decides what an expression answers. The exporter pages come from
``tests/dcgmexporter.py`` (its docstring cites dcgm-exporter's source for each label). Each test
uses host names of its own, so the one Prometheus of the module serves all of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.dcgmexporter import Device, Exporter, Pod, Reading, mig_gpu, respelled, whole_gpus
from tests.promserver import Prometheus
from webhook.balancer.prometheus import (
    PROFILING_METRIC,
    UTIL_METRIC,
    PrometheusClient,
    PrometheusError,
    parse_vector,
    query_text,
)
from webhook.localcluster.processes import free_port

SCRAPE = "500ms"


@dataclass
class Stack:
    prometheus: Prometheus
    old: Exporter
    """dcgm-exporter as released: ``Hostname``."""
    new: Exporter
    """A second exporter target (the upgraded DaemonSet's pod, ``hostname``) on the same Prometheus."""

    def client(self, window: str = "5m") -> PrometheusClient:
        return PrometheusClient(self.prometheus.url, window=window, timeout=5)

    def scraped(self, *exporters: Exporter) -> None:
        """Wait until each exporter was scraped twice since now: its current page is in Prometheus."""
        start = [e.scrapes for e in exporters]
        deadline = time.monotonic() + 20
        while any(e.scrapes < s + 2 for e, s in zip(exporters, start, strict=True)):
            assert time.monotonic() < deadline, f"no scrape in 20 s:\n{self.prometheus.process.tail()}"
            time.sleep(0.05)
        time.sleep(0.1)  # the scrape's samples are appended right after the page is read


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    old, new = Exporter(), Exporter()
    prometheus = None
    try:
        prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"),
                                {"nvidia-dcgm-exporter": [old.target, new.target]}, interval=SCRAPE)
        yield Stack(prometheus, old, new)
    finally:
        if prometheus is not None:
            prometheus.stop()
        old.stop()
        new.stop()


def test_profiling_metric_wins_and_gpu_util_fills_in_for_gpus_without_it(stack: Stack) -> None:
    stack.old.show([*whole_gpus("pf-1", [0.42, 0.42]),
                    *whole_gpus("pf-2", [0.9]),
                    # A pre-Volta GPU: no DCGM_FI_PROF_* fields, GPU_UTIL alone.
                    Reading(device=Device(host="pf-3", gpu=0, model="Tesla P100-PCIE-16GB"), active=None, util=55)])
    stack.new.show([])
    stack.scraped(stack.old)
    result = stack.client().utilization()
    assert {h: round(v, 6) for h, v in result.by_host.items()} == {"pf-1": 0.42, "pf-2": 0.9, "pf-3": 0.55}
    assert result.source == {"pf-1": PROFILING_METRIC, "pf-2": PROFILING_METRIC, "pf-3": UTIL_METRIC}


def test_each_physical_gpu_weighs_the_same_whole_or_cut_into_mig_instances(stack: Stack) -> None:
    """One saturated whole GPU next to one idle GPU in seven 1g instances is half the node busy:
    averaging the eight series alike (as the query grouped by host only did) said 1/8."""
    stack.old.show([*whole_gpus("mx-1", [1.0]),
                    *mig_gpu("mx-1", 1, "1g.10gb", [0.0] * 7),
                    # A node all in MIG: two GPUs, one with its 3g instances saturated.
                    *mig_gpu("mg-1", 0, "3g.40gb", [1.0, 1.0]),
                    *mig_gpu("mg-1", 1, "3g.40gb", [0.0, 0.2])])
    stack.new.show([])
    stack.scraped(stack.old)
    by_host = stack.client().utilization().by_host
    assert by_host["mx-1"] == pytest.approx(0.5)
    assert by_host["mg-1"] == pytest.approx((1.0 + 0.1) / 2)
    # MIG instances export no GPU_UTIL: the fallback metric has only the whole GPU of mx-1.
    util = {s["metric"]["node"]: float(s["value"][1]) for s in stack.prometheus.query(query_text(UTIL_METRIC, "5m"))}
    assert util["mx-1"] == 100 and "mg-1" not in util


def test_a_host_under_both_label_spellings_is_one_node_and_its_gpus_count_once(stack: Stack) -> None:
    """An exporter upgrade: the released exporter writes Hostname, the next one hostname, both for
    the same GPUs. Grouped by both labels the answer held the host twice and one overwrote the other."""
    before = whole_gpus("sp-1", [0.2, 0.2, 0.2, 0.2])
    after = respelled(whole_gpus("sp-1", [0.8, 0.8, 0.8, 0.8]), "hostname")
    stack.old.show([*before, *whole_gpus("sp-2", [0.3])])
    stack.new.show([*after, *respelled(whole_gpus("sp-3", [0.6]), "hostname")])
    stack.scraped(stack.old, stack.new)
    answer = stack.prometheus.query(query_text(PROFILING_METRIC, "5m"))
    assert sorted(n for s in answer if (n := s["metric"]["node"]).startswith("sp-")) == ["sp-1", "sp-2", "sp-3"]
    by_host = {h: v for h, v in stack.client().utilization().by_host.items() if h.startswith("sp-")}
    assert by_host == pytest.approx({"sp-1": 0.5, "sp-2": 0.3, "sp-3": 0.6})


def test_a_pod_taking_a_gpu_renames_its_series_but_it_stays_one_gpu(stack: Stack) -> None:
    """dcgm-exporter adds pod/namespace/container while a pod holds the GPU: a new series. Prometheus
    renames them exported_* (honor_labels false: the target's own pod label wins)."""
    idle = whole_gpus("pd-1", [0.0, 0.0])
    stack.old.show(idle)
    stack.new.show([])
    stack.scraped(stack.old)
    held = Reading(device=Device(host="pd-1", gpu=0, pod=Pod(name="train-0", namespace="ml")), active=1.0)
    stack.old.show([held, idle[1]])
    stack.scraped(stack.old)
    series = stack.prometheus.query(f'{PROFILING_METRIC}{{Hostname="pd-1", gpu="0"}}[5m]')
    assert len(series) == 2  # the GPU's series before and after the pod took it
    owned = [s["metric"] for s in series if "exported_pod" in s["metric"]]
    assert [(m["exported_pod"], m["exported_namespace"], m["pod"]) for m in owned] == [
        ("train-0", "ml", "nvidia-dcgm-exporter-00000")]
    # GPU 0: the mean of its two series (0 and 1); GPU 1: 0. Three series alike would say 1/3.
    assert stack.client().utilization().by_host["pd-1"] == pytest.approx(0.25)


def test_an_error_answer_is_a_prometheus_error(stack: Stack) -> None:
    with pytest.raises(PrometheusError, match="parse error"):
        stack.client(window="5x").utilization()


def test_unreachable_prometheus_is_a_prometheus_error() -> None:
    with pytest.raises(PrometheusError):
        PrometheusClient(f"http://127.0.0.1:{free_port()}", window="5m", timeout=1).utilization()


# --- parse_vector alone: what it keeps of an answer (no query is evaluated here) ------------------

def _answer(series: list[tuple[dict[str, str], str]]) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [1764470000.123, value]} for labels, value in series]}}


def test_values_are_clamped_and_nan_or_hostless_series_ignored() -> None:
    answer = _answer([({"node": "a"}, "1.7"), ({"node": "b"}, "NaN"), ({}, "0.5"), ({"node": "c"}, "-0.1")])
    assert parse_vector(answer, scale=1.0) == {"a": 1.0, "c": 0.0}


def test_a_host_answered_twice_is_refused_not_overwritten() -> None:
    with pytest.raises(PrometheusError, match="'a' answered twice"):
        parse_vector(_answer([({"node": "a"}, "0.2"), ({"node": "a"}, "0.8")]), scale=1.0)


def test_a_matrix_answer_is_refused() -> None:
    with pytest.raises(PrometheusError, match="expected a vector"):
        parse_vector({"status": "success", "data": {"resultType": "matrix", "result": []}}, scale=1.0)
    assert math.isfinite(parse_vector(_answer([({"node": "a"}, "42")]), scale=100.0)["a"])
