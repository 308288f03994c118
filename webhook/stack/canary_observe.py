"""One look at a canary pool through the API and Prometheus, as ``canarymodes.Look`` (the controller's eyes).

Read as raw JSON with the real ``kubernetes`` client: the GPU nodes (upgrade state, GFD's driver
version, MIG state), the driver pods of the operator's namespace, every pod and the operator's
DaemonSets on the canary nodes (what pins the driver, judged by ``consumers``), the Events NVIDIA's
upgrade library writes on nodes (reason ``GPUDriverUpgrade``: an ``upgrade-failed`` the label no
longer shows), the DCGM diagnostic Jobs of this rollout, and from Prometheus the new XID series per
node of the canary and baseline pools. Nothing here decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client

from webhook import kubeclient
from webhook.names import DRIVER_UPGRADE_STATE_LABEL
from webhook.stack import canary_watch
from webhook.stack.canary import Analysis, Sample
from webhook.stack.canarymodes import CanaryNode, Diagnosis, DriverPod, Look, Rollout, XidCounts
from webhook.stack.clusterstate import ClusterSnapshot, labels_of, name_of, pool_of_node
from webhook.stack.consumers import pinning_consumers
from webhook.stack.model import Stack

Obj = dict[str, Any]
UPGRADE_EVENT_REASON = "GPUDriverUpgrade"
"""k8s-operator-libs pkg/upgrade util.go GetEventReason with driver name "gpu"."""
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
DRIVER_SELECTOR = "app.kubernetes.io/component=nvidia-driver"
ROLLOUT_LABEL = "gpugate.io/canary-rollout"
NODE_LABEL = "gpugate.io/canary-node"


def epoch(timestamp: Any) -> float | None:
    if not isinstance(timestamp, str):
        return None
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _items(call: Any, *args: Any, **kwargs: Any) -> list[Obj]:
    return list(kubeclient.raw_json(call(*args, _preload_content=False, **kwargs)).get("items") or [])


@dataclass(frozen=True)
class Eyes:
    """Where a look reads from: the API client, the operator's namespace, Prometheus."""

    api: client.ApiClient
    operator_namespace: str = "gpu-operator"
    prometheus: str | None = None


def _driver_pod(pods: list[Obj], driver: str) -> DriverPod | None:
    """The node's driver pod at ``driver`` (image tag), not Terminating; None while only the old one runs."""
    for pod in pods:
        images = [str(c.get("image") or "") for c in (pod.get("spec") or {}).get("containers") or []]
        if (pod["metadata"].get("deletionTimestamp") or not any(f":{driver}" in i for i in images)):
            continue
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        restarts, waiting = 0, ""
        for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            restarts += int(container.get("restartCount") or 0)
            wait = (container.get("state") or {}).get("waiting") or {}
            if wait.get("reason") and wait.get("reason") not in ("PodInitializing", "ContainerCreating"):
                waiting = f"{container.get('name')} {wait['reason']}" + (f": {wait['message']}" if wait.get(
                    "message") else "")
        created = epoch(pod["metadata"].get("creationTimestamp")) or 0.0
        return DriverPod(name=name_of(pod), ready=ready, created=created, restarts=restarts, waiting=waiting)
    return None


def _failed_events(events: list[Obj], nodes: set[str], since: float) -> dict[str, float]:
    found: dict[str, float] = {}
    for event in events:
        node = (event.get("involvedObject") or {}).get("name")
        when = epoch(event.get("lastTimestamp")) or epoch(event.get("eventTime")) or 0.0
        if node in nodes and "upgrade-failed" in str(event.get("message")) and when >= since - 1:
            first = epoch(event.get("firstTimestamp")) or when
            found[node] = min(found.get(node, first), max(first, since))
    return found


def _diagnoses(jobs: list[Obj], pods: list[Obj], rollout: Rollout, nodes: set[str]) -> dict[str, Diagnosis]:
    """The diagnostic Jobs of this rollout on ``nodes`` (one rollout commit can move several pools)."""
    found = {}
    for job in jobs:
        node = labels_of(job).get(NODE_LABEL, "")
        if labels_of(job).get(ROLLOUT_LABEL) != rollout.commit[:12] or node not in nodes:
            continue
        status = job.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
        started = epoch(status.get("startTime")) or epoch(job["metadata"].get("creationTimestamp")) or 0.0
        if "Failed" in conditions:
            detail = _exit_of(pods, name_of(job)) or str(conditions["Failed"].get("message") or "failed")
            found[node] = Diagnosis(name_of(job), "failed", started,
                                    finished=epoch(conditions["Failed"].get("lastTransitionTime")), detail=detail)
        elif "Complete" in conditions:
            found[node] = Diagnosis(name_of(job), "succeeded", started,
                                    finished=epoch(conditions["Complete"].get("lastTransitionTime")))
        else:
            found[node] = Diagnosis(name_of(job), "running", started)
    return found


