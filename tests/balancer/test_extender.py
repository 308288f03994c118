"""The scheduler extender served by the balancer.

Pure: how the caches' records feed ``webhook.placement``'s state (``placementfeed``). Edge: the real
HTTPS listener as kube-scheduler calls it (``pkg/scheduler/extender.go``, ``HTTPExtender.send``: a
POST of the JSON ExtenderArgs to ``urlPrefix/prioritizeVerb``, ``Content-Type: application/json``,
200 or an error, a HostPriorityList back; Go's client keeps the connection alive), fed from the
balancer's own node and pod watches against tests/kubefake.py.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import ssl
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.balancer import conftest
from tests.balancer.conftest import fast_settings
from tests.kubefake import FakeKube
from webhook.balancer import extendercache, placementfeed
from webhook.balancer.settings import BalancerSettings, ExtenderServing, SettingsError, load_mix
from webhook.certs import pki
from webhook.kube.gpunode import node_info
from webhook.placement.extender import ExtenderSettings, ExtenderState
from webhook.placement.inputs import PodDemand
from webhook.placement.shapes import Shape, ShapeMix


def wait_for(predicate: Any, *, what: str, timeout: float = 30.0) -> Any:
    """``conftest.wait_for`` with room for a loaded machine: a balancer starting (caches, TLS, a
    lease) on 2 shared cores can take seconds; the wait still ends at the event."""
    return conftest.wait_for(predicate, timeout=timeout, what=what)


H100 = "NVIDIA-H100-80GB-HBM3"


def node(name: str, gpus: dict[str, str] | None = None, *, cpu: str = "64", memory: str = "512Gi",
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": H100, **(labels or {})}},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, **(gpus or {})}}}


def pod(name: str, node_name: str = "", *, cpu: str = "4", memory: str = "16Gi", gpus: int = 0,
        phase: str = "Running", namespace: str = "ml") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda", "resources": resources}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": spec, "status": {"phase": phase}}


class TestNodeShape:
    @pytest.mark.parametrize(("allocatable", "labels", "gpus", "mig"), [
        ({"nvidia.com/gpu": "8"}, {}, 8, ()),
        ({"nvidia.com/gpu.shared": "16"}, {"nvidia.com/gpu.replicas": "4"}, 4, ()),       # renamed shares
        ({"nvidia.com/gpu": "16"}, {"nvidia.com/gpu.replicas": "4"}, 4, ()),              # shares, not renamed
        ({"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"}, {}, 0,
         (("nvidia.com/mig-1g.10gb", 7), ("nvidia.com/mig-3g.40gb", 2))),
        ({}, {}, 0, ()),                                                                  # a CPU node
        ({"nvidia.com/gpu": "2", "nvidia.com/cx7_sriov_rdma": "8"}, {}, 2, ()),          # NICs are no GPUs
    ])
    def test_physical_gpus_and_slices_from_what_the_device_plugin_advertises(self, allocatable, labels, gpus,
                                                                             mig) -> None:
        shape = placementfeed.node_shape(node_info(node("n", allocatable, labels=labels)))
        assert (shape.gpus, shape.mig, shape.cpu, shape.memory, shape.product) == (gpus, mig, 64000, 512 * 2**30, H100)

    @pytest.mark.parametrize(("allocatable", "labels", "serves"), [
        ({"nvidia.com/gpu": "8"}, {}, "whole"),
        ({"nvidia.com/gpu.shared": "16"}, {"nvidia.com/gpu.replicas": "4"}, "shares"),   # time-slicing-4, renamed
        ({"nvidia.com/gpu.shared": "8", "nvidia.com/gpu": "2"}, {"nvidia.com/gpu.replicas": "4"}, "any"),
        ({"nvidia.com/gpu": "16"}, {"nvidia.com/gpu.replicas": "4"}, "any"),             # slots, not renamed
        ({}, {}, "any"),                                                                  # a CPU node
    ])
    def test_what_a_nodes_gpus_take_comes_from_the_resources_it_advertises(self, allocatable, labels,
                                                                           serves) -> None:
        """A pod lands only where its resource is advertised: a time-sliced node takes no whole-GPU pod."""
        assert placementfeed.node_shape(node_info(node("n", allocatable, labels=labels))).serves == serves


class TestFeedPod:
    def test_a_bound_gpu_pod_counts_for_the_labels_and_the_measure(self) -> None:
        record = placementfeed.feed_pod(pod("a", "n1", gpus=2))
        assert record.usage is not None and record.usage.requests == (("nvidia.com/gpu", 2),)
        assert record.node == "n1"
        assert record.demand == PodDemand(cpu=4000, memory_bytes=16 * 2**30, gpus=2, cpu_score=4000,
                                         memory_score_bytes=16 * 2**30)

    def test_a_cpu_pod_counts_for_the_measure_only(self) -> None:
        record = placementfeed.feed_pod(pod("a", "n1"))
        assert record.usage is None and record.demand == PodDemand(cpu=4000, memory_bytes=16 * 2**30, cpu_score=4000,
                                                                  memory_score_bytes=16 * 2**30)

    @pytest.mark.parametrize(("node_name", "phase"), [("", "Pending"), ("n1", "Succeeded"), ("n1", "Failed")])
    def test_an_unbound_or_finished_pod_holds_nothing(self, node_name: str, phase: str) -> None:
        record = placementfeed.feed_pod(pod("a", node_name, gpus=1, phase=phase))
        assert (record.usage, record.node, record.demand) == (None, "", None)


def feed_with(*nodes: dict[str, Any]) -> placementfeed.Feed:
    feed = placementfeed.Feed(ExtenderState())
    feed.replace_nodes({n["metadata"]["name"]: node_info(n) for n in nodes})
    return feed


def args(pod_body: dict[str, Any], *names: str) -> dict[str, Any]:
    return {"Pod": pod_body, "NodeNames": list(names)}


class TestFeed:
    def test_a_pod_seen_before_its_node_counts_once_the_node_arrives(self) -> None:
        feed = feed_with()
        feed.pod("ml/a", placementfeed.feed_pod(pod("a", "n1", gpus=4)))
        feed.node("n1", node_info(node("n1", {"nvidia.com/gpu": "8"})))
        view = feed.state.view("n1")
        assert view is not None and [b.key for b in view.pods] == ["ml/a"] and view.gpu_free == 4000

    def test_a_node_event_that_changes_nothing_the_measure_reads_keeps_the_view(self) -> None:
        feed = feed_with(node("n1", {"nvidia.com/gpu": "8"}))
        before = feed.state.view("n1")
        feed.node("n1", node_info(node("n1", {"nvidia.com/gpu": "8"}, labels={"heartbeat": "2"})))
        assert feed.state.view("n1") is before
        feed.node("n1", node_info(node("n1", {"nvidia.com/gpu": "4"})))
        assert feed.state.nodes["n1"].gpus == 4

    def test_a_pod_that_finishes_or_goes_frees_its_node(self) -> None:
        feed = feed_with(node("n1", {"nvidia.com/gpu": "8"}))
        feed.pod("ml/a", placementfeed.feed_pod(pod("a", "n1", gpus=8)))
        assert feed.state.nodes["n1"].gpu_free == 0
        feed.pod("ml/a", None)
        assert feed.state.nodes["n1"].gpu_free == 8000

    def test_a_relist_releases_the_pods_it_no_longer_lists(self) -> None:
        feed = feed_with(node("n1", {"nvidia.com/gpu": "8"}))
        feed.replace_pods({"ml/a": placementfeed.feed_pod(pod("a", "n1", gpus=2)),
                           "ml/b": placementfeed.feed_pod(pod("b", "n1", gpus=2))})
        feed.replace_pods({"ml/b": placementfeed.feed_pod(pod("b", "n1", gpus=2))})
        assert [b.key for b in feed.state.nodes["n1"].pods] == ["ml/b"]

    def test_prioritize_answers_every_candidate_in_order_and_unknown_nodes_score_zero(self) -> None:
        feed = feed_with(node("full", {"nvidia.com/gpu": "8"}), node("empty", {"nvidia.com/gpu": "8"}))
        feed.pod("ml/a", placementfeed.feed_pod(pod("a", "full", gpus=6)))
        answer = feed.prioritize(args(pod("new", gpus=2), "empty", "ghost", "full"), now=0.0)
        assert [h["Host"] for h in answer] == ["empty", "ghost", "full"]
        scores = {h["Host"]: h["Score"] for h in answer}
        assert scores["ghost"] == 0 and all(0 <= s <= 10 for s in scores.values())
        assert scores["full"] > scores["empty"], "two GPUs fill the fuller node exactly: the tightest fit"

    def test_a_first_list_teaches_the_shape_mix_at_once(self) -> None:
        feed = feed_with(node("n1", {"nvidia.com/gpu": "8"}, cpu="1000"))
        feed.replace_pods({f"ml/p{i}": placementfeed.feed_pod(pod(f"p{i}", "n1", cpu="2", gpus=1 + i % 2))
                           for i in range(150)})
        mix = feed.state.fragmenter.mix
        assert sorted((s.cpu, s.gpus) for s in mix.shapes) == [(2000, 1), (2000, 2)]

    def test_a_cpu_pod_keeps_off_the_cpu_a_time_sliced_nodes_slots_need(self) -> None:
        """Two time-sliced nodes (only ``nvidia.com/gpu.shared``, 8 slots each) and a mix of 6-core
        shares: the 24-core node's cpu already carries fewer shares than it has slots, so a CPU pod
        there strands more of them, and the extender sends it to the 104-core node. Where the same
        nodes also advertise whole GPUs, best fit still picks the fuller one."""
        mix = ShapeMix((Shape(6000, 250, 1),), (1.0,))
        for gpus, goes in (({"nvidia.com/gpu.shared": "8"}, "rich"), ({"nvidia.com/gpu.shared": "8",
                                                                      "nvidia.com/gpu": "2"}, "poor")):
            feed = placementfeed.Feed(ExtenderState(ExtenderSettings(mix=mix, device_policy="packed")))
            sliced = {"nvidia.com/gpu.replicas": "4"}
            feed.replace_nodes({name: node_info(node(name, gpus, cpu=cpu, labels=sliced))
                                for name, cpu in (("poor", "24"), ("rich", "104"))})
            answer = feed.prioritize(args(pod("new", cpu="4"), "poor", "rich"), now=0.0)
            assert max(answer, key=lambda h: h["Score"])["Host"] == goes, gpus

    def test_args_without_a_pod_are_refused(self) -> None:
        with pytest.raises(placementfeed.ArgsError):
            feed_with().prioritize({"NodeNames": ["a"]}, now=0.0)


def test_serving_needs_a_certificate_and_a_known_device_policy() -> None:
    with pytest.raises(SettingsError, match="cert_file and key_file"):
        BalancerSettings(extender=ExtenderServing(bind="127.0.0.1:8443"))
    with pytest.raises(SettingsError, match="device_policy"):
        BalancerSettings(extender=ExtenderServing(device_policy="random"))


# --- the HTTPS endpoint --------------------------------------------------------------------------

@pytest.fixture
def certs(tmp_path: Path) -> Path:
    bundle = pki.create_bundle(service="gpugate-balancer", namespace="gpugate-system", now=datetime.now(UTC),
                               days=1, ips=("127.0.0.1",))
    pki.write_bundle(bundle, tmp_path)
    return tmp_path


def serving(certs: Path, **changes: Any) -> BalancerSettings:
    return fast_settings(extender=ExtenderServing(bind="127.0.0.1:0", cert_file=str(certs / pki.CERT_FILE),
                                                  key_file=str(certs / pki.KEY_FILE), **changes))


class Scheduler:
    """What kube-scheduler's HTTPExtender does, on one kept-alive TLS connection trusting only the CA."""

    def __init__(self, port: int, ca: Path) -> None:
        context = ssl.create_default_context(cafile=str(ca))
        self.connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)

    def post(self, path: str, body: bytes) -> tuple[int, Any]:
        self.connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = self.connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else None

    def prioritize(self, extender_args: dict[str, Any]) -> tuple[int, Any]:
        return self.post("/extender/prioritize", json.dumps(extender_args).encode())


