"""The health loop's passes against the fake API server: what it writes, and that it writes nothing
when it must not (a standby, ``--dry-run``, Prometheus down for a return).

Prometheus is a stand-in here that answers each query from a table (the PromQL itself is
tests/balancer/test_health_prometheus.py's subject, against a real Prometheus); the real
control plane and its controllers are tests/e2e/test_health.py's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from tests.balancer.fakeprometheus import FakePrometheus
from tests.e2e import dra_slices
from tests.kubefake import DRA_TYPES, FakeKube
from webhook import names
from webhook.balancer.healthpolicy import HealthPolicy
from webhook.balancer.labeller import Labeller
from webhook.balancer.metrics import Metrics
from webhook.balancer.prometheus import PrometheusClient
from webhook.balancer.quarantineapi import HealthApi, NotLeader
from webhook.balancer.quarantineledger import KEY, decode
from webhook.balancer.quarantineloop import QuarantineLoop
from webhook.balancer.quarantinemetrics import HealthMetrics
from webhook.balancer.settings import BalancerSettings
from webhook.cli import main
from webhook.kube import slices
from webhook.kube.gpunode import node_info
from webhook.kubeclient import api_client

NS = "gpugate-system"
DRA_NODE, PLUGIN_NODE = "dra-1", "dp-1"
GPUS = dra_slices.gpus(8, node=DRA_NODE)
T0 = 2_000_000_000.0
POLICY = HealthPolicy(enabled=True, hold=60.0)


class XidPrometheus(FakePrometheus):
    """Answers a query with the vector its table gives the query's metric."""

    def __init__(self) -> None:
        self.vectors: dict[str, list[dict[str, Any]]] = {}
        super().__init__()

    def vector(self, query: str) -> list[dict[str, Any]]:
        return next((v for k, v in self.vectors.items() if k in query), [])

    def xid(self, gpu: dra_slices.Gpu, code: int, at: float, node: str = DRA_NODE) -> None:
        self.vectors["DCGM_FI_DEV_XID_ERRORS"] = [
            {"metric": {"node": node, "UUID": gpu.uuid, "err_code": str(code)}, "value": [at, str(at)]}]


@dataclass
class Rig:
    fake: FakeKube
    prometheus: XidPrometheus
    labeller: Labeller
    leader: list[bool] = field(default_factory=lambda: [True])
    now: list[float] = field(default_factory=lambda: [T0])

    def loop(self, *, dry_run: bool = False, policy: HealthPolicy = POLICY, prometheus: bool = True) -> QuarantineLoop:
        api = HealthApi(api_client(self.fake.url), namespace=NS, ledger_name=names.HEALTH_LEDGER,
                        may_write=lambda: self.leader[0], reporter="test")
        client = PrometheusClient(self.prometheus.url, window="5m", timeout=2) if prometheus else None
        return QuarantineLoop(policy, api, self.labeller, metrics=HealthMetrics(CollectorRegistry()),
                              may_write=lambda: self.leader[0], synced=lambda: True, prometheus=client,
                              dry_run=dry_run, on_error=lambda *_: None, clock=lambda: self.now[0])

    def ledger(self):  # type: ignore[no-untyped-def]
        found = self.fake.get("v1", "ConfigMap", names.HEALTH_LEDGER, NS)
        return decode(found["data"][KEY]) if found else None

    def rules(self) -> dict[str, dict[str, Any]]:
        return {r["metadata"]["name"]: r for r in self.fake.list("resource.k8s.io/v1", "DeviceTaintRule")}

    def writes(self) -> list[tuple[str, str]]:
        return [(r.method, r.path) for r in self.fake.requests if r.method in ("POST", "PUT", "PATCH", "DELETE")]


def node(name: str, *, gpus: int) -> dict[str, Any]:
    allocatable = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}},
            "spec": {}, "status": {"capacity": allocatable, "allocatable": allocatable}}


@pytest.fixture
def rig() -> Iterator[Rig]:
    fake = FakeKube()
    for spec in DRA_TYPES:
        fake.register(*spec)
    fake.register("resource.k8s.io", "v1", "DeviceTaintRule", "devicetaintrules", False)
    fake.start()
    prometheus = XidPrometheus()
    labeller = Labeller(BalancerSettings(), Metrics(), clock=lambda: 0.0)
    nodes = {DRA_NODE: node(DRA_NODE, gpus=0), PLUGIN_NODE: node(PLUGIN_NODE, gpus=8)}
    for obj in nodes.values():
        fake.put(obj)
    labeller.replace_nodes({name: node_info(fake.get("v1", "Node", name) or {}) for name in nodes})
    found = {s["metadata"]["name"]: slices.parse(s) for s in dra_slices.node_slices(DRA_NODE, GPUS)}
    labeller.dra(lambda cache: cache.replace_slices(found))
    try:
        yield Rig(fake, prometheus, labeller)
    finally:
        prometheus.stop()
        fake.stop()


