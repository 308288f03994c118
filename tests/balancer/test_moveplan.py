"""The rebalancer's reading of the cluster and its decision: who may move, who waits, the budgets."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from webhook.balancer import moveplan
from webhook.balancer.settings import BalancerSettings, SettingsError
from webhook.placement import moves
from webhook.policy import parsing

NOW = 1_800_000_000.0
POLICY = """apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {name: batch}
spec:
  priority: 10
  match: {namespaces: [batch]}
  disruption: {movable: true, minRuntimeSeconds: 300}
---
apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {name: audit-only}
spec:
  priority: 5
  mode: audit
  match: {namespaces: [audited]}
  disruption: {movable: true}
"""
POLICIES = parsing.parse([("batch.yaml", POLICY)])
SETTINGS = moveplan.RebalanceSettings(enabled=True, policies="policies", budget_percent=100.0)


def iso(at: float) -> str:
    from datetime import UTC, datetime
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, gpus: int = 8, *, labels: dict[str, str] | None = None, taints: list[dict] | None = None) -> Any:
    return moveplan.seen_node({"metadata": {"name": name, "resourceVersion": "1",
                                            "labels": {"nvidia.com/gpu.product": "H100", **(labels or {})}},
                               "spec": {"taints": taints or []},
                               "status": {"allocatable": {"cpu": "64", "memory": "512Gi",
                                                          "nvidia.com/gpu": str(gpus)}}})


def pod(name: str, *, namespace: str = "batch", node_name: str = "", gpus: int = 1, owner: str = "ReplicaSet",
        started: float = NOW - 3600, waiting: float | None = None, message: str = "0/4 nodes are available: "
        "4 Insufficient nvidia.com/gpu.", labels: dict[str, str] | None = None, tolerations: list[dict] | None = None,
        terminating: bool = False) -> Any:
    status: dict[str, Any] = {"phase": "Running" if node_name else "Pending"}
    if node_name:
        status["startTime"] = iso(started)
    if waiting is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": message, "lastTransitionTime": iso(waiting)}]
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels or {},
                            "creationTimestamp": iso(started - 10)}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "owner", "controller": True, "apiVersion": "apps/v1",
                                    "uid": "o"}]
    if terminating:
        meta["deletionTimestamp"] = iso(NOW)
    resources = {"cpu": "1", "memory": "4Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": resources, "limits": resources}}],
                            "tolerations": tolerations or []}
    if node_name:
        spec["nodeName"] = node_name
    return moveplan.seen_pod({"metadata": meta, "spec": spec, "status": status})


def fragmented(**changes: Any) -> dict[str, Any]:
    """Four 8-GPU nodes, each with two 1-GPU pods (six free GPUs each), and an 8-GPU pod waiting."""
    pods = {}
    for i in range(4):
        for j in range(2):
            found = pod(f"be-{i}-{j}", node_name=f"n{i}", **changes)
            pods[found.key] = found
    waiting = pod("big", namespace="ml", gpus=8, owner="Job", waiting=NOW - 600)
    pods[waiting.key] = waiting
    return pods


def snapshot(pods: dict[str, Any], budgets: dict[str, Any] | None = None, nodes: int = 4) -> moveplan.Snapshot:
    return moveplan.Snapshot(pods=pods, nodes={f"n{i}": node(f"n{i}") for i in range(nodes)}, budgets=budgets or {})


def decide(found: moveplan.Snapshot, **changes: Any) -> moveplan.Decision:
    settings = dataclasses.replace(SETTINGS, **{k: v for k, v in changes.items() if k not in ("evictions", "refused")})
    return moveplan.decide(found, POLICIES, now=NOW, settings=settings, evictions=changes.get("evictions", ()),
                           refused=changes.get("refused"))


class TestReading:
    def test_a_pod_waits_when_the_scheduler_found_no_gpus_for_it(self) -> None:
        assert pod("a", waiting=NOW - 5).waiting_since == NOW - 5
        assert pod("b", waiting=NOW - 5, message="0/4 nodes are available: 4 Insufficient cpu.").waiting_since is None

    def test_what_the_decision_reads_of_a_pod(self) -> None:
        found = pod("a", node_name="n0", owner="StatefulSet", labels={"gpugate.io/group": "g"}, terminating=True)
        assert (found.key, found.uid, found.node, found.controller, found.terminating) == \
            ("batch/a", "uid-a", "n0", "StatefulSet", True)
        assert found.demand is not None and found.demand.gpus == 1 and found.started == NOW - 3600

    def test_a_budget_without_a_selector_selects_no_pod(self) -> None:
        found = moveplan.seen_budget({"metadata": {"name": "b", "namespace": "batch"}, "spec": {},
                                      "status": {"disruptionsAllowed": 3}})
        from webhook.policy import matching
        assert not matching.selector_matches(found.selector, {"app": "x"}) and found.allowed == 3


class TestDecide:
    def test_the_fewest_movable_pods_make_room_and_the_replacements_fit_elsewhere(self) -> None:
        decision = decide(snapshot(fragmented()))
        [move] = decision.plan.moves
        assert move.pending == "ml/big" and len(move.evict) == 2
        assert {key.split("-")[1] for key in move.evict} == {move.node[1:]}
        assert all(home != move.node for _, home in move.replacements)
        assert decision.waiting_gpus == 8

    @pytest.mark.parametrize(("changes", "why"), [
        ({"namespace": "elsewhere"}, "no policy marks them"),
        ({"namespace": "audited"}, "their policy only audits"),
        ({"owner": ""}, "no controller recreates them"),
        ({"owner": "DaemonSet"}, "their controller would put them back on the same node"),
        ({"started": NOW - 60}, "they ran less than minRuntimeSeconds"),
        ({"tolerations": [{"operator": "Exists"}]}, "their replacement would tolerate the mark"),
    ])
    def test_pods_that_may_not_move_never_do(self, changes: dict[str, Any], why: str) -> None:
        assert not decide(snapshot(fragmented(**changes))).plan.moves, why

    def test_a_refused_pod_is_not_planned_again_until_its_backoff_ends(self) -> None:
        found = snapshot(fragmented())
        refused = {key: NOW + 60 for key in found.pods if key.startswith("batch/")}
        assert not decide(found, refused=refused).plan.moves
        assert decide(found, refused={key: NOW - 1 for key in refused}).plan.moves

    def test_a_disruption_budget_that_allows_none_blocks_the_move(self) -> None:
        pdb = moveplan.seen_budget({"metadata": {"name": "be", "namespace": "batch"},
                                    "spec": {"selector": {"matchLabels": {}}}, "status": {"disruptionsAllowed": 0}})
        assert not decide(snapshot(fragmented(), {pdb.key: pdb})).plan.moves
        open_pdb = dataclasses.replace(pdb, allowed=2)
        assert decide(snapshot(fragmented(), {pdb.key: open_pdb})).plan.moves

    def test_a_pod_two_disruption_budgets_select_never_moves(self) -> None:
        pdbs = {f"batch/b{i}": moveplan.seen_budget({"metadata": {"name": f"b{i}", "namespace": "batch"},
                                                     "spec": {"selector": {}}, "status": {"disruptionsAllowed": 9}})
                for i in (1, 2)}
        assert not decide(snapshot(fragmented(), pdbs)).plan.moves

    def test_the_hourly_budget_is_a_share_of_the_running_gpu_pods_less_the_last_hours_evictions(self) -> None:
        found = snapshot(fragmented())
        assert not decide(found, budget_percent=2.0).plan.moves  # 2% of 8 pods is none
        assert decide(found, budget_percent=25.0).budget == 2
        assert not decide(found, budget_percent=25.0, evictions=[(NOW - 100, "batch")]).plan.moves
        assert decide(found, budget_percent=25.0, evictions=[(NOW - 4000, "batch")]).plan.moves

    def test_a_namespace_limit_from_the_policy_caps_its_moves(self) -> None:
        limited = parsing.parse([("batch.yaml", POLICY.replace("minRuntimeSeconds: 300}",
                                                                "minRuntimeSeconds: 300, maxMovesPerHour: 1}"))])
        found = moveplan.decide(snapshot(fragmented()), limited, now=NOW, settings=SETTINGS)
        assert not found.plan.moves

    def test_a_group_moves_whole_or_not_at_all(self) -> None:
        pods = fragmented()
        for key in ("batch/be-0-0", "batch/be-1-0"):  # a two-pod job across n0 and n1
            pods[key] = dataclasses.replace(pods[key], labels=(("gpugate.io/group", "job-a"),))
        [move] = decide(snapshot(pods)).plan.moves
        evicted = set(move.evict)
        assert not evicted & {"batch/be-0-0", "batch/be-1-0"} or {"batch/be-0-0", "batch/be-1-0"} <= evicted

    def test_no_second_move_for_a_pod_whose_first_is_under_way(self) -> None:
        found = snapshot(fragmented())
        assert not moveplan.decide(found, POLICIES, now=NOW, settings=SETTINGS,
                                   moving=frozenset({"uid-big"})).plan.moves

    def test_a_pod_waiting_for_anything_but_gpus_gets_no_move(self) -> None:
        pods = fragmented()
        pods["ml/big"] = pod("big", namespace="ml", gpus=8, owner="Job", waiting=NOW - 600,
                             message="0/4 nodes are available: 4 node(s) had untolerated taint.")
        assert not decide(snapshot(pods)).plan.moves and not decide(snapshot(pods)).waiting

    def test_the_waiting_pod_only_gets_nodes_its_affinity_and_tolerations_allow(self) -> None:
        # The movable pods tolerate the maintenance taint (their replacements may go anywhere); the
        # waiting pod does not, so only n3 can be freed for it.
        found = snapshot(fragmented(tolerations=[{"key": "maintenance", "operator": "Exists"}]))
        nodes = dict(found.nodes)
        for name in ("n0", "n1", "n2"):
            nodes[name] = node(name, taints=[{"key": "maintenance", "effect": "NoSchedule"}])
        [move] = decide(moveplan.Snapshot(pods=found.pods, nodes=nodes, budgets={})).plan.moves
        assert move.node == "n3"


class TestMarks:
    def test_a_mark_comes_off_once_its_pod_is_bound_and_the_hold_passed_or_at_its_ttl(self) -> None:
        waiting, bound = pod("w", waiting=NOW - 100), pod("b", node_name="n0")
        found = moveplan.Snapshot(pods={waiting.key: waiting, bound.key: bound}, nodes={})
        marks = [moveplan.Mark("n0", "uid-w", NOW - 30), moveplan.Mark("n1", "uid-w", NOW - 700),
                 moveplan.Mark("n2", "uid-b", NOW - 30), moveplan.Mark("n3", "uid-b", NOW - 61),
                 moveplan.Mark("n4", "uid-gone", NOW - 61)]
        lifted = moveplan.to_lift(marks, found, now=NOW, settings=SETTINGS)
        assert [m.node for m in lifted] == ["n1", "n3", "n4"]

    def test_marks_are_read_from_the_nodes_taints(self) -> None:
        marked = node("n0", taints=[{"key": "gpugate.io/rebalance", "value": "uid-w", "effect": "NoSchedule"}])
        assert moveplan.marks_on(moveplan.Snapshot(pods={}, nodes={"n0": marked, "n1": node("n1")})) == \
            [("n0", "uid-w")]


class TestSettings:
    def test_the_rebalancer_is_off_by_default(self) -> None:
        assert not BalancerSettings().rebalance.enabled

    @pytest.mark.parametrize(("section", "says"), [
        ({"enabled": True}, "rebalance.policies"),
        ({"budget_percent": 101}, "budget_percent"),
        ({"hold": 100, "mark_ttl": 50}, "mark_ttl must be at least hold"),
        ({"interval": 0}, "interval"),
    ])
    def test_a_bad_rebalance_section_is_refused_by_name(self, section: dict[str, Any], says: str) -> None:
        with pytest.raises(SettingsError, match=says):
            BalancerSettings.from_dict({"rebalance": section})


def test_a_plan_only_ever_holds_movable_pods() -> None:
    """Whatever the decision, every evicted pod was a candidate marked movable."""
    found = snapshot(fragmented())
    decision = decide(found)
    movable = {c.key for c in moveplan._candidates(
        [p for p in found.pods.values() if p.node], found, POLICIES, now=NOW, settings=SETTINGS, refused={})[0]
        if c.movable}
    assert all(key in movable for m in decision.plan.moves for key in m.evict)
    assert isinstance(decision.plan, moves.Plan)