def sample(running: Any, name: str, **labels: str) -> float | None:
    return running.balancer.metrics.registry.get_sample_value(name, labels or None)


def test_prioritize_over_https_from_the_watched_caches(fake_kube: FakeKube, start_balancer, certs: Path) -> None:
    fake_kube.put(node("full", {"nvidia.com/gpu": "8"}))
    fake_kube.put(node("empty", {"nvidia.com/gpu": "8"}))
    fake_kube.put(pod("busy", "full", gpus=6))
    running = start_balancer(serving(certs))
    wait_for(lambda: running.balancer.extender is not None and running.balancer.ready(), what="the extender")
    assert sample(running, "gpugate_balancer_extender_serving") == 1
    extender = running.balancer.extender
    assert extender is not None
    scheduler = Scheduler(extender.port, certs / pki.CA_CERT_FILE)
    status, answer = scheduler.prioritize(args(pod("new", gpus=2), "empty", "full"))
    assert status == 200 and [h["Host"] for h in answer] == ["empty", "full"]
    assert answer[1]["Score"] > answer[0]["Score"]
    # The watch moves the cache: once "busy" is gone, both nodes are empty and score alike.
    fake_kube.delete("v1", "Pod", "busy", "ml")

    def equal() -> bool:
        _, again = scheduler.prioritize(args(pod("other", gpus=2), "empty", "full"))  # same connection
        return again[0]["Score"] == again[1]["Score"]

    wait_for(equal, what="the deletion to reach the extender's cache")
    assert sample(running, "gpugate_balancer_extender_requests_total", verb="prioritize", result="ok") >= 2
    assert sample(running, "gpugate_balancer_extender_request_duration_seconds_count", verb="prioritize") >= 2