def test_a_fatal_xid_makes_one_rule_for_that_gpu_an_event_and_a_ledger_entry(rig: Rig) -> None:
    rig.prometheus.xid(GPUS[3], 79, T0 - 2)
    loop = rig.loop()
    decision = loop.once()
    assert decision is not None and [a.kind for a in decision.actions] == ["quarantined"]
    assert list(rig.rules()) == [f"gpugate-{DRA_NODE}-gpu-3"]
    (q,) = rig.ledger().quarantines
    assert (q.gpu, q.rule, q.effect) == (GPUS[3].uuid, "fatal-xid", "NoSchedule")
    (event,) = rig.fake.list("v1", "Event", "default")
    assert (event["reason"], event["involvedObject"]["name"]) == ("GPUQuarantined", DRA_NODE)
    assert "DRA devices gpu-3" in event["message"] and "rule fatal-xid" in event["message"]
    assert "signal xid" in event["message"]
    sample = loop.metrics.quarantined.labels(DRA_NODE, GPUS[3].uuid, "gpu-3", "xid", "fatal-xid", "NoSchedule")
    assert sample._value.get() == 1
    before = len(rig.writes())
    loop.once()
    assert len(rig.writes()) == before, "a second pass over the same state writes nothing"


def test_a_rule_deleted_by_hand_comes_back(rig: Rig) -> None:
    rig.prometheus.xid(GPUS[3], 79, T0 - 2)
    loop = rig.loop()
    loop.once()
    rig.fake.delete("resource.k8s.io/v1", "DeviceTaintRule", f"gpugate-{DRA_NODE}-gpu-3")
    loop.once()
    assert list(rig.rules()) == [f"gpugate-{DRA_NODE}-gpu-3"]


def test_a_standby_reads_and_writes_nothing(rig: Rig) -> None:
    rig.prometheus.xid(GPUS[3], 79, T0 - 2)
    rig.leader[0] = False
    assert rig.loop().once() is None
    assert rig.fake.requests == [] and rig.prometheus.queries == []


