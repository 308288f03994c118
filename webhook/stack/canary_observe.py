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
from webhook.stack.clusterstate import ClusterState, labels_of, name_of, pool_of_node
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


def _failed_events(core: client.CoreV1Api, nodes: set[str], since: float) -> dict[str, float]:
    found: dict[str, float] = {}
    for event in _items(core.list_event_for_all_namespaces,
                        field_selector=f"involvedObject.kind=Node,reason={UPGRADE_EVENT_REASON}"):
        node = (event.get("involvedObject") or {}).get("name")
        when = epoch(event.get("lastTimestamp")) or epoch(event.get("eventTime")) or 0.0
        if node in nodes and "upgrade-failed" in str(event.get("message")) and when >= since - 1:
            first = epoch(event.get("firstTimestamp")) or when
            found[node] = min(found.get(node, first), max(first, since))
    return found


def _diagnoses(batch: client.BatchV1Api, core: client.CoreV1Api, namespace: str,
               rollout: Rollout) -> dict[str, Diagnosis]:
    found = {}
    for job in _items(batch.list_namespaced_job, namespace, label_selector=f"{ROLLOUT_LABEL}={rollout.commit[:12]}"):
        node = labels_of(job).get(NODE_LABEL, "")
        status = job.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
        started = epoch(status.get("startTime")) or epoch(job["metadata"].get("creationTimestamp")) or 0.0
        if "Failed" in conditions:
            detail = _exit_of(core, namespace, name_of(job)) or str(conditions["Failed"].get("message") or "failed")
            found[node] = Diagnosis(name_of(job), "failed", started, detail,
                                    epoch(conditions["Failed"].get("lastTransitionTime")))
        elif "Complete" in conditions:
            found[node] = Diagnosis(name_of(job), "succeeded", started,
                                    finished=epoch(conditions["Complete"].get("lastTransitionTime")))
        else:
            found[node] = Diagnosis(name_of(job), "running", started)
    return found


def _exit_of(core: client.CoreV1Api, namespace: str, job: str) -> str:
    for pod in _items(core.list_namespaced_pod, namespace, label_selector=f"job-name={job}"):
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


def look(eyes: Eyes, stack: Stack, analysis: Analysis, rollout: Rollout, values: Mapping[str, Any] | None, *,
         now: float) -> Look:
    """One look at ``rollout``'s pool."""
    core, apps, batch = client.CoreV1Api(eyes.api), client.AppsV1Api(eyes.api), client.BatchV1Api(eyes.api)
    nodes = [n for n in _items(core.list_node) if labels_of(n).get("nvidia.com/gpu.present") == "true"]
    pools = {name_of(n): pool_of_node(labels_of(n), stack) for n in nodes}
    canary = {n for n, p in pools.items() if p == rollout.pool}
    baseline_pool = analysis.baseline or stack.default_pool.name
    drivers = _items(core.list_namespaced_pod, eyes.operator_namespace, label_selector=DRIVER_SELECTOR)
    on_canary = [p for node in sorted(canary) for p in _items(core.list_pod_for_all_namespaces,
                                                              field_selector=f"spec.nodeName={node}")]
    state = ClusterState.from_objects(
        [*({**n, "kind": "Node"} for n in nodes), *({**p, "kind": "Pod"} for p in on_canary),
         *({**d, "kind": "DaemonSet"} for d in _items(apps.list_namespaced_daemon_set, eyes.operator_namespace))],
        source="the cluster")
    seen = []
    for node in sorted((n for n in nodes if name_of(n) in canary), key=name_of):
        labels = labels_of(node)
        mine = [p for p in drivers if (p.get("spec") or {}).get("nodeName") == name_of(node)]
        seen.append(CanaryNode(name=name_of(node), state=labels.get(DRIVER_UPGRADE_STATE_LABEL, ""),
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
        xid = _xid(url, analysis.xid.window_seconds, canary, {n for n, p in pools.items() if p == baseline_pool})
    diagnoses = (_diagnoses(batch, core, analysis.diagnostics.namespace, rollout)
                 if analysis.diagnostics is not None else {})
    return Look(at=now, nodes=tuple(seen), failed_events=_failed_events(core, canary, rollout.started),
                diagnoses=diagnoses, xid=xid, measurements=measurements)