def test_what_the_scheduler_must_not_get_a_score_from(fake_kube: FakeKube, start_balancer, certs: Path) -> None:
    fake_kube.put(node("n1", {"nvidia.com/gpu": "8"}))
    running = start_balancer(serving(certs))
    wait_for(lambda: running.balancer.extender is not None and running.balancer.ready(), what="the extender")
    assert running.balancer.extender is not None
    scheduler = Scheduler(running.balancer.extender.port, certs / pki.CA_CERT_FILE)
    assert scheduler.post("/extender/filter", b"{}")[0] == 404
    assert scheduler.post("/extender/prioritize", b"not json")[0] == 400
    assert scheduler.prioritize({"NodeNames": ["n1"]})[0] == 400  # no pod
    assert sample(running, "gpugate_balancer_extender_requests_total", verb="prioritize", result="bad_request") == 2


def test_before_the_caches_are_synced_the_answer_is_503(fake_kube: FakeKube, start_balancer, certs: Path) -> None:
    """A partial view would score nodes it has not seen yet as 0; the scheduler ignores a failed call."""
    fake_kube.put(node("n1", {"nvidia.com/gpu": "8"}))
    fake_kube.fail_next("GET", r"/api/v1/pods", code=500, count=1_000_000)
    running = start_balancer(serving(certs))
    wait_for(lambda: running.balancer.extender is not None, what="the listener")
    assert running.balancer.extender is not None
    scheduler = Scheduler(running.balancer.extender.port, certs / pki.CA_CERT_FILE)
    assert scheduler.prioritize(args(pod("new", gpus=1), "n1"))[0] == 503
    assert sample(running, "gpugate_balancer_extender_requests_total", verb="prioritize", result="not_ready") == 1


