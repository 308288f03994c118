"""The idle look's writes through the real client: Events once, the annotation set and taken off,
nothing in a dry run, nothing as a standby, nothing when Prometheus fails, and the metric that says why.

The API server is tests/kubefake.py; Prometheus is a small HTTP server answering the three idle
subqueries with the activity a test sets (the far side of the wire: the balancer's client
builds, sends and reads the real requests). Evictions need the Eviction API, which only the real
API server has: tests/e2e/test_idle_reclaim.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.balancer.fakeprometheus import FakePrometheus
from tests.kubefake import FakeKube
from tests.usage.cluster import T0, node, pod, records
from webhook.balancer.idlereclaim import IdleMetrics, IdleReclaimer
from webhook.balancer.labeller import Labeller
from webhook.balancer.metrics import Metrics
from webhook.balancer.podactions import PodActions
from webhook.balancer.prometheus import PrometheusClient
from webhook.balancer.settings import BalancerSettings, UsageSettings
from webhook.balancer.usagesource import UsagePods, UsageSource
from webhook.kube.gpunode import node_info
from webhook.kubeclient import api_client
from webhook.policy.store import PolicyStore

NOW = T0 + 3 * 3600
PODS = [pod("nb-0", "n", {"nvidia.com/gpu": 1}, owner=("StatefulSet", "nb")),
        pod("train-0", "n", {"nvidia.com/gpu": 4}, owner=("StatefulSet", "train"))]


class IdlePrometheus(FakePrometheus):
    """Answers the idle subqueries: every pod at ``activity``, samples covering the window."""

    def __init__(self) -> None:
        self.activity = {"ml/nb-0": 0.01, "ml/train-0": 0.8}
        super().__init__()

    def vector(self, query: str) -> list[dict[str, Any]]:
        """Every pod's activity (a count that covers the window for ``count_over_time``)."""
        count = query.startswith("count_over_time")
        return [{"metric": {"pod_namespace": key.split("/")[0], "pod_name": key.split("/")[1]},
                 "value": [NOW, str(60 if count else value)]} for key, value in self.activity.items()]


@pytest.fixture
def prometheus() -> Iterator[IdlePrometheus]:
    found = IdlePrometheus()
    yield found
    found.stop()


class Look:
    """One IdleReclaimer over the fake API server's pods."""

    def __init__(self, fake_kube: FakeKube, prometheus_url: str | None, *, policy: str = "", leading: bool = True,
                 dry_run: bool = False, tmp_path: object = None) -> None:
        for body in PODS:
            fake_kube.put(body)
        labeller = Labeller(BalancerSettings(), Metrics(), clock=lambda: 0.0)
        labeller.replace_nodes({"n": node_info(node("n", gpus=8))})
        self.pods = UsagePods(lambda **_: None, informer_args=_ARGS, field_selector="")
        self.refresh(fake_kube)
        self.pods.informer.synced.set()
        self.source = UsageSource(labeller, self.pods, ready=lambda: True)
        self.metrics = IdleMetrics(Metrics().registry)
        store = None
        if policy:
            assert tmp_path is not None
            (tmp_path / "p.yaml").write_text(policy)  # type: ignore[operator]
            store = PolicyStore(tmp_path)  # type: ignore[arg-type]
        client = PrometheusClient(prometheus_url, window="1m", timeout=2) if prometheus_url else None
        self.reclaimer = IdleReclaimer(
            self.source, PodActions(api_client(fake_kube.url), identity="replica-a", clock=lambda: NOW),
            UsageSettings(enabled=True, min_step=30), prometheus=client, policies=store, leading=lambda: leading,
            ready=lambda: True, dry_run=dry_run, metrics=self.metrics, now=lambda: NOW)

    def refresh(self, fake_kube: FakeKube) -> None:
        """What the usage informer would hold now (the pods as the fake API server stores them)."""
        self.pods._replace({r.key: r for r in records(fake_kube.list("v1", "Pod", "ml"))})

    def paused(self, reason: str) -> float:
        return self.metrics.paused.labels(reason)._value.get()


def _backoff() -> object:
    from random import Random

    from webhook.balancer.backoff import Backoff

    return Backoff(1.0, 1.0, Random(0))


_ARGS = {"page_size": 500, "watch_timeout": 60, "backoff": _backoff(), "on_error": lambda *a: None,
         "on_relist": lambda *a: None}


def writes(fake_kube: FakeKube) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in fake_kube.requests if r.method in ("POST", "PATCH", "PUT", "DELETE")]


