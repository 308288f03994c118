"""The rebalancer on the real control plane: real kube-scheduler, Eviction API, PodDisruptionBudgets.

Two ``gpugate balance`` replicas run as the balancer's ServiceAccount, with exactly the RBAC of
manifests/balancer and of its rebalance component; they share the real Lease, so one is the leader
and one a standby. Each test gets a pool of fake 8-GPU nodes of its own (``rebalance_env``).

1. Fragmented: eight movable 1-GPU pods of a Deployment spread over four nodes, an 8-GPU pod waits.
   The leader evicts the fewest pods that free a node (those of the node holding fewest), the 8-GPU
   pod binds there, the Deployment's replacements bind on the other nodes (the mark keeps them off
   the node they left, and comes off afterwards), each evicted pod has an Event naming the waiting
   pod, and the standby evicted nothing.
2. A PodDisruptionBudget with ``maxUnavailable: 0`` over those pods: nothing is evicted, nothing marked.
3. An eviction the API server refuses (a ValidatingAdmissionPolicy denies every eviction in the
   namespace, dry run included) is not retried in a loop: the refused pod is left alone, and as it
   keeps its node from being freed, one refusal per node and then no more tries.
4. A two-pod distributed job (``gpugate.io/group``) across two nodes moves together: both pods are
   evicted, both replacements bind on the third node.
5. Pods no policy marks movable are never evicted by the leader, and a ``--dry-run`` replica whose
   policies mark them logs the move it would make and evicts nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.e2e import rebalance_env as env
from tests.e2e.accounts import applied
from tests.e2e.balancer_access import NAMESPACE, forget_earlier_runs, rbac_applied
from tests.e2e.waiting import wait_until
from webhook.localcluster.cluster import Cluster, Nodes

ROOT = Path(__file__).resolve().parents[2]
COMPONENT_RBAC = ROOT / "manifests" / "balancer" / "components" / "rebalance" / "rbac.yaml"
SETTLE = 6.0
"""Seconds a test watches for a move that must not come: the waiting threshold and four rounds."""


@pytest.fixture(scope="module")
def policies(workdir: Path) -> Path:
    return workdir / "policies"


@pytest.fixture(scope="module")
def replicas(local: Cluster, workdir: Path, policies: Path) -> Iterator[list[env.Replica]]:
    """The leader and the standby, with the balancer's RBAC and the rebalance component's, as shipped."""
    policies.mkdir(exist_ok=True)
    rebalance_rbac = list(yaml.safe_load_all(COMPONENT_RBAC.read_text()))
    with rbac_applied(local), applied(local, rebalance_rbac, NAMESPACE):
        forget_earlier_runs(local, env.LEASE, "gpugate-inventory")
        started = [env.start(local, workdir, f"e2e-rebalance-{name}", policies) for name in ("a", "b")]
        try:
            yield started
        finally:
            for replica in started:
                replica.stop()
            forget_earlier_runs(local, env.LEASE, "gpugate-inventory")


def leader_of(local: Cluster, replicas: list[env.Replica]) -> tuple[env.Replica, env.Replica]:
    def holder() -> str | None:
        try:
            return client.CoordinationV1Api(local.api_client()).read_namespaced_lease(
                env.LEASE, NAMESPACE).spec.holder_identity
        except client.ApiException:
            return None
    # Two Python processes starting on a busy machine: their imports alone can take tens of seconds.
    name = wait_until(holder, timeout=120, what="a replica holding the Lease", explain=lambda: logs(*replicas))
    leader = next(r for r in replicas if r.identity == name)
    return leader, next(r for r in replicas if r is not leader)


def fragmented(local: Cluster, nodes: Nodes, namespace: str, *, replicas: int = 8, count: int = 4,
               labels: dict[str, str] | None = None) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """``count`` 8-GPU nodes holding ``replicas`` 1-GPU pods spread over all of them; then an 8-GPU pod waits."""
    names = env.pool(nodes, namespace, count)
    env.deployment(local, namespace, "be", replicas, 1, labels={"movable": "yes"} if labels is None else labels)
    placed = env.running(local, namespace, "be", replicas)
    assert len(env.per_node(placed)) == count, f"the pods did not spread over every node: {env.per_node(placed)}"
    return names, placed


def logs(*replicas: env.Replica) -> str:
    return "\n".join(r.tail() for r in replicas)


def test_the_fewest_pods_move_the_waiting_pod_binds_and_the_replacements_land_elsewhere(
        local: Cluster, nodes: Nodes, namespace: str, replicas: list[env.Replica], policies: Path) -> None:
    env.write_policy(policies, namespace)
    names, before = fragmented(local, nodes, namespace)
    counts = env.per_node(before)
    leader, standby = leader_of(local, replicas)
    env.waiting_pod(local, namespace, "big", 8)
    node = wait_until(lambda: env.node_of(local, namespace, "big"), timeout=90, what="the 8-GPU pod bound",
                      explain=lambda: logs(leader, standby))
    on_node = {uid for uid, (_, where) in before.items() if where == node}
    after = wait_until(lambda: (found := env.running(local, namespace, "be", 8)) and not on_node & set(found)
                       and found, timeout=60, what="the evicted pods replaced", explain=lambda: logs(leader))
    evicted = set(before) - set(after)
    assert len(evicted) == min(counts.values()) == counts[node], (counts, node, evicted)
    assert {before[uid][1] for uid in evicted} == {node}
    assert all(where != node for uid, (_, where) in after.items() if uid not in before)
    found = env.events(local, namespace)
    assert sorted(e.involved_object.uid for e in found) == sorted(evicted)
    assert all(f"{namespace}/big" in e.message and e.source.component == "gpugate-balancer" for e in found)
    wait_until(lambda: not env.marked(local, names), timeout=30, what="the marks lifted")
    assert leader.evicted() == len(evicted) and standby.evicted() == 0


def test_a_disruption_budget_that_allows_none_blocks_the_move(
        local: Cluster, nodes: Nodes, namespace: str, replicas: list[env.Replica], policies: Path) -> None:
    env.write_policy(policies, namespace)
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "be", "namespace": namespace},
           "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "be"}}}}
    client.PolicyV1Api(local.api_client()).create_namespaced_pod_disruption_budget(namespace, pdb)
    names, before = fragmented(local, nodes, namespace)
    env.waiting_pod(local, namespace, "big", 8)
    env.unschedulable(local, namespace, "big")
    time.sleep(SETTLE)
    assert env.node_of(local, namespace, "big") is None
    assert set(env.running(local, namespace, "be", 8)) == set(before)
    assert not env.marked(local, names) and not env.events(local, namespace)


def test_a_refused_eviction_is_not_tried_again_in_a_loop(
        local: Cluster, nodes: Nodes, namespace: str, replicas: list[env.Replica], policies: Path) -> None:
    env.write_policy(policies, namespace)
    evictions = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/eviction"]}
    refuse = [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
               "metadata": {"name": f"no-evictions-{namespace}"},
               "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [evictions]},
                        "validations": [{"expression": "false", "message": "no evictions in this namespace"}]}},
              {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": f"no-evictions-{namespace}"},
               "spec": {"policyName": f"no-evictions-{namespace}", "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {
                            "kubernetes.io/metadata.name": namespace}}}}}]
    with applied(local, refuse, NAMESPACE):
        names, before = fragmented(local, nodes, namespace, replicas=4, count=2)
        _refused_by_the_policy(local, namespace, next(iter(before.values()))[0])
        leader, _ = leader_of(local, replicas)
        refused = leader.metric("gpugate_balancer_rebalance_refusals_total", reason="error")
        env.waiting_pod(local, namespace, "big", 8)
        env.unschedulable(local, namespace, "big")
        # A refused pod is left alone for refusal_backoff, and it keeps its node from being freed: one
        # refusal per node, then no node can be freed and the rounds stop trying.
        count = lambda: leader.metric("gpugate_balancer_rebalance_refusals_total", reason="error") - refused  # noqa: E731
        wait_until(lambda: count() >= 2, timeout=60, what="a refused move on each node", explain=lambda: logs(leader))
        time.sleep(SETTLE)
        assert count() == 2, logs(leader)
        assert set(env.running(local, namespace, "be", 4)) == set(before) and not env.marked(local, names)
        assert env.node_of(local, namespace, "big") is None


def _refused_by_the_policy(local: Cluster, namespace: str, pod: str) -> None:
    """Wait until the API server enforces the admission policy (it compiles it in the background)."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}

    def refused() -> bool:
        try:
            local.core().create_namespaced_pod_eviction(pod, namespace, body, dry_run="All")
        except client.ApiException as error:
            return error.status != 429
        return False
    wait_until(refused, timeout=30, what="evictions refused by the admission policy")