def _exit_of(pods: list[Obj], job: str) -> str:
    for pod in pods:
        if labels_of(pod).get("job-name") != job:
            continue
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            ended = (container.get("state") or {}).get("terminated") or {}
            if ended:
                return f"pod {name_of(pod)} exit code {ended.get('exitCode')}" + (
                    f": {ended['message'].strip()}" if ended.get("message") else "")
    return ""


def _xid(prometheus: str, rule_window: float, canary: set[str], baseline: set[str]) -> XidCounts:
    query = (f'count by (Hostname) (DCGM_FI_DEV_XID_ERRORS{{err_code!="0"}} unless DCGM_FI_DEV_XID_ERRORS '
             f'offset {int(rule_window)}s)')
    per_host: dict[str, float] = {}
    for sample in canary_watch.query(prometheus, query):
        host = sample.series.split('Hostname="', 1)[-1].split('"', 1)[0] if 'Hostname="' in sample.series else ""
        per_host[host] = per_host.get(host, 0.0) + sample.value
    return XidCounts(canary=int(sum(per_host.get(h, 0) for h in canary)), canary_nodes=len(canary),
                     baseline=int(sum(per_host.get(h, 0) for h in baseline)), baseline_nodes=len(baseline))


@dataclass(frozen=True)
class Seen:
    """What one round read, once, for every canary pool's look."""

    nodes: list[Obj]
    drivers: list[Obj]
    daemonsets: list[Obj]
    events: list[Obj]
    jobs: list[Obj]
    job_pods: list[Obj]
    on_nodes: Mapping[str, list[Obj]]
    """GPU node -> the pods bound to it (read for the canary nodes only)."""


def gather(eyes: Eyes, stack: Stack, analysis: Analysis) -> Seen:
    """The cluster as every canary pool's look reads it, listed once per round."""
    core, apps, batch = client.CoreV1Api(eyes.api), client.AppsV1Api(eyes.api), client.BatchV1Api(eyes.api)
    nodes = [n for n in _items(core.list_node) if labels_of(n).get("nvidia.com/gpu.present") == "true"]
    canary = sorted(name_of(n) for n in nodes if pool_of_node(labels_of(n), stack) in analysis.pools)
    diag = analysis.diagnostics
    return Seen(
        nodes=nodes, drivers=_items(core.list_namespaced_pod, eyes.operator_namespace, label_selector=DRIVER_SELECTOR),
        daemonsets=_items(apps.list_namespaced_daemon_set, eyes.operator_namespace),
        events=_items(core.list_event_for_all_namespaces,
                      field_selector=f"involvedObject.kind=Node,reason={UPGRADE_EVENT_REASON}"),
        jobs=_items(batch.list_namespaced_job, diag.namespace, label_selector=ROLLOUT_LABEL) if diag else [],
        job_pods=_items(core.list_namespaced_pod, diag.namespace, label_selector="job-name") if diag else [],
        on_nodes={node: _items(core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
                  for node in canary})


def look(eyes: Eyes, seen: Seen, stack: Stack, analysis: Analysis, rollout: Rollout,
         values: Mapping[str, Any] | None, *, now: float) -> Look:
    """One look at ``rollout``'s pool, from what the round read (and Prometheus, asked now)."""
    pools = {name_of(n): pool_of_node(labels_of(n), stack) for n in seen.nodes}
    canary = {n for n, p in pools.items() if p == rollout.pool}
    state = ClusterSnapshot.from_objects(
        [*({**n, "kind": "Node"} for n in seen.nodes),
         *({**p, "kind": "Pod"} for node in sorted(canary) for p in seen.on_nodes.get(node, [])),
         *({**d, "kind": "DaemonSet"} for d in seen.daemonsets)], source="the cluster")
    nodes = []
    for node in sorted((n for n in seen.nodes if name_of(n) in canary), key=name_of):
        labels = labels_of(node)
        mine = [p for p in seen.drivers if (p.get("spec") or {}).get("nodeName") == name_of(node)]
        nodes.append(CanaryNode(name=name_of(node), state=labels.get(DRIVER_UPGRADE_STATE_LABEL, ""),
                                driver=labels.get(canary_watch.DRIVER_VERSION_LABEL),
                                mig_state=labels.get(MIG_STATE_LABEL, ""),
                                driver_pod=_driver_pod(mine, rollout.to_driver),
                                consumers=tuple(pinning_consumers(state, [name_of(node)], values))))
    measurements: dict[str, tuple[float | Sample, ...]] = {}
    url = eyes.prometheus or analysis.prometheus_url
    if url:
        measurements = {c.name: canary_watch.query(url, c.query) for c in analysis.conditions}
    xid = None
    if analysis.xid is not None and url:
        baseline = analysis.baseline or stack.default_pool.name
        xid = _xid(url, analysis.xid.window_seconds, canary, {n for n, p in pools.items() if p == baseline})
    return Look(at=now, nodes=tuple(nodes), failed_events=_failed_events(seen.events, canary, rollout.started),
                diagnoses=_diagnoses(seen.jobs, seen.job_pods, rollout, canary), xid=xid, measurements=measurements)
