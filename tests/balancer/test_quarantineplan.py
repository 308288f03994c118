"""What a ledger asks of the cluster: exactly the faulty GPU's devices tainted, its neighbours untouched."""

from __future__ import annotations

import dataclasses

from tests.e2e import dra_slices
from webhook import names
from webhook.balancer import quarantineplan
from webhook.balancer.healthpolicy import Eviction, HealthPolicy
from webhook.balancer.quarantineledger import Ledger, Quarantine
from webhook.kube import allocations, nodedevices, slices
from webhook.kube.allocations import DeviceKey
from webhook.kube.gpunode import node_info

NODE = "dra-1"
POLICY = HealthPolicy(enabled=True)


def dra(count: int = 8, *, mig: bool = False, shares: str | None = None, held: tuple[str, ...] = ()):
    found = dra_slices.gpus(count, node=NODE, mig=mig, consumable_shares=shares)
    parsed = [slices.parse(s) for s in dra_slices.node_slices(NODE, found)]
    claims = [claim(d) for d in held]
    return found, nodedevices.by_node(parsed, nodedevices.held_keys(claims)), claims


def claim(device: str, name: str = "c", pod: str = "trainer") -> allocations.Claim:
    held = allocations.Allocated(request="gpu", key=DeviceKey("gpu.nvidia.com", NODE, device))
    return allocations.Claim(namespace="ml", name=name, allocated=True, results=(held,),
                             reserved_for=(allocations.Consumer(resource="pods", name=pod, uid="u"),))


def quarantine(gpu: str, node: str = NODE, **changes: object) -> Quarantine:
    base = Quarantine(node=node, gpu=gpu, rule="fatal-xid", signal="xid", reason="XID 79", slug="xid-79",
                      since=100.0, hold_until=200.0)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def plugin_node(name: str = "dp-1", *, capacity: int = 8, allocatable: int = 8, taints: list | None = None):
    return node_info({"metadata": {"name": name, "resourceVersion": "7"}, "spec": {"taints": taints or []},
                      "status": {"capacity": {"nvidia.com/gpu": str(capacity)},
                                 "allocatable": {"nvidia.com/gpu": str(allocatable)}}})


def test_one_rule_for_exactly_the_faulty_gpu_and_none_for_its_neighbours() -> None:
    found, devices, _ = dra()
    q = quarantine(found[3].uuid)
    made = quarantineplan.plan(POLICY, Ledger(quarantines=(q,)), nodes={}, dra=devices, claims=(), namespace="ns",
                               now=150)
    (rule,) = made.rules.values()
    assert rule["metadata"]["name"] == f"gpugate-{NODE}-gpu-3"
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-3"}
    assert rule["spec"]["taint"] == {"key": names.UNHEALTHY_TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}
    assert rule["metadata"]["annotations"]["gpugate.io/quarantine"] == "rule fatal-xid: XID 79"
    assert made.tainted_nodes == frozenset() and made.held_back == {NODE: 1}


def test_the_mig_devices_of_a_faulty_gpu_are_tainted_with_it_and_the_other_gpus_mig_devices_are_not() -> None:
    found, devices, _ = dra(2, mig=True)
    made = quarantineplan.plan(POLICY, Ledger(quarantines=(quarantine(found[1].uuid),)), nodes={}, dra=devices,
                               claims=(), namespace="ns", now=150)
    tainted = sorted(r["spec"]["deviceSelector"]["device"] for r in made.rules.values())
    expected = ["gpu-1"] + sorted(dra_slices.mig_name(found[1], p, s) for p in dra_slices.H100_PROFILES
                                  for s in p.starts)
    assert tainted == sorted(expected) and len(tainted) == 14
    assert not any(d.startswith("gpu-0") for d in tainted)


def test_the_shares_of_a_faulty_gpu_are_its_one_device() -> None:
    found, devices, _ = dra(2, shares="memory")
    made = quarantineplan.plan(POLICY, Ledger(quarantines=(quarantine(found[0].uuid),)), nodes={}, dra=devices,
                               claims=(), namespace="ns", now=150)
    assert [r["spec"]["deviceSelector"]["device"] for r in made.rules.values()] == ["gpu-0"]


def test_a_held_faulty_gpu_is_not_taken_off_gpu_free_twice() -> None:
    found, devices, claims = dra(held=("gpu-3",))
    made = quarantineplan.plan(POLICY, Ledger(quarantines=(quarantine(found[3].uuid),)), nodes={}, dra=devices,
                               claims=claims, namespace="ns", now=150)
    assert made.held_back == {}


def test_a_dry_run_writes_rules_with_effect_none_and_nothing_else() -> None:
    found, devices, claims = dra(held=("gpu-3",))
    q = quarantine(found[3].uuid, effect="None", dry_run=True, validation="running", validation_pod="v")
    made = quarantineplan.plan(dataclasses.replace(POLICY, dry_run=True), Ledger(quarantines=(q,)),
                               nodes={"dp-1": plugin_node()}, dra=devices, claims=claims, namespace="ns", now=150)
    assert [r["spec"]["taint"]["effect"] for r in made.rules.values()] == ["None"]
    assert (made.tainted_nodes, made.held_back, made.validations, made.evictions) == (frozenset(), {}, {}, ())