def test_a_two_pod_job_moves_whole(local: Cluster, nodes: Nodes, namespace: str, replicas: list[env.Replica],
                                   policies: Path) -> None:
    env.write_policy(policies, namespace)
    first, second, third = env.pool(nodes, namespace, 3, gpus=4)
    # The third node filled first, so the job's two pods go to the first two; then it keeps two free GPUs.
    env.deployment(local, namespace, "fill", 4, 1, pin=third)
    env.running(local, namespace, "fill", 4)
    env.deployment(local, namespace, "job", 2, 1, labels={"movable": "yes", "gpugate.io/group": "job-a"})
    job = env.running(local, namespace, "job", 2)
    assert sorted(node for _, node in job.values()) == sorted((first, second)), job
    client.AppsV1Api(local.api_client()).patch_namespaced_deployment_scale(
        "fill", namespace, {"spec": {"replicas": 2}})
    env.running(local, namespace, "fill", 2)
    env.waiting_pod(local, namespace, "big", 4)
    leader, standby = leader_of(local, replicas)
    node = wait_until(lambda: env.node_of(local, namespace, "big"), timeout=90, what="the 4-GPU pod bound",
                      explain=lambda: logs(leader, standby))
    assert node in (first, second)
    # The two evictions are two API calls: wait for both replacements, not for the first.
    moved = wait_until(lambda: (found := env.running(local, namespace, "job", 2)) and not set(found) & set(job)
                       and found, timeout=60, what="both pods of the job replaced", explain=lambda: logs(leader))
    assert [where for _, where in moved.values()] == [third, third]
    assert len(env.events(local, namespace)) == 2


def test_unmarked_pods_stay_and_a_dry_run_only_logs_its_plan(
        local: Cluster, nodes: Nodes, namespace: str, replicas: list[env.Replica], workdir: Path) -> None:
    # The replicas' policies do not name this namespace; the dry-run replica's do.
    own = workdir / f"dry-{namespace}"
    env.write_policy(own, namespace)
    dry = env.start(local, workdir, f"e2e-rebalance-dry-{namespace}", own, dry_run=True)
    try:
        names, before = fragmented(local, nodes, namespace)
        env.waiting_pod(local, namespace, "big", 8)
        env.unschedulable(local, namespace, "big")
        wait_until(lambda: "would evict" in dry.text(), timeout=60, what="the dry run's plan in its log",
                   explain=lambda: logs(dry))
        time.sleep(SETTLE)
        assert set(env.running(local, namespace, "be", 8)) == set(before)
        assert env.node_of(local, namespace, "big") is None and not env.marked(local, names)
        assert dry.evicted() == 0 and dry.metric("gpugate_balancer_rebalance_evictions_total", result="dry_run") > 0
        planned = next(line for line in dry.text().splitlines() if "would evict" in line)
        assert f"{namespace}/big" in planned and not env.events(local, namespace)
    finally:
        dry.stop()
