"""The health signals' PromQL against a real Prometheus scraping pages shaped like dcgm-exporter's.

What only Prometheus decides: that an XID is found as a *new* series of the last-XID gauge with
its first sample's time (``timestamp`` through a subquery), that an XID older than the look-back
is not found again, nor when the series is re-labelled because a pod starts on the GPU, that a
MIG instance's XID is its parent GPU's, and what the ECC counter and the row-remap gauge say.
Each case has a host of its own, so one Prometheus and one look-back serve them all.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from tests.dcgmexporter import Device, Exporter, Pod, Reading, mig_gpu
from tests.promserver import Prometheus
from webhook.balancer import healthsignals
from webhook.balancer.healthsignals import Fault
from webhook.balancer.prometheus import PrometheusClient

LOOKBACK, STEP = 6.0, 1.0
HOSTS = {f"x{i}": f"node-x{i}" for i in range(1, 7)}


def whole(host: str, count: int = 4, **xids: int) -> list[Reading]:
    return [Reading(device=Device(host=host, gpu=i), active=0.3, xid=xids.get(f"gpu{i}", 0)) for i in range(count)]


def before() -> list[Reading]:
    return [*whole("x1"), *whole("x2", gpu0=48), *whole("x3", gpu1=79),
            *[replace(r, xid=0) for r in mig_gpu("x4", 0, "1g.10gb", [0.1, 0.2])],
            *[replace(r, device=replace(r.device, host_label="hostname")) for r in whole("x5")],
            *[replace(r, dbe=0, row_remap_failure=0) for r in whole("x6", 2)]]


def after() -> list[Reading]:
    with_pod = [replace(r, device=replace(r.device, pod=Pod(name="trainer", namespace="ml"))) if r.device.gpu == 1
                else r for r in whole("x3", gpu1=79)]
    mig = mig_gpu("x4", 0, "1g.10gb", [0.1, 0.2])
    return [*whole("x1", gpu3=79), *whole("x2", gpu0=48), *with_pod,
            replace(mig[0], xid=79), replace(mig[1], xid=0),
            *[replace(r, device=replace(r.device, host_label="hostname")) for r in whole("x5", gpu0=95)],
            replace(whole("x6", 2)[0], dbe=2, row_remap_failure=0), replace(whole("x6", 2)[1], dbe=0,
                                                                            row_remap_failure=1)]


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Fault], float]]:
    """Faults read after the change, and the time the exporter started serving the changed page."""
    exporter = Exporter()
    prometheus = None
    try:
        exporter.show(before())
        prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"), {"nvidia-dcgm-exporter": [exporter.target]},
                                interval="500ms")
        prometheus.wait_for('DCGM_FI_DEV_XID_ERRORS{Hostname="x2",err_code="48"}')
        time.sleep(LOOKBACK + 2)  # x2's and x3's XIDs are older than the look-back now
        changed = time.time()
        exporter.show(after())
        time.sleep(3 * STEP + 1)
        client = PrometheusClient(prometheus.url, window="5m", timeout=5)
        xids = healthsignals.xid_faults(client.vector(healthsignals.xid_query(LOOKBACK, STEP)), HOSTS)
        counts, lasts = healthsignals.dbe_queries(LOOKBACK, STEP)
        dbe = healthsignals.dbe_faults(client.vector(counts), client.vector(lasts), HOSTS)
        remap = healthsignals.row_remap_faults(client.vector(healthsignals.row_remap_query()), HOSTS)
        yield xids + dbe + remap, changed
    finally:
        if prometheus is not None:
            prometheus.stop()
        exporter.stop()


def on(found: list[Fault], host: str) -> list[Fault]:
    return [f for f in found if f.node == HOSTS[host]]


def test_a_new_xid_is_found_once_with_the_time_it_appeared(observed) -> None:
    found, changed = observed
    (fault,) = on(found, "x1")
    assert (fault.gpu, fault.signal, fault.code) == (Device(host="x1", gpu=3).uuid, "xid", 79)
    assert changed - 0.1 <= fault.at <= changed + STEP + 1.0  # a scrape (0.5 s) and a step late at most


def test_an_xid_older_than_the_look_back_is_not_found_again(observed) -> None:
    assert on(observed[0], "x2") == []


def test_a_pod_starting_on_a_gpu_does_not_make_its_old_xid_new(observed) -> None:
    """dcgm-exporter adds pod/namespace/container to the GPU's series: a new series, the same XID."""
    assert on(observed[0], "x3") == []


def test_a_mig_instances_xid_is_its_parent_gpus(observed) -> None:
    (fault,) = on(observed[0], "x4")
    assert (fault.gpu, fault.code) == (Device(host="x4", gpu=0).uuid, 79)


def test_the_next_exporters_hostname_spelling_is_read(observed) -> None:
    (fault,) = on(observed[0], "x5")
    assert (fault.gpu, fault.code) == (Device(host="x5", gpu=0).uuid, 95)


def test_the_ecc_counter_counts_errors_and_the_row_remap_gauge_is_a_condition(observed) -> None:
    found, changed = observed
    dbe = [f for f in on(found, "x6") if f.signal == "ecc-dbe"]
    assert [(f.gpu, f.count) for f in dbe] == [(Device(host="x6", gpu=0).uuid, 2)]
    assert changed - 0.1 <= dbe[0].at <= changed + STEP + 1.0
    remap = [f for f in on(found, "x6") if f.signal == "row-remap-failure"]
    assert [f.gpu for f in remap] == [Device(host="x6", gpu=1).uuid]


def test_an_answer_for_an_unknown_host_or_without_a_gpu_is_left_out() -> None:
    answer = [{"metric": {"node": "elsewhere", "UUID": "GPU-1", "err_code": "79"}, "value": [0, "5"]},
              {"metric": {"node": "x1", "err_code": "79"}, "value": [0, "5"]},
              {"metric": {"node": "x1", "UUID": "GPU-1", "err_code": "79"}, "value": [0, "NaN"]},
              {"metric": {"node": "x1", "UUID": "GPU-1", "err_code": "79"}, "value": [0, "7"]}]
    assert healthsignals.xid_faults(answer, HOSTS) == [Fault(node="node-x1", gpu="GPU-1", signal="xid", code=79,
                                                             at=7.0)]