class TestDevicePlugin:
    def test_the_node_is_tainted_and_gpu_free_lowered_by_the_faulty_gpus(self) -> None:
        ledger = Ledger(quarantines=(quarantine("GPU-a", node="dp-1"), quarantine("GPU-b", node="dp-1")))
        made = quarantineplan.plan(POLICY, ledger, nodes={"dp-1": plugin_node()}, dra={}, claims=(), namespace="ns",
                                   now=150)
        assert made.rules == {} and made.tainted_nodes == {"dp-1"} and made.held_back == {"dp-1": 2}

    def test_gpus_the_plugin_already_left_out_of_allocatable_are_not_subtracted_again(self) -> None:
        made = quarantineplan.plan(POLICY, Ledger(quarantines=(quarantine("GPU-a", node="dp-1"),)),
                                   nodes={"dp-1": plugin_node(allocatable=7)}, dra={}, claims=(), namespace="ns",
                                   now=150)
        assert made.tainted_nodes == {"dp-1"} and made.held_back == {}

    def test_the_taint_joins_the_nodes_own_and_leaves_with_the_last_quarantine(self) -> None:
        theirs = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
        node = plugin_node(taints=[theirs])
        added = quarantineplan.node_taints(node, True, "NoSchedule")
        assert added == [theirs, {"key": names.UNHEALTHY_TAINT_KEY, "effect": "NoSchedule"}]
        tainted = plugin_node(taints=added)
        assert quarantineplan.node_taints(tainted, True, "NoSchedule") is None
        assert quarantineplan.node_taints(tainted, False, "NoSchedule") == [theirs]
        assert quarantineplan.node_taints(node, False, "NoSchedule") is None


class TestValidation:
    def test_under_dra_the_pod_claims_exactly_the_faulty_gpu_and_tolerates_its_taints(self) -> None:
        found, devices, _ = dra()
        q = quarantine(found[3].uuid, validation="running", validation_pod="gpugate-validate-x-1-0")
        made = quarantineplan.plan(POLICY, Ledger(quarantines=(q,)), nodes={}, dra=devices, claims=(),
                                   namespace="gpugate-system", now=150)
        wanted = made.validations["gpugate-validate-x-1-0"]
        assert wanted.claim is not None
        (request,) = wanted.claim["spec"]["devices"]["requests"]
        assert found[3].uuid in request["exactly"]["selectors"][0]["cel"]["expression"]
        assert {(t["key"], t["effect"]) for t in request["exactly"]["tolerations"]} == {
            (key, effect) for key in (names.UNHEALTHY_TAINT_KEY, names.DRA_XID_TAINT_KEY, names.DRA_GPU_LOST_TAINT_KEY)
            for effect in ("NoSchedule", "NoExecute")}
        assert not any("tolerationSeconds" in t for t in request["exactly"]["tolerations"])
        spec = wanted.pod["spec"]
        assert spec["restartPolicy"] == "Never"
        assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "gpugate-validate-x-1-0"}]
        assert spec["containers"][0]["image"] == POLICY.validation.image
        assert {"name": "GPUGATE_GPU_UUID", "value": found[3].uuid} in spec["containers"][0]["env"]

    def test_under_the_device_plugin_the_pod_is_pinned_to_the_node_and_tolerates_the_node_taint(self) -> None:
        q = quarantine("GPU-a", node="dp-1", validation="running", validation_pod="v")
        made = quarantineplan.plan(POLICY, Ledger(quarantines=(q,)), nodes={"dp-1": plugin_node()}, dra={},
                                   claims=(), namespace="ns", now=150)
        wanted = made.validations["v"]
        assert wanted.claim is None
        terms = wanted.pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["dp-1"]
        assert wanted.pod["spec"]["tolerations"] == [{"key": names.UNHEALTHY_TAINT_KEY, "operator": "Exists"}]


def test_the_eviction_api_is_used_for_the_faulty_gpus_pods_only_before_noexecute() -> None:
    found, devices, _ = dra()
    claims = [claim("gpu-3", "c3", "on-faulty"), claim("gpu-4", "c4", "on-healthy"),
              claim("gpu-3", "v", "v")]
    q = quarantine(found[3].uuid, effect="NoSchedule", final_effect="NoExecute", escalate_at=300.0,
                   validation_pod="v")
    policy = dataclasses.replace(POLICY, eviction=Eviction(api_first=True))
    made = quarantineplan.plan(policy, Ledger(quarantines=(q,)), nodes={}, dra=devices, claims=claims,
                               namespace="ml", now=150)
    assert made.evictions == (("ml", "on-faulty"),)
    later = quarantineplan.plan(policy, Ledger(quarantines=(dataclasses.replace(q, effect="NoExecute"),)), nodes={},
                                dra=devices, claims=claims, namespace="ml", now=301)
    assert later.evictions == ()


def test_busy_names_the_quarantined_gpus_a_workload_holds() -> None:
    found, devices, claims = dra(held=("gpu-3",))
    mapping = {(NODE, found[3].uuid): quarantineplan.gpu_devices(devices[NODE], found[3].uuid),
               (NODE, found[4].uuid): quarantineplan.gpu_devices(devices[NODE], found[4].uuid)}
    assert quarantineplan.busy(claims, mapping, []) == {(NODE, found[3].uuid)}
    assert quarantineplan.busy(claims, mapping, [("ml", "c")]) == frozenset()


def test_a_rule_name_too_long_for_the_api_is_a_digest() -> None:
    key = DeviceKey("gpu.nvidia.com", "n" * 250, "gpu-0")
    assert quarantineplan.rule_name(key).startswith("gpugate-") and len(quarantineplan.rule_name(key)) == 48
