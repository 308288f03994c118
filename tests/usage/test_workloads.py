"""A pod's record: its top controller, whether one recreates it, and which pods are no GPU pods."""

from __future__ import annotations

import pytest

from tests.usage.cluster import T0, pod
from webhook.kube import timestamps
from webhook.usage.workloads import Owner, owner_of, record_of


@pytest.mark.parametrize(("owner", "template_hash", "expected", "recreated"), [
    (("ReplicaSet", "web-5d8f7"), "5d8f7", Owner("Deployment", "web"), True),
    (("ReplicaSet", "web-5d8f7"), "", Owner("ReplicaSet", "web-5d8f7"), True),  # a bare ReplicaSet
    (("ReplicaSet", "web-5d8f7"), "other", Owner("ReplicaSet", "web-5d8f7"), True),
    (("StatefulSet", "notebook"), "", Owner("StatefulSet", "notebook"), True),
    (("ReplicationController", "old"), "", Owner("ReplicationController", "old"), True),
    (("Job", "train-1"), "", Owner("Job", "train-1"), False),
    (("DaemonSet", "probe"), "", Owner("DaemonSet", "probe"), False),
    (("Notebook", "lab"), "", Owner("Notebook", "lab"), False),
    (None, "", Owner("Pod", "p"), False),
])
def test_the_owner_is_the_top_controller_and_only_some_controllers_recreate(
        owner: tuple[str, str] | None, template_hash: str, expected: Owner, recreated: bool) -> None:
    record = record_of(pod("p", "n", {"nvidia.com/gpu": 1}, owner=owner, template_hash=template_hash))
    assert record is not None
    assert (record.owner, record.recreated) == (expected, recreated)


def test_an_owner_reference_that_is_not_the_controller_does_not_own_the_pod() -> None:
    body = pod("p", "n", {"nvidia.com/gpu": 1})
    body["metadata"]["ownerReferences"] = [{"kind": "ConfigMap", "name": "x", "uid": "u"}]
    assert owner_of(body) == (Owner("Pod", "p"), "")


@pytest.mark.parametrize(("body", "why"), [
    (pod("p", "", {"nvidia.com/gpu": 1}), "not bound"),
    (pod("p", "n", {"nvidia.com/gpu": 1}, phase="Succeeded"), "finished"),
    (pod("p", "n", {"cpu": 1}), "no GPU and no claim"),
    (pod("p", "n", {"nvidia.com/gpu": "x"}), "a quantity the API server would refuse"),  # type: ignore[dict-item]
])
def test_no_record_for_a_pod_that_cannot_hold_gpus(body: dict, why: str) -> None:
    assert record_of(body) is None, why


def test_a_pod_with_only_a_claim_has_a_record_and_its_start_is_the_kubelets() -> None:
    record = record_of(pod("p", "n", claims=["c"], started=T0))
    assert record is not None and record.started == T0 and record.demand.claims


@pytest.mark.parametrize(("text", "unix"), [("2027-01-15T08:00:00Z", 1800000000.0), ("", None), (None, None),
                                            ("yesterday", None)])
def test_times_are_read_as_the_api_server_writes_them(text: str | None, unix: float | None) -> None:
    assert timestamps.seconds(text) == unix
    if unix is not None:
        assert timestamps.rfc3339(unix) == text  # what the balancer writes, read back the same
