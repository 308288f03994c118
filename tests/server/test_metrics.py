"""/metrics under two gunicorn workers counts every review exactly once, whichever worker served it."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest
import requests

from tests.server.harness import Server, copy_policies, example_pod, https_session, review_of


@pytest.fixture(scope="module")
def server(module_tmp):
    """Two workers, and the plaintext /metrics listener."""
    srv = Server(module_tmp, policies=copy_policies(module_tmp / "policies")).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def metrics_port(server) -> int:
    return server.metrics_port


def _admissions(samples: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in samples.items() if k.startswith("gpugate_admissions_total{")}


def _by_result(samples: dict[str, float]) -> Counter:
    out: Counter = Counter()
    for key, value in _admissions(samples).items():
        result = key.split('result="')[1].split('"')[0]
        endpoint = key.split('endpoint="')[1].split('"')[0]
        out[(endpoint, result)] += int(value)
    return out


def _send_mix(server, rounds: int) -> Counter:
    """Reviews on new connections (spread over workers) and on one kept-alive connection."""
    sent: Counter = Counter()
    with https_session(server.ca, pool=1) as kept:
        for _ in range(rounds):
            with https_session(server.ca) as fresh:
                for session in (fresh, kept):
                    answer = session.post(f"{server.url}/mutate", json=review_of(example_pod()), timeout=10)
                    assert answer.status_code == 200
                    sent[("mutate", "patched")] += 1
                    denied = session.post(f"{server.url}/validate", json=review_of(example_pod(), namespace="web-a"),
                                          timeout=10)
                    assert denied.json()["response"]["allowed"] is False
                    sent[("validate", "denied")] += 1
                    assert session.post(f"{server.url}/validate", data=b"]", timeout=10).status_code == 400
                    sent[("validate", "bad_request")] += 1
    return sent


def _pids(server) -> set[int]:
    return {line["pid"] for line in server.log_lines() if line.get("event") == "admission"}


def test_every_review_is_counted_once_across_workers(server):
    before = _by_result(server.metrics())
    sent = _send_mix(server, rounds=25)
    # The kernel decides which worker accepts a connection: keep going until both have served.
    for _ in range(40):
        if len(_pids(server)) >= 2:
            break
        sent += _send_mix(server, rounds=5)
    after = _by_result(server.metrics())
    assert {k: after[k] - before[k] for k in sent} == dict(sent)
    samples = server.metrics()
    total = sum(sent.values())
    histogram = sum(v for k, v in samples.items() if k.startswith("gpugate_admission_duration_seconds_count"))
    assert histogram >= total
    assert len(_pids(server)) == 2, "both workers should have answered reviews"


def test_counts_survive_a_worker_being_killed(server):
    before = _by_result(server.metrics())
    sent = _send_mix(server, rounds=5)
    victim = sorted(_pids(server))[0]
    os.kill(victim, signal.SIGKILL)           # gunicorn boots a replacement; the samples stay
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        booted = [line for line in server.log_lines() if "Booting worker" in line.get("event", "")]
        if len(booted) >= 3:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("no replacement worker booted")
    sent += _send_mix(server, rounds=5)
    after = _by_result(server.metrics())
    assert {k: after[k] - before[k] for k in sent} == dict(sent)
    revisions = {k: v for k, v in server.metrics().items() if k.startswith("gpugate_policy_revision_info")}
    assert list(revisions.values()) == [1.0], revisions   # the dead worker's gauge is gone, not doubled


def test_metrics_are_served_on_their_own_port_and_never_on_the_admission_port(server, metrics_port):
    """The admission port is open to every pod of the cluster; what the webhook counted (namespaces,
    policies, results) is for the monitoring namespace only, which the NetworkPolicy lets reach the
    metrics port alone."""
    assert server.post("mutate", review_of(example_pod())).status_code == 200  # something to count
    plain = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
    assert plain.status_code == 200
    assert sum(float(line.rpartition(" ")[2]) for line in plain.text.splitlines()
               if line.startswith("gpugate_admissions_total{")) > 0
    over_tls = server.session.get(f"{server.url}/metrics", timeout=5)
    assert over_tls.status_code == 404 and "gpugate_admissions_total" not in over_tls.text
    refused = requests.post(f"http://127.0.0.1:{metrics_port}/mutate", json=review_of(example_pod()), timeout=5)
    assert "AdmissionReview" not in refused.text


def test_label_values_stay_bounded_whatever_the_client_sends(server):
    for operation in ("PATCH-ME-1", "PATCH-ME-2"):
        review = review_of(example_pod())
        review["request"]["operation"] = operation
        assert server.post("mutate", review).json()["response"]["allowed"] is True
    samples = server.metrics()
    assert not any("PATCH-ME" in key for key in samples)
    assert any('operation="other"' in key and 'result="skipped"' in key for key in samples)


def test_accepted_connections_are_counted_once_each(server):
    """``gpugate_connections_accepted_total`` tells kept-alive clients from a handshake per review
    (benchmarks/create_latency.py reads it to show how the API server connects)."""
    name = "gpugate_connections_accepted_total"
    server.metrics()  # the harness' own kept-alive session is open from here on
    before = server.metrics()[name]
    with https_session(server.ca, pool=1) as kept:
        for _ in range(10):
            assert kept.post(f"{server.url}/mutate", json=review_of(example_pod()), timeout=10).status_code == 200
    for _ in range(3):
        with https_session(server.ca) as fresh:
            assert fresh.post(f"{server.url}/mutate", json=review_of(example_pod()), timeout=10).status_code == 200
    assert server.metrics()[name] - before == 1 + 3