def test_without_a_certificate_the_labels_go_on_and_a_metric_says_the_extender_is_down(
        fake_kube: FakeKube, start_balancer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extendercache, "EXTENDER_RETRY_SECONDS", 0.1)
    fake_kube.put(node("n1", {"nvidia.com/gpu": "8"}))
    missing = tmp_path / "tls"
    running = start_balancer(serving(missing))
    wait_for(lambda: (fake_kube.get("v1", "Node", "n1") or {})["metadata"].get("labels", {}).get(
        "gpugate.io/gpu-free") == "8", what="the labels")
    assert sample(running, "gpugate_balancer_extender_serving") == 0
    # The Secret arrives (the kubelet fills the optional volume): the extender starts.
    missing.mkdir()
    pki.write_bundle(pki.create_bundle(service="gpugate-balancer", namespace="gpugate-system",
                                       now=datetime.now(UTC), days=1, ips=("127.0.0.1",)), missing)
    wait_for(lambda: sample(running, "gpugate_balancer_extender_serving") == 1, what="the extender to start")


def test_a_standby_serves_the_extender_too(fake_kube: FakeKube, start_balancer, certs: Path) -> None:
    fake_kube.put(node("n1", {"nvidia.com/gpu": "8"}))
    fake_kube.put(node("n2", {"nvidia.com/gpu": "8"}))
    settings = serving(certs)
    settings = dataclasses.replace(settings, lease=dataclasses.replace(
        settings.lease, duration=15.0, renew_deadline=10.0, retry_period=0.5))  # no handover under load
    leader = start_balancer(settings)
    wait_for(lambda: leader.balancer.writes(), what="the leader")
    standby = start_balancer(dataclasses.replace(settings, lease=dataclasses.replace(settings.lease,
                                                                                     identity="replica-b")))
    wait_for(lambda: standby.balancer.extender is not None and standby.balancer.ready(), what="the standby")
    assert not standby.balancer.writes()
    assert standby.balancer.extender is not None
    status, answer = Scheduler(standby.balancer.extender.port, certs / pki.CA_CERT_FILE).prioritize(
        args(pod("new", gpus=1), "n1", "n2"))
    assert status == 200 and {h["Host"] for h in answer} == {"n1", "n2"}


