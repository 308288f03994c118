"""Preflight rules on the state NVIDIA's controllers left on the nodes a change reloads. Pure.

A driver change restarts the kernel module on every node of the pools it touches
(``change.reloaded_pools``). Starting one on nodes that are not where a new rollout can begin
is how the field's worst upgrade stories start (shared/reference/gpu-operator-failures.md):

* ``upgrade-in-flight``: a node still mid-upgrade or ``upgrade-failed`` from the last rollout
  (NVIDIA/gpu-operator#2509: nodes in ``upgrade-required`` for weeks; #2549: ``upgrade-failed``
  relabelled turns ``upgrade-done`` with nothing repaired);
* ``nodes-ready``: a NotReady GPU node, or a driver pod no node took (gpu-operator#688: the upgrade controller
  cannot build its state and stops for the whole cluster);
* ``mig-state``: the MIG manager wedged or failed on a node (#2833 with mig-parted#485: GPU clients
  ``paused-for-mig-change`` and ``mig.config.state=pending`` forever, 0 GPUs advertised; gpu-operator#1606 and
  gpu-operator#668: a mode change the platform cannot reset);
* ``operands-ready``: the operator's validator or operands not Ready on a node (#1711: operands in
  ``Init`` for a day after a platform upgrade; #1982, gpu-operator#459: a validation step failing).

Each is a failure naming the nodes, what was seen and what to do first. A rollback is never held
by them: going back is how a rollout in this state ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.names import DRIVER_UPGRADE_STATE_LABEL, NVIDIA_MIG_CONFIG_LABEL
from webhook.stack.change import Change, needs_cluster, reloaded_pools
from webhook.stack.clusterstate import (
    ClusterSnapshot,
    KubeObject,
    labels_of,
    meta,
    name_of,
    node_ready,
    spec_of,
    status_of,
)
from webhook.stack.compat import Check, verdict

MIG_STATE_LABEL = "nvidia.com/mig.config.state"
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
PAUSED_FOR_MIG = "paused-for-mig-change"
SETTLED = ("", "upgrade-done")
FAILED = "upgrade-failed"
DRIVER_COMPONENT = ("app.kubernetes.io/component", "nvidia-driver")
INIT_PATIENCE_SECONDS = 600
"""An operand still initialising this long after it started is stuck, not starting (its init steps wait
on the driver and toolkit, seconds to a few minutes on a healthy node)."""
def _reloaded_nodes(change: Change, state: ClusterSnapshot) -> dict[str, str]:
    return state.pool_nodes(change.final, reloaded_pools(change))


def _nodes(state: ClusterSnapshot, names: Mapping[str, str]) -> list[KubeObject]:
    return sorted((n for n in state.gpu_nodes() if name_of(n) in names), key=name_of)


def _pools_text(names: Mapping[str, str]) -> str:
    return ", ".join(sorted(set(names.values())))


def _crash_looping(pod: KubeObject) -> str:
    """``init container X: reason (N restarts)`` for a waiting or restarting container, else ''."""
    status = status_of(pod)
    for key, kind in (("initContainerStatuses", "init container"), ("containerStatuses", "container")):
        for container in status.get(key) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") or int(container.get("restartCount") or 0) > 3:
                message = waiting.get("message") or (container.get("lastState") or {}).get("terminated", {}).get(
                    "message") or ""
                detail = f": {message}" if message else ""
                return (f"{kind} {container.get('name')} {waiting.get('reason') or 'restarting'} "
                        f"({container.get('restartCount', 0)} restarts){detail}")
    return ""


@needs_cluster
def check_upgrade_in_flight(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "upgrade-in-flight"
    names = _reloaded_nodes(change, state)
    if not names:
        return [Check(name=name, ok=True, reason="no node of a pool this change reloads is in the cluster state")]
    driver_pods = {spec_of(p).get("nodeName"): p for p in state.pods
                   if labels_of(p).get(DRIVER_COMPONENT[0]) == DRIVER_COMPONENT[1]}
    failed: list[str] = []
    moving: list[str] = []
    for node in _nodes(state, names):
        upgrade = labels_of(node).get(DRIVER_UPGRADE_STATE_LABEL, "")
        if upgrade in SETTLED:
            continue
        pod = driver_pods.get(name_of(node))
        seen = f"{name_of(node)} is {upgrade}"
        if pod is not None and (looping := _crash_looping(pod)):
            seen += f", driver pod {name_of(pod)} {looping}"
        (failed if upgrade == FAILED else moving).append(seen)
    if not failed and not moving:
        return [Check(name=name, ok=True,
                      reason=f"every node of pool(s) {_pools_text(names)} ({len(names)}) is settled (upgrade-done "
                             f"or never upgraded)")]
    if failed:
        reason = ("a node of a pool this change reloads failed its last driver upgrade: " + "; ".join(failed + moving)
                  + ". Relabelling it upgrade-required can end upgrade-done with nothing repaired "
                    "(NVIDIA/gpu-operator#2549), and a new driver stacks on the unknown cause")
        fix = ("read the failed node's driver pod log, fix the cause, retry it (kubectl label node N "
               "nvidia.com/gpu-driver-upgrade-state=upgrade-required --overwrite) and wait for upgrade-done, or "
               "`gpugate stack rollback`; then plan this change again")
    else:
        reason = ("the last driver rollout has not finished on pool(s) " + _pools_text(names) + ": " + "; ".join(moving)
                  + ". Nodes stuck mid-upgrade stay so for weeks when something holds the driver "
                    "(NVIDIA/gpu-operator#2509); a new driver would restart them again")
        fix = ("wait for every node to reach upgrade-done (`gpugate stack status --kube`), or find what holds it "
               "(a driver pod in Init with 'driver is in use': a GPU consumer, see check gpu-consumers)")
    return [Check(name=name, ok=False, reason=reason, fix=fix, source="NVIDIA/gpu-operator#2509, #2549")]


@needs_cluster
def check_nodes_ready(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "nodes-ready"
    names = _reloaded_nodes(change, state)
    problems = [f"node {name_of(n)} is NotReady" for n in _nodes(state, names) if not node_ready(n)]
    problems += [f"driver pod {meta(p).get('namespace')}/{name_of(p)} is bound to no node"
                 for p in state.pods if labels_of(p).get(DRIVER_COMPONENT[0]) == DRIVER_COMPONENT[1]
                 and not spec_of(p).get("nodeName")]
    return verdict(name, problems, source="NVIDIA/gpu-operator#688",
                   passed=f"{len(names)} node(s) of the reloaded pools Ready, every driver pod bound",
                   failed="{found}: NVIDIA's upgrade controller builds its state from every driver pod's node and "
                          "stops for the whole cluster on one it cannot read",
                   fix="bring the node back or take it out of the cluster, and delete driver pods that no node "
                       "took, before the rollout")


def _mig_problem(labels: Mapping[str, Any]) -> str:
    state = labels.get(MIG_STATE_LABEL, "")
    paused = sorted(k.removeprefix(DEPLOY_PREFIX) for k, v in labels.items()
                    if k.startswith(DEPLOY_PREFIX) and v == PAUSED_FOR_MIG)
    if state in ("pending", "rebooting") and paused:
        return (f"{MIG_STATE_LABEL}={state} with {', '.join(paused)} {PAUSED_FOR_MIG}: the MIG manager is wedged "
                f"and the node advertises no GPU (mig-parted#485)")
    if state == "failed":
        return f"{MIG_STATE_LABEL}=failed for {NVIDIA_MIG_CONFIG_LABEL}={labels.get(NVIDIA_MIG_CONFIG_LABEL, '?')}"
    if state in ("pending", "rebooting"):
        return f"{MIG_STATE_LABEL}={state}: a MIG change is still being applied"
    if paused:
        return f"{', '.join(paused)} left {PAUSED_FOR_MIG} with {MIG_STATE_LABEL}={state or '(none)'}"
    return ""


@needs_cluster
def check_mig_state(change: Change, state: ClusterSnapshot) -> list[Check]:
    """A MIG layout pending or failed on a reloaded node (the labels the MIG manager writes)."""
    names = _reloaded_nodes(change, state)
    found = [f"{name_of(n)}: {p}" for n in _nodes(state, names) if (p := _mig_problem(labels_of(n)))]
    return verdict("mig-state", found,
                   source="NVIDIA/gpu-operator#2833, NVIDIA/mig-parted#485, gpu-operator#1606, gpu-operator#668",
                   passed=f"no MIG change pending or failed on the {len(names)} reloaded node(s)",
                   failed="{found}. A driver restart on top finds the GPU clients paused: the node's GPUs stay "
                          "unavailable",
                   fix=(f"settle MIG first: for a wedged manager set {NVIDIA_MIG_CONFIG_LABEL} to another value and "
                        f"back (or restore the nvidia.com/gpu.deploy.* labels to true); for a failed mode change on "
                        f"a platform without GPU reset set migManager.env WITH_REBOOT=true"))


def _stuck_initialising(state: ClusterSnapshot, pod: KubeObject) -> str:
    for container in status_of(pod).get("initContainerStatuses") or []:
        running = (container.get("state") or {}).get("running")
        age = state.age_seconds((running or {}).get("startedAt"))
        if running is not None and age is not None and age > INIT_PATIENCE_SECONDS:
            return f"init container {container.get('name')} still running after {age / 60:.0f} min"
    return ""


@needs_cluster
def check_operands_ready(change: Change, state: ClusterSnapshot) -> list[Check]:
    """Operator pods (validator, toolkit, plugin...) stuck in Init or crash-looping on a reloaded node."""
    name = "operands-ready"
    names = _reloaded_nodes(change, state)
    stuck = []
    for pod in state.pods_on(names):
        if not state.operator_owned(pod) or labels_of(pod).get(DRIVER_COMPONENT[0]) == DRIVER_COMPONENT[1]:
            continue
        looping = _crash_looping(pod) or _stuck_initialising(state, pod)
        if looping:
            stuck.append(f"{name_of(pod)} on {spec_of(pod).get('nodeName')}: {looping}")
    return verdict(name, sorted(stuck), source="NVIDIA/gpu-operator#1711, #1982, gpu-operator#459",
                   passed="the operator's pods on the reloaded nodes are not stuck",
                   failed="the GPU stack on these nodes is not validated: {found}. A new driver restarts it "
                          "before anyone knows why it failed",
                   fix="read the failing step's log (kubectl -n <operator namespace> logs <pod> -c <container>) "
                       "and fix it first; the named container is the step that fails")
