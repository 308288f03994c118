"""A faulty GPU is quarantined per device on the real control plane, and returns only after it passes a check.

Kubernetes v1.37.2 (DeviceTaintRule in ``resource.k8s.io/v1``, its device-taint eviction controller
on in kube-controller-manager by default), a real Prometheus scraping dcgm-exporter pages, and
``gpugate balance`` as its shipped ServiceAccount (two replicas; one holds the Lease) with a health
policy in seconds (tests/e2e/health_env.py). What each test shows:

- the policy's dry run writes a ``None`` rule, on which kube-controller-manager counts the pods a
  NoExecute would evict, and evicts none;
- a fatal XID on one GPU of an 8-GPU DRA node: one DeviceTaintRule for exactly that device;
  NoExecute makes kube-controller-manager delete the pod on it and no pod on the healthy GPUs;
  application (43) and non-fatal (94) XIDs on two other GPUs quarantine nothing; new claims get
  only healthy devices; after the hold a validation pod claims exactly that GPU, succeeds, and
  the rule goes (a claim waiting for a GPU then gets it);
- flapping: the same GPU failing again holds longer (by `hold_growth`), and so does a failed validation;
- a MIG-partitioned GPU's MIG devices are tainted with it, its neighbour's are not;
- the device-plugin fallback: the node gets ``gpugate.io/gpu-unhealthy`` and ``gpu-free`` drops by one;
- the standby replica never acts; with Prometheus down, nothing returns.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e import dra_slices
from tests.e2e.balancer_access import NAMESPACE, rbac_applied
from tests.e2e.health_env import GROWTH, HOLD, VALIDATION_IMAGE, HealthRig, Replica, RuleWatch, config, health_rig
from tests.e2e.test_dra_allocation import claim_pod, claims_of
from tests.e2e.waiting import wait_until
from webhook import names
from webhook.kube import allocations
from webhook.localcluster.cluster import Cluster, Nodes
from webhook.localcluster.kubeletobjects import PodLifecycle

pytestmark = pytest.mark.usefixtures("device_classes")


@pytest.fixture(scope="module")
def device_classes(cluster: Cluster) -> None:
    dra_slices.install_device_classes(cluster.api_client())


@pytest.fixture(scope="module")
def rig(cluster: Cluster, workdir: Path) -> Iterator[HealthRig]:
    with rbac_applied(cluster), health_rig(cluster, workdir) as made:
        yield made


@pytest.fixture(scope="module")
def replicas(rig: HealthRig) -> list[Replica]:
    """Two replicas of the balancer with the health policy; the Lease picks the leader."""
    rig.forget()
    started = [rig.start("health-a", config()), rig.start("health-b", config())]
    wait_until(lambda: _leads(rig), what="a replica holding the Lease", timeout=60, explain=rig.logs)
    return started


def _leads(rig: HealthRig) -> bool:
    try:
        return rig.leader() is not None
    except (client.ApiException, StopIteration):
        return False


@pytest.fixture
def one_gpu(cluster: Cluster, namespace: str) -> str:
    client.ResourceV1Api(cluster.api_client()).create_namespaced_resource_claim_template(
        namespace, dra_slices.claim_template("one-gpu"))
    return namespace


def held(cluster: Cluster, namespace: str) -> dict[str, str]:
    """Pod -> the device its claim holds."""
    out = {}
    for stored in claims_of(cluster, namespace):
        claim = allocations.parse(stored)
        for result in claim.held():
            for consumer in claim.reserved_for:
                out[consumer.name] = result.key.device
    return out


def devices_of(rules: dict[str, dict[str, Any]], node: str) -> set[str]:
    return {r["spec"]["deviceSelector"]["device"] for r in rules.values()
            if r["spec"]["deviceSelector"]["pool"] == node}


def when_count(found: dict[str, str], count: int) -> dict[str, str] | None:
    return found if len(found) == count else None


def pod_events(cluster: Cluster, namespace: str, reason: str) -> set[str]:
    return {e.involved_object.name for e in cluster.core().list_namespaced_event(namespace).items if e.reason == reason}


def node_events(cluster: Cluster, node: str) -> list[str]:
    return [e.reason for e in cluster.core().list_namespaced_event("default").items
            if e.involved_object.kind == "Node" and e.involved_object.name == node]


def test_the_policys_dry_run_writes_a_none_rule_and_evicts_nothing(
        rig: HealthRig, cluster: Cluster, nodes: Nodes, one_gpu: str) -> None:
    gpus = rig.dra_node(nodes, "h-dry", gpus=2)
    dry = rig.start("health-dry", config(dry_run=True))
    try:
        core = cluster.core()
        core.create_namespaced_pod(one_gpu, claim_pod("on-gpu", "one-gpu"))
        device = wait_until(lambda: held(cluster, one_gpu).get("on-gpu"), what="the pod's GPU", timeout=60,
                            explain=rig.logs)
        rig.xid("h-dry", int(device.removeprefix("gpu-")), 79)
        (rule,) = wait_until(lambda: list(rig.rules().values()), what="the dry-run rule", timeout=30,
                             explain=rig.logs)
        assert rule["spec"]["taint"]["effect"] == "None" and rule["spec"]["deviceSelector"]["device"] == device
        status = wait_until(lambda: _eviction_status(rig, rule["metadata"]["name"]), timeout=30,
                            what="kube-controller-manager's dry-run count on the rule", explain=rig.logs)
        assert status["reason"] == "NoEffect" and "1 pod" in status["message"], status
        time.sleep(2)
        assert core.read_namespaced_pod("on-gpu", one_gpu).metadata.deletion_timestamp is None
        assert pod_events(cluster, one_gpu, "DeviceTaintManagerEviction") == set()
        assert gpus[int(device.removeprefix("gpu-"))].uuid in json.dumps(rule["metadata"]["annotations"])
    finally:
        dry.stop()
        rig.replicas.remove(dry)
        rig.forget()


def _eviction_status(rig: HealthRig, name: str) -> dict[str, str] | None:
    found = rig.rules().get(name) or {}
    return next((c for c in (found.get("status") or {}).get("conditions") or ()
                 if c["type"] == "EvictionInProgress" and c.get("reason") == "NoEffect"), None)


def test_a_fatal_xid_quarantines_exactly_its_gpu_evicts_its_pod_and_it_returns_after_validation(
        rig: HealthRig, replicas: list[Replica], cluster: Cluster, nodes: Nodes, one_gpu: str) -> None:
    gpus = rig.dra_node(nodes, "h-dra", gpus=8)
    core = cluster.core()
    for i in range(5):
        core.create_namespaced_pod(one_gpu, claim_pod(f"work-{i}", "one-gpu"))
    placed = wait_until(lambda: when_count(held(cluster, one_gpu), 5), timeout=60,
                        what="five pods on five GPUs", explain=rig.logs)
    target = placed["work-0"]
    index = int(target.removeprefix("gpu-"))
    others = sorted(set(range(8)) - {int(d.removeprefix("gpu-")) for d in placed.values()})
    watch = RuleWatch(cluster)
    try:
        injected = rig.xid("h-dra", index, 79)
        rig.xid("h-dra", others[0], 43)
        rig.xid("h-dra", others[1], 94)
        wait_until(lambda: devices_of(rig.rules(), "h-dra"), what="the DeviceTaintRule", timeout=30, explain=rig.logs)
        print(f"XID 79 to DeviceTaintRule: {max(watch.seen.values()) - injected:.2f} s")
        # New claims get healthy devices only (asked before the hold ends): three healthy GPUs are free.
        for i in range(5, 9):
            core.create_namespaced_pod(one_gpu, claim_pod(f"late-{i}", "one-gpu"))
        rules = rig.rules()
        assert devices_of(rules, "h-dra") == {target}
        (rule,) = rules.values()
        assert rule["spec"]["taint"] == {"key": names.UNHEALTHY_TAINT_KEY, "value": "xid-79", "effect": "NoExecute",
                                         "timeAdded": rule["spec"]["taint"]["timeAdded"]}
        # kube-controller-manager's device-taint eviction controller deletes the pod on it, and only that pod.
        wait_until(lambda: pod_events(cluster, one_gpu, "DeviceTaintManagerEviction") == {"work-0"}, timeout=30,
                   what="the eviction controller marking work-0", explain=rig.logs)
        wait_until(lambda: "work-0" not in {p.metadata.name for p in core.list_namespaced_pod(one_gpu).items},
                   what="work-0 deleted", timeout=30)
        late = wait_until(lambda: when_count(
            {p: d for p, d in held(cluster, one_gpu).items() if p.startswith("late")}, 3),
            what="three late pods placed", timeout=60, explain=rig.logs)
        assert target not in late.values() and devices_of(rig.rules(), "h-dra") == {target}, \
            "the late pods were placed while the GPU was out, on other GPUs"
        waiting = ({f"late-{i}" for i in range(5, 9)} - set(late)).pop()
        running = {p.metadata.name for p in core.list_namespaced_pod(one_gpu).items}
        assert running == {f"work-{i}" for i in range(1, 5)} | {f"late-{i}" for i in range(5, 9)}
        assert "GPUQuarantined" in node_events(cluster, "h-dra")
        # After the hold a validation pod claims exactly that GPU, passes, and the GPU returns: the waiting
        # pod gets it.
        wait_until(lambda: not rig.rules(), what="the rule removed after a passed validation", timeout=60,
                   explain=rig.logs)
    finally:
        watch.stop()
    assert set(watch.seen) == {rule["metadata"]["name"]}, "XIDs 43 and 94 quarantined nothing, ever"
    assert wait_until(lambda: held(cluster, one_gpu).get(waiting), what="the waiting pod placed", timeout=60) == target
    (back,) = rig.ledger().returned
    assert (back.how, back.gpu) == ("validated", gpus[index].uuid)
    assert pod_events(cluster, NAMESPACE, "DeviceTaintManagerEviction") == set(), \
        "the validation pod tolerates NoExecute"
    assert {"GPUValidationStarted", "GPUReturned"} <= set(node_events(cluster, "h-dra"))


def test_a_gpu_that_fails_again_holds_longer_and_a_failed_validation_extends_its_hold(
        rig: HealthRig, replicas: list[Replica], cluster: Cluster, nodes: Nodes) -> None:
    gpus = rig.dra_node(nodes, "h-flap", gpus=2)
    uuid = gpus[1].uuid

    def quarantine() -> Any:
        return rig.ledger().find("h-flap", uuid)

    rig.xid("h-flap", 1, 48)
    first = wait_until(quarantine, what="the first quarantine", timeout=30, explain=rig.logs)
    assert first.hold_until - first.since == pytest.approx(HOLD)
    wait_until(lambda: quarantine() is None, what="the first return", timeout=60, explain=rig.logs)
    cluster.kubelet.lifecycle = PodLifecycle(crash_images=frozenset({VALIDATION_IMAGE}))
    try:
        rig.xid("h-flap", 1, 79)  # a new XID, after the return: a second strike
        second = wait_until(quarantine, what="the second quarantine", timeout=30, explain=rig.logs)
        assert (second.strikes, second.hold_until - second.since) == (2, pytest.approx(GROWTH * HOLD))
        failed = wait_until(lambda: (q := quarantine()) is not None and q.failed_validations == 1 and q,
                            what="a failed validation", timeout=60, explain=rig.logs)
        assert failed.hold_until > second.hold_until
        wait_until(lambda: "GPUValidationFailed" in node_events(cluster, "h-flap"), what="its Event", timeout=10,
                   explain=lambda: f"{node_events(cluster, 'h-flap')}\n{rig.logs()}")
        assert devices_of(rig.rules(), "h-flap") == {"gpu-1"}
    finally:
        cluster.kubelet.lifecycle = PodLifecycle()
    wait_until(lambda: quarantine() is None, what="the return once a validation passes", timeout=90,
               explain=rig.logs)
    assert rig.ledger().last_return("h-flap", uuid).strikes == 2


def test_the_eviction_api_first_honours_a_budget_until_noexecute_deletes_what_it_kept(
        rig: HealthRig, replicas: list[Replica], cluster: Cluster, nodes: Nodes, one_gpu: str) -> None:
    rig.dra_node(nodes, "h-evict", gpus=2)
    core = cluster.core()
    for name in ("kept", "free"):
        pod = claim_pod(name, "one-gpu")
        pod["metadata"]["labels"]["app"] = name
        core.create_namespaced_pod(one_gpu, pod)
    client.PolicyV1Api(cluster.api_client()).create_namespaced_pod_disruption_budget(one_gpu, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "kept"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "kept"}}}})
    placed = wait_until(lambda: when_count(held(cluster, one_gpu), 2), what="both pods placed", timeout=60,
                        explain=rig.logs)
    for name in ("kept", "free"):
        rig.xid("h-evict", int(placed[name].removeprefix("gpu-")), 64)

    def effects() -> set[str]:
        return {r["spec"]["taint"]["effect"] for r in rig.rules().values()
                if r["spec"]["deviceSelector"]["pool"] == "h-evict"}

    wait_until(lambda: effects() == {"NoSchedule"}, what="both GPUs NoSchedule first", timeout=30, explain=rig.logs)
    wait_until(lambda: [p.metadata.name for p in core.list_namespaced_pod(one_gpu).items] == ["kept"],
               what="the pod without a budget evicted through the Eviction API", timeout=30, explain=rig.logs)
    assert effects() == {"NoSchedule"}, "evicted before NoExecute"
    assert pod_events(cluster, one_gpu, "DeviceTaintManagerEviction") == set()
    wait_until(lambda: effects() == {"NoExecute"}, what="NoExecute after no_execute_after", timeout=30,
               explain=rig.logs)
    wait_until(lambda: pod_events(cluster, one_gpu, "DeviceTaintManagerEviction") == {"kept"}, timeout=30,
               what="kube-controller-manager deleting the pod its budget kept", explain=rig.logs)


def test_the_mig_devices_of_a_faulty_gpu_are_tainted_with_it_and_its_neighbours_stay_schedulable(
        rig: HealthRig, replicas: list[Replica], cluster: Cluster, nodes: Nodes, namespace: str) -> None:
    gpus = rig.dra_node(nodes, "h-mig", gpus=2, mig=True)
    rig.xid("h-mig", 1, 95)
    expected = {"gpu-1"} | {dra_slices.mig_name(gpus[1], p, s) for p in dra_slices.H100_PROFILES for s in p.starts}
    wait_until(lambda: devices_of(rig.rules(), "h-mig") == expected, what="gpu-1 and its 13 MIG devices tainted",
               timeout=30, explain=rig.logs)
    resource = client.ResourceV1Api(cluster.api_client())
    resource.create_namespaced_resource_claim_template(namespace, dra_slices.claim_template(
        "one-1g", device_class="mig.nvidia.com", selector="device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"))
    cluster.core().create_namespaced_pod(namespace, claim_pod("notebook", "one-1g"))
    device = wait_until(lambda: held(cluster, namespace).get("notebook"), what="a MIG device for the notebook",
                        timeout=60, explain=rig.logs)
    assert device.startswith("gpu-0-mig-1g10gb-")


def test_under_the_device_plugin_the_node_is_tainted_and_gpu_free_drops_by_the_faulty_gpu(
        rig: HealthRig, replicas: list[Replica], cluster: Cluster, nodes: Nodes) -> None:
    node = nodes.gpu("h-plugin", gpus=8)
    rig.export("h-plugin", 8)

    def marks() -> tuple[str | None, list[tuple[str, str]]]:
        found = cluster.core().read_node(node)
        return ((found.metadata.labels or {}).get(names.GPU_FREE_LABEL),
                [(t.key, t.effect) for t in found.spec.taints or () if t.key == names.UNHEALTHY_TAINT_KEY])

    wait_until(lambda: marks()[0] == "8", what="gpu-free 8", timeout=30, explain=rig.logs)
    rig.xid("h-plugin", 2, 79)
    wait_until(lambda: marks() == ("7", [(names.UNHEALTHY_TAINT_KEY, "NoSchedule")]),
               what="the node tainted and gpu-free 8 -> 7", timeout=30, explain=rig.logs)
    assert not devices_of(rig.rules(), node)


def test_the_standby_replica_never_acts(rig: HealthRig, replicas: list[Replica]) -> None:
    leader = rig.leader()
    (standby,) = [r for r in replicas if r is not leader]
    assert leader.metric("gpugate_balancer_health_last_pass_timestamp_seconds") > 0
    assert leader.metric("gpugate_balancer_health_actions_total", action="quarantined") >= 1
    assert standby.metric("gpugate_balancer_health_last_pass_timestamp_seconds") == 0
    assert standby.metric("gpugate_balancer_health_actions_total") == 0
    assert standby.metric("gpugate_balancer_health_writes_total") == 0


def test_while_prometheus_is_down_no_gpu_returns(
        rig: HealthRig, replicas: list[Replica], cluster: Cluster, nodes: Nodes) -> None:
    rig.dra_node(nodes, "h-down", gpus=2)
    rig.xid("h-down", 0, 74)
    quarantined = wait_until(lambda: rig.ledger().find("h-down", rig.readings["h-down"][0].device.uuid),
                             what="the quarantine", timeout=30, explain=rig.logs)
    rig.prometheus.stop()  # the last test of the module: Prometheus does not come back
    leader = rig.leader()
    wait_until(lambda: leader.metric("gpugate_balancer_health_signals_up") == 0, what="the leader seeing it down",
               timeout=30, explain=rig.logs)
    time.sleep(max(quarantined.hold_until - time.time(), 0) + 3)  # the hold is over, several passes later...
    q = rig.ledger().find("h-down", quarantined.gpu)
    assert q is not None and q.validation == "", "no validation starts while a fault could be hiding"
    assert devices_of(rig.rules(), "h-down") == {"gpu-0"}