def test_the_inventory_publishes_the_type_pressure_the_extender_learned(fake_kube: FakeKube, start_balancer,
                                                                         certs: Path) -> None:
    """The webhook has no API access: the products that pods pinned to a product need most reach
    its placement step through the GPUInventory (typePressure), from the shape window the extender
    learns from the pods it sees bind. Here the pinned pods ask for the T4 node's GPUs alone."""
    from webhook.balancer.settings import InventorySettings
    from webhook.kube import inventory as webhook_inventory

    fake_kube.register("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", namespaced=False)
    fake_kube.put(node("t4", {"nvidia.com/gpu": "2"}, labels={"nvidia.com/gpu.product": "Tesla-T4"}))
    for name in ("g2-a", "g2-b"):
        fake_kube.put(node(name, {"nvidia.com/gpu": "8"}, labels={"nvidia.com/gpu.product": "ALIBABA-G2"}))
    pinned = pod("pinned", "t4", gpus=1)
    pinned["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "Tesla-T4"}
    fake_kube.put(pinned)
    fake_kube.put(pod("free", "g2-a", gpus=1))
    settings = dataclasses.replace(serving(certs), inventory=InventorySettings(min_interval=0.1, refresh=30.0))
    start_balancer(settings)

    def pressure() -> dict[str, float]:
        stored = fake_kube.get("v1", "ConfigMap", "gpugate-inventory", settings.lease.namespace or "gpugate-system")
        if stored is None:
            return {}
        return dict(webhook_inventory.parse(stored["data"]["inventory.json"]).type_pressure)

    found = wait_for(lambda: pressure().get("Tesla-T4"), what="the T4's type pressure in the inventory")
    assert found >= 0.5 and "ALIBABA-G2" not in pressure()


def test_a_configured_pod_mix_is_what_the_running_extender_measures_with(fake_kube: FakeKube, start_balancer,
                                                                         certs: Path, tmp_path: Path) -> None:
    mix_file = tmp_path / "pod-mix.yaml"
    mix_file.write_text("- {cpu: 4000, gpus: 2, weight: 3}\n- {cpu: 1000, gpus: 1, gpuMilli: 250, weight: 1}\n")
    fake_kube.put(node("n1", {"nvidia.com/gpu": "8"}))
    fake_kube.put_many(pod(f"p{i}", "n1", cpu="2", gpus=1) for i in range(150))
    running = start_balancer(serving(certs, mix_file=str(mix_file)))
    wait_for(lambda: running.balancer.extender is not None and running.balancer.ready(), what="the extender")
    assert running.balancer.feed is not None
    mix = running.balancer.feed.state.fragmenter.mix
    # The 150 one-GPU pods listed would have taught a mix of their own shape; the file wins.
    assert [(s.cpu, s.gpus, s.milli) for s in mix.shapes] == [(4000, 2, 1000), (1000, 1, 250)]
    assert mix.weights == (0.75, 0.25)


def test_the_mix_in_use_is_served_as_the_yaml_that_pins_it(fake_kube: FakeKube, start_balancer, certs: Path,
                                                           tmp_path: Path) -> None:
    """Learned from the pods listed, shown on /extender/mix; that file given back configures the same mix."""
    fake_kube.put(node("n1", {"nvidia.com/gpu": "8"}))
    fake_kube.put_many(pod(f"p{i}", "n1", cpu="2", gpus=1 + i % 2) for i in range(150))
    running = start_balancer(serving(certs), serve_health=True)
    wait_for(lambda: running.balancer.health is not None and running.balancer.ready(), what="the caches")
    assert running.balancer.health is not None and running.balancer.feed is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{running.balancer.health.port}/extender/mix", timeout=5) as got:
        assert got.headers["Content-Type"] == "application/yaml"
        text = got.read().decode()
    learned = running.balancer.feed.state.fragmenter.mix
    assert sorted((s.cpu, s.gpus) for s in learned.shapes) == [(2000, 1), (2000, 2)]
    pinned = tmp_path / "pod-mix.yaml"
    pinned.write_text(text)
    assert load_mix(str(pinned)) == learned


def test_without_the_extender_there_is_no_mix_to_show(start_balancer) -> None:
    running = start_balancer(serve_health=True)
    wait_for(lambda: running.balancer.health is not None, what="the health server")
    assert running.balancer.health is not None
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{running.balancer.health.port}/extender/mix", timeout=5)
    assert err.value.code == 404 and b"not served" in err.value.read()