def test_an_idle_pod_gets_one_event_per_finding_and_a_busy_one_none(fake_kube: FakeKube,
                                                                     prometheus: IdlePrometheus) -> None:
    look = Look(fake_kube, prometheus.url)
    [decision] = look.reclaimer.look()
    look.reclaimer.look()  # the same finding again: no second Event
    assert (decision.finding.record.name, decision.action) == ("nb-0", "report")
    [event] = fake_kube.list("v1", "Event", "ml")
    assert event["involvedObject"]["name"] == "nb-0" and event["reason"] == "GPUIdle"
    assert event["message"].startswith("1 GPU idle for 2h: DCGM activity 1.0% on average, at most 1.0%")
    assert event["reportingInstance"] == "replica-a"
    assert writes(fake_kube) == [("POST", "/api/v1/namespaces/ml/events")]
    assert look.paused("prometheus") == 0 and look.paused("standby") == 0


def test_annotate_sets_the_annotation_once_and_takes_it_off_when_the_pod_is_busy_again(
        fake_kube: FakeKube, prometheus: IdlePrometheus, tmp_path: object) -> None:
    look = Look(fake_kube, prometheus.url, tmp_path=tmp_path, policy="""apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {name: nb}
spec: {idle: {action: annotate}}
""")
    look.reclaimer.look()
    stored = fake_kube.get("v1", "Pod", "nb-0", "ml")["metadata"]["annotations"]["gpugate.io/idle"]
    assert stored.startswith("1 GPU idle for 2h") and stored.endswith("of policy nb")
    patch = next(r for r in fake_kube.requests if r.method == "PATCH")
    assert patch.content_type == "application/merge-patch+json"
    look.refresh(fake_kube)
    look.reclaimer.look()
    assert sum(r.method == "PATCH" for r in fake_kube.requests) == 1  # already there: not written again
    prometheus.activity["ml/nb-0"] = 0.6
    look.reclaimer.look()
    assert "gpugate.io/idle" not in (fake_kube.get("v1", "Pod", "nb-0", "ml")["metadata"].get("annotations") or {})


@pytest.mark.parametrize(("leading", "dry_run", "reason"), [(False, False, "standby"), (True, True, "dry_run")])
def test_a_standby_or_a_dry_run_writes_nothing_and_says_why(fake_kube: FakeKube, prometheus: IdlePrometheus,
                                                             leading: bool, dry_run: bool, reason: str) -> None:
    look = Look(fake_kube, prometheus.url, leading=leading, dry_run=dry_run)
    decisions = look.reclaimer.look()
    assert writes(fake_kube) == []
    assert look.paused(reason) == 1
    if dry_run:  # it measured and decided: what it would have written is counted
        assert [d.finding.record.name for d in decisions] == ["nb-0"]
        assert look.metrics.actions.labels("event", "dry_run")._value.get() == 1
    else:  # a standby does not even ask Prometheus
        assert decisions == [] and prometheus.queries == []


def test_prometheus_unreachable_pauses_the_look_and_withdraws_the_findings(fake_kube: FakeKube,
                                                                            prometheus: IdlePrometheus) -> None:
    look = Look(fake_kube, prometheus.url)
    look.reclaimer.look()
    assert look.source._decisions
    prometheus.stop()
    before = writes(fake_kube)
    assert look.reclaimer.look() == []
    assert look.paused("prometheus") == 1 and look.source._decisions == []
    assert writes(fake_kube) == before


def test_without_prometheus_nothing_is_measured_and_the_metric_says_so(fake_kube: FakeKube) -> None:
    look = Look(fake_kube, None)
    assert look.reclaimer.look() == []
    assert look.paused("no_prometheus") == 1 and writes(fake_kube) == []


def test_a_dry_run_of_evict_counts_the_eviction_it_would_make_and_spends_no_budget(
        fake_kube: FakeKube, prometheus: IdlePrometheus, tmp_path: object) -> None:
    look = Look(fake_kube, prometheus.url, dry_run=True, tmp_path=tmp_path, policy="""apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {name: nb}
spec: {idle: {action: evict}}
""")
    [decision] = look.reclaimer.look()
    assert decision.action == "evict"
    assert look.metrics.actions.labels("evict", "dry_run")._value.get() == 1
    assert look.reclaimer.budget.available(NOW) == UsageSettings().eviction_burst
    assert writes(fake_kube) == []
