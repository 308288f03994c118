"""The GPUInventory: what the balancer computes from its caches (pure, table tests) and how
the leader publishes it into the gpugate-inventory ConfigMap (the real client against tests/kubefake.py).

The document is checked by the webhook's own reader (``webhook.kube.inventory.parse``), so the
two sides cannot drift apart on the format.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.balancer import conftest
from tests.balancer.conftest import fast_settings
from tests.kubefake import FakeKube
from webhook.balancer.settings import InventorySettings
from webhook.kube import inventory as webhook_inventory
from webhook.kube.gpunode import node_info
from webhook.kube.inventory import Offer
from webhook.placement import gpuinventory as inventory


def wait_for(predicate: Any, *, what: str, timeout: float = 30.0) -> Any:
    """``conftest.wait_for`` with room for a loaded machine: a balancer starting (caches, TLS, a
    lease) on 2 shared cores can take seconds; the wait still ends at the event."""
    return conftest.wait_for(predicate, timeout=timeout, what=what)


H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"
NS = "gpugate-system"


def node(name: str, allocatable: dict[str, str], *, product: str | None = H100, memory: str | None = "81559",
         labels: dict[str, str] | None = None, cordoned: bool = False) -> dict[str, Any]:
    gfd = {k: v for k, v in (("nvidia.com/gpu.product", product), ("nvidia.com/gpu.memory", memory)) if v}
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "labels": {**gfd, **(labels or {})}},
                            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **allocatable}}}
    if cordoned:
        body["spec"] = {"unschedulable": True}
    return body


def offers_of(*nodes: dict[str, Any], requested: dict[str, dict[str, int]] | None = None) -> list[Offer]:
    return list(inventory.offers([node_info(n) for n in nodes], requested or {}))


class TestOffers:
    def test_whole_gpus_are_summed_per_product_and_free_is_allocatable_minus_bound_requests(self) -> None:
        found = offers_of(node("a", {"nvidia.com/gpu": "8"}), node("b", {"nvidia.com/gpu": "8"}),
                          node("c", {"nvidia.com/gpu": "4"}, product=A100, memory="40960"),
                          requested={"a": {"nvidia.com/gpu": 6}, "c": {"nvidia.com/gpu": 1}})
        assert found == [
            Offer(resource="nvidia.com/gpu", product=A100, memory_mib=40960, allocatable=4, free=3, nodes=1),
            Offer(resource="nvidia.com/gpu", product=H100, memory_mib=81559, allocatable=16, free=10, nodes=2),
        ]

    def test_only_gpu_resources_are_offered_not_nics_nor_cpu(self) -> None:
        found = offers_of(node("a", {"nvidia.com/gpu": "2", "nvidia.com/cx7_sriov_rdma": "16"}),
                          node("cpu", {}, product=None, memory=None))
        assert [o.resource for o in found] == ["nvidia.com/gpu"]

    def test_mig_slices_carry_their_own_memory_label_and_shares_the_gpus(self) -> None:
        mig = node("mig", {"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"},
                   labels={"nvidia.com/mig-1g.10gb.memory": "9728", "nvidia.com/mig-3g.40gb.memory": "40192"})
        shared = node("ts", {"nvidia.com/gpu.shared": "16"}, labels={"nvidia.com/gpu.replicas": "4"})
        found = {o.resource: o for o in offers_of(mig, shared, requested={"mig": {"nvidia.com/mig-1g.10gb": 7}})}
        assert (found["nvidia.com/mig-1g.10gb"].memory_mib, found["nvidia.com/mig-1g.10gb"].free) == (9728, 0)
        assert (found["nvidia.com/mig-3g.40gb"].memory_mib, found["nvidia.com/mig-3g.40gb"].free) == (40192, 2)
        # A time-sliced share has no memory of its own: it may use all of its GPU's.
        assert (found["nvidia.com/gpu.shared"].memory_mib, found["nvidia.com/gpu.shared"].free) == (81559, 16)

    def test_single_strategy_slices_are_their_own_product(self) -> None:
        found = offers_of(node("s", {"nvidia.com/gpu": "8"}, product=f"{H100}-MIG-3g.40gb", memory="40448"),
                          node("w", {"nvidia.com/gpu": "8"}))
        assert [(o.product, o.memory_mib) for o in found] == [(H100, 81559), (f"{H100}-MIG-3g.40gb", 40448)]

    @pytest.mark.parametrize(("memories", "expected"), [
        (("81559", "81559"), 81559),
        (("81559", "81920"), 81559),   # the offer promises at least the smallest unit
        (("81559", None), None),        # one node does not say: the offer does not vouch for any
    ])
    def test_unit_memory_is_the_smallest_known_and_unknown_if_any_node_is_silent(self, memories, expected) -> None:
        found = offers_of(*(node(f"n{i}", {"nvidia.com/gpu": "1"}, memory=m) for i, m in enumerate(memories)))
        assert [o.memory_mib for o in found] == [expected]

    def test_a_cordoned_node_offers_nothing_free_but_still_counts(self) -> None:
        found = offers_of(node("a", {"nvidia.com/gpu": "8"}, cordoned=True), node("b", {"nvidia.com/gpu": "8"}))
        assert (found[0].allocatable, found[0].free, found[0].nodes) == (16, 8, 2)

    def test_free_never_goes_below_zero_when_allocatable_shrank_under_running_pods(self) -> None:
        found = offers_of(node("a", {"nvidia.com/gpu": "4"}), node("b", {"nvidia.com/gpu": "4"}),
                          requested={"a": {"nvidia.com/gpu": 6}})
        assert found[0].free == 4

    def test_a_gpu_node_without_gfd_labels_is_offered_with_unknown_product_and_memory(self) -> None:
        [found] = offers_of(node("bare", {"nvidia.com/gpu": "2"}, product=None, memory=None))
        assert (found.product, found.memory_mib, found.free) == ("", None, 2)


@pytest.mark.parametrize(("classes", "expected"), [
    ({}, None),
    ({"batch": False, "gpugate-critical": False}, None),
    ({"batch": False, "standard": True}, "standard"),
    ({"z-default": True, "a-default": True}, "a-default"),   # a race let two in: stable across replicas
])
def test_the_default_priority_class_is_the_global_default_one(classes, expected) -> None:
    assert inventory.default_priority_class(classes) == expected


def test_the_document_is_what_the_webhook_reads_and_fresh_by_its_rule() -> None:
    found = inventory.content([node_info(node("a", {"nvidia.com/gpu": "8"}))], {"a": {"nvidia.com/gpu": 3}},
                              {"standard": True})
    now = datetime(2026, 12, 1, 10, 0, 0, 250_000, tzinfo=UTC)
    text = inventory.serialize(inventory.document(found, generated_at=now))
    read = webhook_inventory.parse(text)
    assert read.offers == found.offers
    assert read.default_priority_class == "standard"
    assert read.generated_at == now
    assert read.fresh(now + timedelta(seconds=300), 300) and not read.fresh(now + timedelta(seconds=300.01), 300)
    assert text == inventory.serialize(inventory.document(found, generated_at=now)), "stable bytes"


def test_content_compares_equal_when_only_the_time_would_differ() -> None:
    nodes = [node_info(node("a", {"nvidia.com/gpu": "8"}))]
    assert inventory.content(nodes, {}, {}) == inventory.content(nodes, {}, {})
    assert inventory.content(nodes, {}, {}) != inventory.content(nodes, {"a": {"nvidia.com/gpu": 1}}, {})


# --- publishing: the leader writes the ConfigMap ----------------------------------------------------

def bound(name: str, node_name: str, resource: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {resource: str(count)}}}]},
            "status": {"phase": "Running"}}


def priority_class(name: str, default: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                            "metadata": {"name": name}, "value": 1000}
    if default:
        body["globalDefault"] = True
    return body


def published(fk: FakeKube) -> webhook_inventory.Inventory | None:
    found = fk.get("v1", "ConfigMap", "gpugate-inventory", NS)
    return webhook_inventory.parse(found["data"]["inventory.json"]) if found else None


def free(fk: FakeKube) -> dict[str, int] | None:
    try:
        document = published(fk)
    except webhook_inventory.InventoryError:
        return None
    return None if document is None else {o.resource: o.free for o in document.offers}


def configmap_writes(fk: FakeKube) -> list[Any]:
    return [r for r in fk.requests if r.method in ("POST", "PUT") and "/configmaps" in r.path]


def publishing(**inventory_settings: Any) -> Any:
    return fast_settings(inventory=InventorySettings(**{"min_interval": 0.1, "refresh": 30.0,
                                                        **inventory_settings}))


def steady(settings: Any) -> Any:
    """client-go's lease timing, not the tests' tenths of a second: a loaded machine must not hand over
    (a new leader writes at once, which a test of write timing would read as a write too early)."""
    return dataclasses.replace(settings, lease=dataclasses.replace(
        settings.lease, duration=15.0, renew_deadline=10.0, retry_period=0.5))


@pytest.fixture
def cluster(fake_kube: FakeKube) -> FakeKube:
    fake_kube.register("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", namespaced=False)
    fake_kube.put(node("gpu-1", {"nvidia.com/gpu": "8"}))
    fake_kube.put(node("mig-1", {"nvidia.com/mig-1g.10gb": "7"}, labels={"nvidia.com/mig-1g.10gb.memory": "9728"}))
    fake_kube.put(priority_class("standard", default=True))
    return fake_kube


def test_the_leader_creates_the_configmap_then_updates_it_as_pods_bind(cluster: FakeKube, start_balancer) -> None:
    start_balancer(publishing())
    wait_for(lambda: free(cluster) == {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 7}, what="the first inventory")
    document = published(cluster)
    assert document is not None and document.default_priority_class == "standard"
    assert document.fresh(datetime.now(UTC), 60)
    stored = cluster.get("v1", "ConfigMap", "gpugate-inventory", NS)
    assert stored is not None and stored["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpugate-balancer"

    cluster.put(bound("slice", "mig-1", "nvidia.com/mig-1g.10gb", 3))
    cluster.put(bound("train", "gpu-1", "nvidia.com/gpu", 8))
    wait_for(lambda: free(cluster) == {"nvidia.com/gpu": 0, "nvidia.com/mig-1g.10gb": 4}, what="the bound pods")
    cluster.delete("v1", "Pod", "train", "ml")
    wait_for(lambda: free(cluster) == {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 4}, what="the deleted pod")
    methods = [r.method for r in configmap_writes(cluster)]
    assert methods[0] == "POST" and set(methods[1:]) == {"PUT"}, methods


def test_the_default_priority_class_follows_the_watch(cluster: FakeKube, start_balancer) -> None:
    start_balancer(publishing())
    wait_for(lambda: (published(cluster) or webhook_inventory.EMPTY).default_priority_class == "standard",
             what="the first inventory")
    cluster.delete("scheduling.k8s.io/v1", "PriorityClass", "standard")
    cluster.put(priority_class("batch", default=True))
    wait_for(lambda: (published(cluster) or webhook_inventory.EMPTY).default_priority_class == "batch",
             what="the new global default")


def test_an_unchanged_inventory_is_written_again_only_to_refresh_generated_at(cluster: FakeKube,
                                                                                start_balancer) -> None:
    running = start_balancer(steady(publishing(refresh=1.0)))
    wait_for(lambda: len(configmap_writes(cluster)) >= 1, what="the first write")
    first = cluster.get("v1", "ConfigMap", "gpugate-inventory", NS)
    # Node events that change nothing the inventory says (a label of someone else's) cost no write...
    for index in range(5):
        cluster.put(node("gpu-1", {"nvidia.com/gpu": "8"}, labels={"team": f"t{index}"}))
    wait_for(lambda: len(configmap_writes(cluster)) >= 2, timeout=30, what="the refresh")
    writes = configmap_writes(cluster)
    assert writes[1].at - writes[0].at >= 0.9, "a write before the refresh was due"
    assert first is not None and published(cluster) is not None
    # The fake records a write when it arrives; the balancer counts it once the answer is back.
    wait_for(lambda: (running.balancer.metrics.registry.get_sample_value("gpugate_balancer_inventory_writes_total",
                                                                         {"result": "ok"}) or 0) >= 2,
             timeout=10, what="both writes counted ok")


def test_a_configmap_left_by_someone_else_is_replaced_keeping_its_labels(cluster: FakeKube, start_balancer) -> None:
    cluster.put({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "gpugate-inventory", "namespace": NS, "labels": {"argocd.argoproj.io/x": "y"}},
                 "data": {"inventory.json": "{}"}})
    start_balancer(publishing())
    wait_for(lambda: free(cluster) == {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 7}, what="the replaced data")
    labels = cluster.get("v1", "ConfigMap", "gpugate-inventory", NS)["metadata"]["labels"]
    assert labels["argocd.argoproj.io/x"] == "y" and labels["app.kubernetes.io/managed-by"] == "gpugate-balancer"
    assert [r.method for r in configmap_writes(cluster)] == ["PUT"]


def test_only_the_lease_holder_writes_the_inventory(cluster: FakeKube, start_balancer) -> None:
    settings = steady(publishing())
    a = start_balancer(settings)
    wait_for(lambda: a.balancer.writes(), what="replica-a to lead")
    b = start_balancer(dataclasses.replace(settings, lease=dataclasses.replace(settings.lease, identity="replica-b")))
    wait_for(lambda: b.balancer.synced, what="replica-b's caches")
    cluster.put(bound("train", "gpu-1", "nvidia.com/gpu", 2))
    wait_for(lambda: (free(cluster) or {}).get("nvidia.com/gpu") == 6, what="the leader's update")
    agents = {r.user_agent for r in configmap_writes(cluster)}
    assert agents == {"gpugate-balancer (replica-a)"}, agents


def test_without_the_priority_class_list_nothing_partial_is_published(fake_kube: FakeKube, start_balancer) -> None:
    """A server that refuses PriorityClasses (a missing RBAC rule) gets no inventory, and says so in a metric:
    one without the default class would make the webhook keep an API-server default as if the pod chose it."""
    fake_kube.put(node("gpu-1", {"nvidia.com/gpu": "8"}))
    # The fake serves PriorityClasses; refuse every list and watch of them, as RBAC would.
    fake_kube.fail_next("GET", r"^/apis/scheduling\.k8s\.io/v1/priorityclasses$", code=403, count=1_000_000)
    running = start_balancer(publishing())
    wait_for(lambda: running.balancer.metrics.registry.get_sample_value(
        "gpugate_balancer_api_errors_total", {"operation": "priorityclasses.list"}), what="the refused list")
    assert running.balancer.inventory_content() is None
    assert not configmap_writes(fake_kube)


class Records(logging.Handler):
    """The log records of one logger, kept whatever the logging configuration propagates."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_dry_run_logs_the_inventory_it_would_publish_and_writes_nothing(cluster: FakeKube,
                                                                          start_balancer) -> None:
    """``--dry-run`` logged label changes but not the GPUInventory."""
    records = Records()
    logger = logging.getLogger("gpugate.balancer.inventory")
    level = logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    try:
        running = start_balancer(dataclasses.replace(publishing(), dry_run=True))
        dry = wait_for(lambda: [r for r in records.records if r.getMessage() == "dry run: would publish inventory"],
                       what="the dry-run inventory line")
        fields = dry[0].__dict__["fields"]
        assert fields["configmap"] == f"{NS}/gpugate-inventory" and fields["key"] == "inventory.json"
        document = fields["inventory"]
        assert document["kind"] == "GPUInventory" and document["defaultPriorityClass"] == "standard"
        assert {o["resource"]: o["free"] for o in document["offers"]} == {"nvidia.com/gpu": 8,
                                                                          "nvidia.com/mig-1g.10gb": 7}
        cluster.put(bound("train", "gpu-1", "nvidia.com/gpu", 8))
        wait_for(lambda: len([r for r in records.records if r.getMessage().startswith("dry run: would publish")]) == 2,
                 what="the changed inventory logged once")
        running.stop()
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert configmap_writes(cluster) == []
    assert cluster.get("v1", "ConfigMap", "gpugate-inventory", NS) is None