def test_the_balancers_dry_run_decides_and_writes_nothing(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpugate.balancer.health")
    rig.prometheus.xid(GPUS[3], 79, T0 - 2)
    rig.leader[0] = False  # --dry-run takes no lease
    decision = rig.loop(dry_run=True).once()
    assert decision is not None and [a.kind for a in decision.actions] == ["quarantined"]
    assert rig.writes() == [] and rig.ledger() is None
    assert any("would act" in r.getMessage() for r in caplog.records)


def test_the_policys_dry_run_writes_effect_none_rules_only(rig: Rig) -> None:
    rig.prometheus.xid(GPUS[3], 79, T0 - 2)
    rig.loop(policy=replace(POLICY, dry_run=True)).once()
    (rule,) = rig.rules().values()
    assert rule["spec"]["taint"]["effect"] == "None"
    assert rig.fake.list("v1", "Pod", NS) == []


def test_while_prometheus_is_down_nothing_returns(rig: Rig) -> None:
    rig.prometheus.xid(GPUS[3], 79, T0 - 2)
    loop = rig.loop()
    loop.once()
    rig.now[0] = T0 + POLICY.hold + 1
    loop.once()  # the hold is over: a validation pod is made
    (pod,) = rig.fake.list("v1", "Pod", NS)
    pod["status"] = {"phase": "Succeeded"}
    rig.fake.put(pod)
    rig.prometheus.down = True
    rig.now[0] += 5
    decision = loop.once()
    assert decision is not None and decision.actions == ()
    assert loop.metrics.signals_up._value.get() == 0
    assert list(rig.rules()) == [f"gpugate-{DRA_NODE}-gpu-3"] and rig.ledger().quarantines
    rig.prometheus.down = False
    decision = loop.once()
    assert [a.kind for a in decision.actions] == ["returned"] and rig.rules() == {}
    assert rig.fake.list("v1", "Pod", NS) == [] and rig.fake.list("resource.k8s.io/v1", "ResourceClaim", NS) == []


def test_the_validation_claim_pins_the_faulty_gpu(rig: Rig) -> None:
    rig.prometheus.xid(GPUS[3], 79, T0 - 2)
    loop = rig.loop()
    loop.once()
    rig.now[0] = T0 + POLICY.hold + 1
    loop.once()
    (claim,) = rig.fake.list("resource.k8s.io/v1", "ResourceClaim", NS)
    (pod,) = rig.fake.list("v1", "Pod", NS)
    assert claim["metadata"]["name"] == pod["metadata"]["name"] == rig.ledger().quarantines[0].validation_pod
    assert GPUS[3].uuid in json.dumps(claim["spec"])


def test_a_device_plugin_gpu_taints_its_node_and_holds_back_gpu_free(rig: Rig) -> None:
    rig.prometheus.xid(GPUS[0], 48, T0 - 2, node=PLUGIN_NODE)  # any UUID: this node has no DRA devices
    rig.loop().once()
    taints = (rig.fake.get("v1", "Node", PLUGIN_NODE) or {})["spec"]["taints"]
    assert taints == [{"key": names.UNHEALTHY_TAINT_KEY, "effect": "NoSchedule"}]
    assert rig.labeller._held_back == {PLUGIN_NODE: 1}
    assert rig.rules() == {}


def test_losing_the_lease_mid_pass_stops_the_writes(rig: Rig) -> None:
    rig.prometheus.xid(GPUS[3], 79, T0 - 2)
    loop = rig.loop()
    calls = [0]

    def leader() -> bool:
        calls[0] += 1
        return calls[0] == 1  # the pass starts as the leader, then the lease is gone

    loop._may_write = leader
    loop.api._may_write = leader
    with pytest.raises(NotLeader):
        loop.once()
    assert rig.writes() == []


def test_an_operators_release_returns_the_gpu_at_the_next_pass_and_is_logged(rig: Rig) -> None:
    rig.prometheus.xid(GPUS[3], 79, T0 - 2)
    loop = rig.loop()
    loop.once()
    listing = CliRunner().invoke(main, ["health", "--server", rig.fake.url, "--namespace", NS])
    assert listing.exit_code == 0, listing.output
    assert DRA_NODE in listing.output and "gpu-3" in listing.output and "XID 79" in listing.output
    assert "a validation pod passes on it" in listing.output
    released = CliRunner().invoke(main, ["health", "release", DRA_NODE, GPUS[3].uuid[:12], "--reason", "RMA done",
                                         "--by", "alice", "--server", rig.fake.url, "--namespace", NS])
    assert released.exit_code == 0, released.output
    assert "requested by alice: RMA done" in released.output
    decision = loop.once()
    assert [a.kind for a in decision.actions] == ["returned"] and rig.rules() == {}
    (back,) = rig.ledger().returned
    assert (back.how, back.gpu) == ("operator", GPUS[3].uuid)
    after = CliRunner().invoke(main, ["health", "--server", rig.fake.url, "--namespace", NS])
    assert "no GPU is quarantined" in after.output
    assert f"returned {DRA_NODE} {GPUS[3].uuid}" in after.output and "released by alice: RMA done" in after.output
    reasons = [e["reason"] for e in rig.fake.list("v1", "Event", "default")]
    assert sorted(reasons) == ["GPUQuarantined", "GPUReleaseRequested", "GPUReturned"]


def test_releasing_a_gpu_that_is_not_quarantined_is_refused(rig: Rig) -> None:
    done = CliRunner().invoke(main, ["health", "release", DRA_NODE, "GPU-nope", "--reason", "x",
                                     "--server", rig.fake.url, "--namespace", NS])
    assert done.exit_code == 1 and "no quarantined GPU 'GPU-nope' on node dra-1" in done.output


def test_the_labeller_takes_held_back_gpus_off_gpu_free_and_gives_them_back(rig: Rig) -> None:
    labeller = rig.labeller
    labeller.reconcile(full=True)
    assert labeller.schedule.wanted[PLUGIN_NODE].free == "8"
    labeller.hold_back({PLUGIN_NODE: 2})
    labeller.reconcile(full=False)
    assert labeller.schedule.wanted[PLUGIN_NODE].free == "6"
    labeller.hold_back({})
    labeller.reconcile(full=False)
    assert labeller.schedule.wanted[PLUGIN_NODE].free == "8"


def test_an_event_the_api_server_refused_is_sent_at_the_next_pass(rig: Rig) -> None:
    rig.prometheus.xid(GPUS[3], 79, T0 - 2)
    rig.fake.fail_next("POST", r"/api/v1/namespaces/default/events", 503)
    loop = rig.loop()
    loop.once()
    assert rig.ledger().quarantines and rig.fake.list("v1", "Event", "default") == []
    loop.once()
    assert [e["reason"] for e in rig.fake.list("v1", "Event", "default")] == ["GPUQuarantined"]
