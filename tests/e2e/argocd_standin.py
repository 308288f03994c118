"""A stand-in for the NVIDIA GPU Operator's controllers: it writes what they write, nothing more.

No GPU operator runs in the e2e cluster (no images, no kubelet). Argo CD and ``gpugate stack
status --kube`` only see what the operator writes to the API server, so this thread writes the
same things, step by step, from the same inputs (the ClusterPolicy and NVIDIADriver objects Argo
CD applied, the GPU nodes):

* **ClusterPolicy status** (gpu-operator v26.7.0 ``controllers/clusterpolicy_controller.go``
  Reconcile): ``state`` + ``namespace`` (``updateCRState`` / ``SetStatus``) and the Ready/Error
  condition pair (``internal/conditions/clusterpolicy.go``). ``notReady`` with reason
  ``OperandNotReady`` and the message of ``clusterPolicyNotReadyMessage`` while an operand is not
  ready (the toolkit, validator, device plugin, DCGM exporter, GFD and MIG manager pods all wait
  in an init container for a loaded driver: ``assets/state-container-toolkit/0500_daemonset.yaml``
  ``driver-validation``), or while an NVIDIADriver-owned node has a pending, running or failed
  upgrade (``nvidiaDriverUpgradeIncomplete``, v26.7.0 PR #2665); ``ready`` with ``Reconciled``,
  or with ``NoGPUNodes`` when no node has NFD's PCI label.
* **NVIDIADriver status** (``controllers/nvidiadriver_controller.go`` Reconcile): ``disabled``
  when the ClusterPolicy does not delegate the driver; ``notReady``/``ConflictingNodeSelector``
  when two non-default CRs select one node (``nodeSelectorValidator``); ``notReady``/
  ``DriverNotReady`` "Waiting for driver pod to be ready" until its driver DaemonSet is ready
  (``internal/state/state_skel.go`` ``isDaemonSetReady``: every desired pod available and
  updated); ``ready``/``Reconciled``. Conditions as ``internal/conditions/nvidiadriver.go``.
* **Node ownership** ``nvidia.com/gpu-operator.driver.owner`` (v26.7.0
  ``internal/nvidiadriver``): a non-default CR owns the GPU nodes its nodeSelector matches,
  the default CR the rest.
* **Driver upgrades**, the in-place state machine of k8s-operator-libs
  (``vendor/github.com/NVIDIA/k8s-operator-libs/pkg/upgrade``), per NVIDIADriver with its own
  ``upgradePolicy`` (``controllers/upgrade_controller.go`` ``reconcileNVIDIADriverUpgrades``):
  the label ``nvidia.com/gpu-driver-upgrade-state`` moves ``upgrade-required`` ->
  ``cordon-required`` (the node is cordoned) -> ``wait-for-jobs-required`` ->
  ``pod-deletion-required`` -> ``pod-restart-required`` (the driver pod is recreated at the
  DaemonSet's new revision) -> ``validation-required`` -> ``uncordon-required`` ->
  ``upgrade-done``; at most ``maxParallelUpgrades`` nodes at once and no more unavailable
  (cordoned) nodes than ``maxUnavailable`` (``upgrade_inplace.go`` ProcessUpgradeRequiredNodes).
  A driver pod that keeps crashing (more than 10 restarts) sends its node to
  ``upgrade-failed`` (``common_manager.go`` ProcessPodRestartNodes, ``isDriverPodFailing``);
  a failed node leaves that state only once its driver pod is in sync with the DaemonSet and
  ready (ProcessUpgradeFailedNodes), so a revert in Git alone does not heal it: the
  documented retry is to label the node ``upgrade-required`` again.
* **GFD's driver labels** ``nvidia.com/cuda.driver-version.*`` once a driver pod runs.

What is in memory only: the driver pods (one per owned node: its revision = the CR's driver
version, ready or crash-looping). The driver DaemonSets are OnDelete, so a pod keeps its old
revision until the upgrade controller restarts it; no pod object is created (nothing in the
cluster reads them but the operator itself). GPU pods are not evicted at
``pod-deletion-required``: the tests run none on these nodes.

Test controls: :meth:`fail_driver` (a driver version that crash-loops on a node),
:meth:`hold_before` (no node enters a state while held: lets a test look at a rollout mid-way),
:meth:`frozen` (no tick while a test reads ``gpugate stack status`` and the API together).
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

Obj = dict[str, Any]

GROUP = "nvidia.com"
STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
OWNER_LABEL = "nvidia.com/gpu-operator.driver.owner"
SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
INITIAL_STATE_ANNOTATION = "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
NFD_GPU_LABEL = "feature.node.kubernetes.io/pci-10de.present"
"""What NFD writes on a node with an NVIDIA PCI device; the operator finds GPU nodes by it."""
DRIVER_VERSION_LABEL = "nvidia.com/cuda.driver-version.full"
OPERATOR_DEPLOYMENT = "gpu-operator"

DONE, FAILED, REQUIRED = "upgrade-done", "upgrade-failed", "upgrade-required"
IN_PLACE_STEPS = ("upgrade-required", "cordon-required", "wait-for-jobs-required", "pod-deletion-required",
                  "pod-restart-required", "validation-required", "uncordon-required", "upgrade-done")
# Operand states whose pods wait in an init container until a driver is loaded on their node.
DRIVER_GATED_STATES = ("state-container-toolkit", "state-operator-validation", "state-device-plugin",
                       "state-dcgm-exporter", "gpu-feature-discovery", "state-mig-manager")
FAILING_RESTARTS = 10
"""k8s-operator-libs isDriverPodFailing: a container not ready with more restarts than this."""


@dataclass
class DriverPod:
    """The driver pod on one node, as far as the upgrade controller can tell."""

    owner: str
    version: str
    since: float
    ready: bool = False
    restarts: int = 0
    failing: bool = False


@dataclass
class Event:
    at: float
    """time.monotonic() of this process."""
    text: str
    wall: str = ""


@dataclass
class Settings:
    tick: float = 0.2
    """Seconds between reconcile passes."""
    step: float = 0.4
    """Least time a node stays in one upgrade state (the real controller requeues every few
    seconds to minutes; long enough that Argo CD and a poll see each state)."""
    pod_start: float = 0.6
    """Seconds from a driver pod's creation to Ready."""
    operator_namespace: str = "gpu-operator"


class GPUOperatorStandIn:
    """One thread that reconciles the ClusterPolicy, every NVIDIADriver and their nodes."""

    def __init__(self, api: client.ApiClient, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.pods: dict[str, DriverPod] = {}
        self.events: list[Event] = []
        self.errors: list[str] = []
        self.failures: dict[tuple[str, str], bool] = {}
        self.held: set[str] = set()
        self.operator_seen: float | None = None
        self.passes = 0
        """Reconcile passes completed (a test waits for some to be sure the stand-in looked)."""
        self._entered: dict[str, float] = {}
        self._conflicts: dict[str, str] = {}
        self._written: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-operator-standin", daemon=True)

    # -- lifecycle and controls ----------------------------------------------------------------

    def start(self) -> GPUOperatorStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)

    def fail_driver(self, node: str, version: str) -> None:
        """From now on a driver pod at ``version`` crash-loops on ``node`` (say, the module does not
        load on that kernel)."""
        with self._lock:
            self.failures[(node, version)] = True
            self._note(f"test: driver {version} will crash-loop on {node}")

    @contextlib.contextmanager
    def hold_before(self, state: str) -> Iterator[None]:
        """No node enters ``state`` inside the block (a rollout stops just before it)."""
        with self._lock:
            self.held.add(state)
        try:
            yield
        finally:
            with self._lock:
                self.held.discard(state)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """No reconcile pass runs inside the block: the objects stand still while a test reads them."""
        with self._lock:
            yield

    def explain(self) -> str:
        """The last events and errors, for a failure message."""
        with self._lock:
            events = "\n".join(f"  {e.wall} {e.text}" for e in self.events[-25:])
            errors = "\n".join(self.errors[-5:]) or "none"
        return f"GPU Operator stand-in, last events:\n{events}\nerrors: {errors}"

    def snapshot(self) -> dict[str, Any]:
        """Per node: owner, upgrade state, driver version and readiness (from the API and memory)."""
        with self._lock:
            nodes = self._gpu_nodes()
            return {name: {"owner": _labels(node).get(OWNER_LABEL), "state": _labels(node).get(STATE_LABEL),
                           "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
                           "driver": (self.pods[name].version if name in self.pods else None),
                           "ready": (self.pods[name].ready if name in self.pods else None)}
                    for name, node in sorted(nodes.items())}

    def events_since(self, moment: float) -> list[str]:
        with self._lock:
            return [e.text for e in self.events if e.at >= moment]

    # -- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.wait(self.settings.tick):
            try:
                with self._lock:
                    self._reconcile()
                    self.passes += 1
            except Exception as error:  # kept for explain(); the next pass tries again
                self.errors.append(f"{time.strftime('%H:%M:%S')} {error!r}"[:2000])

    def _note(self, text: str, at: float | None = None) -> None:
        self.events.append(Event(time.monotonic() if at is None else at, text, time.strftime("%H:%M:%S")))

    def wait_passes(self, count: int, timeout: float = 30.0) -> None:
        """Until ``count`` more reconcile passes have completed (each reads every object afresh)."""
        target = self.passes + count
        deadline = time.monotonic() + timeout
        while self.passes < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"the stand-in made {self.passes - target + count} of {count} passes "
                                     f"in {timeout:.0f}s:\n{self.explain()}")
            time.sleep(self.settings.tick / 2)

    def _reconcile(self) -> None:
        if not self._operator_running():
            return
        policies = self._list("v1", "clusterpolicies")
        drivers = self._list("v1alpha1", "nvidiadrivers")
        nodes = self._gpu_nodes()
        policy = policies[0] if policies else None
        delegated = policy is None or bool(((policy.get("spec") or {}).get("driver") or {}).get("useNvidiaDriverCRD"))
        if delegated:
            owners = self._reconcile_ownership(drivers, nodes)
            for driver in drivers:
                self._reconcile_driver(driver, owners, nodes)
            for driver in drivers:
                self._reconcile_upgrades(driver, owners, nodes)
        else:
            for driver in drivers:
                self._write_status("v1alpha1", "nvidiadrivers", driver, "disabled", "Error", "Reconciled",
                                   "useNvidiaDriverCRD is not enabled in ClusterPolicy")
        self._label_driver_versions(nodes)
        for index, item in enumerate(policies):
            self._reconcile_policy(item, nodes, drivers, duplicate=index > 0)

    def _operator_running(self) -> bool:
        """The controllers run in the operator's pod: nothing is written before it is available."""
        try:
            deployment = self.apps.read_namespaced_deployment(OPERATOR_DEPLOYMENT, self.settings.operator_namespace)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        available = bool((deployment.status.available_replicas or 0) >= 1)
        if available and self.operator_seen is None:
            self.operator_seen = time.monotonic()
            self._note("gpu-operator Deployment available: controllers start")
        return available

    # -- reading -------------------------------------------------------------------------------

    def _list(self, version: str, plural: str) -> list[Obj]:
        try:
            response = self.custom.list_cluster_custom_object(GROUP, version, plural, _preload_content=False)
        except ApiException as error:
            if error.status == 404:  # CRD not installed yet
                return []
            raise
        items = json.loads(response.data)["items"]
        return sorted((i for i in items if not i["metadata"].get("deletionTimestamp")),
                      key=lambda i: (i["metadata"]["creationTimestamp"], i["metadata"]["name"]))

    def _gpu_nodes(self) -> dict[str, Obj]:
        response = self.core.list_node(label_selector=f"{NFD_GPU_LABEL}=true", _preload_content=False)
        return {n["metadata"]["name"]: n for n in json.loads(response.data)["items"]}

    # -- NVIDIADriver: ownership, driver pods, status -----------------------------------------

    def _reconcile_ownership(self, drivers: list[Obj], nodes: Mapping[str, Obj]) -> dict[str, str]:
        """node -> owning CR; conflicting CRs are recorded in self._conflicts (labels left alone)."""
        self._conflicts = {}
        defaults = [d for d in drivers if (d.get("spec") or {}).get("default")]
        others = [d for d in drivers if not (d.get("spec") or {}).get("default")]
        owners: dict[str, str] = {}
        claims: dict[str, list[str]] = {}
        for driver in others:
            selector = (driver.get("spec") or {}).get("nodeSelector") or {}
            for name, node in nodes.items():
                if all(_labels(node).get(k) == v for k, v in selector.items()):
                    claims.setdefault(name, []).append(driver["metadata"]["name"])
        for name, claimants in claims.items():
            if len(claimants) > 1:
                for cr in claimants:
                    self._conflicts[cr] = (f"nodeSelector of NVIDIADriver {cr} selects node {name}, "
                                           f"also selected by {', '.join(c for c in claimants if c != cr)}")
        if len(defaults) > 1:
            for driver in defaults:
                self._conflicts[driver["metadata"]["name"]] = "more than one default NVIDIADriver found"
        default = defaults[0]["metadata"]["name"] if len(defaults) == 1 else None
        for name, node in nodes.items():
            current = _labels(node).get(OWNER_LABEL)
            claimants = claims.get(name, [])
            if len(claimants) > 1:
                owner = current  # ownership left unchanged on a conflict
            elif claimants:
                owner = claimants[0]
            else:
                owner = default
            if owner is None:
                continue
            owners[name] = owner
            if current != owner:
                self._patch_node(name, labels={OWNER_LABEL: owner})
                self._note(f"node {name}: {OWNER_LABEL}={owner}")
        return owners

    def _reconcile_driver(self, driver: Obj, owners: Mapping[str, str], nodes: Mapping[str, Obj]) -> None:
        name = driver["metadata"]["name"]
        version = str((driver.get("spec") or {}).get("version") or "")
        if name in self._conflicts:
            reason = "ReconcileFailed" if "default" in self._conflicts[name] else "ConflictingNodeSelector"
            self._write_status("v1alpha1", "nvidiadrivers", driver, "notReady", "Error", reason, self._conflicts[name])
            return
        now = time.monotonic()
        owned = [n for n, owner in owners.items() if owner == name]
        for node in owned:
            if node not in self.pods:
                # The DaemonSet controller creates the missing pod at the current revision. A pod
                # of another owner or revision is replaced only by the upgrade controller.
                self.pods[node] = DriverPod(owner=name, version=version, since=now)
                self._note(f"node {node}: driver pod {name} {version} created")
            self._progress_pod(node)
        ready = all(self.pods[n].owner == name and self.pods[n].version == version and self.pods[n].ready
                    for n in owned)
        if ready:
            self._write_status("v1alpha1", "nvidiadrivers", driver, "ready", "Ready", "Reconciled",
                               "All resources have been successfully reconciled")
        else:
            self._write_status("v1alpha1", "nvidiadrivers", driver, "notReady", "Error", "DriverNotReady",
                               "Waiting for driver pod to be ready")

    def _progress_pod(self, node: str) -> None:
        pod = self.pods[node]
        if pod.ready or time.monotonic() - pod.since < self.settings.pod_start:
            return
        if self.failures.get((node, pod.version)):
            if not pod.failing:
                pod.failing = True
                self._note(f"node {node}: driver {pod.version} crash-loops (CrashLoopBackOff)")
            pod.restarts = min(pod.restarts + 3, FAILING_RESTARTS + 1)
            return
        pod.ready = True
        self._note(f"node {node}: driver pod {pod.owner} {pod.version} Ready")

    # -- the upgrade state machine (k8s-operator-libs, in place) --------------------------------

    def _upgrading(self, node: Obj) -> bool:
        return _labels(node).get(STATE_LABEL, "") not in ("", DONE)

    def _reconcile_upgrades(self, driver: Obj, owners: Mapping[str, str], nodes: Mapping[str, Obj]) -> None:
        name = driver["metadata"]["name"]
        spec = driver.get("spec") or {}
        policy = spec.get("upgradePolicy") or {}
        managed = [n for n, owner in owners.items() if owner == name and n in self.pods]
        if not policy.get("autoUpgrade", True):  # NVIDIADriver CRD default: true
            for node in managed:
                if _labels(nodes[node]).get(STATE_LABEL):
                    self._patch_node(node, labels={STATE_LABEL: None})
            return
        version = str(spec.get("version") or "")
        states = {n: _labels(nodes[n]).get(STATE_LABEL, "") for n in managed}
        slots = _upgrades_available(states, {n: bool((nodes[n].get("spec") or {}).get("unschedulable"))
                                             for n in managed}, policy)
        now = time.monotonic()
        for node in sorted(managed):
            state = states[node]
            if now - self._entered.get(node, 0.0) < self.settings.step:
                continue
            pod = self.pods[node]
            in_sync = pod.owner == name and pod.version == version
            labels = _labels(nodes[node])
            unschedulable = bool((nodes[node].get("spec") or {}).get("unschedulable"))
            target: str | None = None
            if state in ("", DONE):  # ProcessDoneOrUnknownNodes: pod revision vs DaemonSet revision
                if not in_sync:
                    target = REQUIRED
                elif state == "":
                    target = DONE
            elif state == REQUIRED:  # ProcessUpgradeRequiredNodes
                if labels.get(SKIP_LABEL) == "true":
                    continue
                if slots > 0 or unschedulable:  # "progress with manually cordoned nodes"
                    target = "cordon-required"
                    slots -= 1
            elif state == "cordon-required":
                self._patch_node(node, unschedulable=True)
                target = "wait-for-jobs-required"
            elif state == "wait-for-jobs-required":  # no waitForCompletion.podSelector in our policies
                target = "pod-deletion-required"
            elif state == "pod-deletion-required":  # podDeletion set: GPU pods deleted (none here)
                target = "pod-restart-required"
            elif state == "pod-restart-required":  # ProcessPodRestartNodes
                if not in_sync:
                    self.pods[node] = DriverPod(owner=name, version=version, since=now)
                    self._note(f"node {node}: driver pod restarted at {name} {version}")
                elif pod.ready:
                    target = "validation-required"
                elif pod.failing and pod.restarts > FAILING_RESTARTS:
                    target = FAILED
            elif state == "validation-required":  # the validator pod turns ready with the driver
                if pod.ready:
                    target = DONE if labels.get(INITIAL_STATE_ANNOTATION) else "uncordon-required"
            elif state == "uncordon-required":
                self._patch_node(node, unschedulable=False)
                target = DONE
            elif state == FAILED:  # ProcessUpgradeFailedNodes
                if in_sync and pod.ready:
                    target = "uncordon-required"
            if target is not None and target != state and target not in self.held:
                self._patch_node(node, labels={STATE_LABEL: target})
                self._entered[node] = now
                self._note(f"node {node}: {state or '(none)'} -> {target}")

    # -- GFD and ClusterPolicy -----------------------------------------------------------------

    def _label_driver_versions(self, nodes: Mapping[str, Obj]) -> None:
        for name, pod in self.pods.items():
            if name in nodes and pod.ready and _labels(nodes[name]).get(DRIVER_VERSION_LABEL) != pod.version:
                major, minor, *rest = pod.version.split(".") + ["", ""]
                self._patch_node(name, labels={DRIVER_VERSION_LABEL: pod.version,
                                               "nvidia.com/cuda.driver-version.major": major,
                                               "nvidia.com/cuda.driver-version.minor": minor,
                                               "nvidia.com/cuda.driver-version.revision": rest[0]})

    def _reconcile_policy(self, policy: Obj, nodes: Mapping[str, Obj], drivers: list[Obj], *,
                          duplicate: bool) -> None:
        if duplicate:  # only the oldest ClusterPolicy is reconciled
            self._write_status("v1", "clusterpolicies", policy, "ignored", "Error", "ReconcileFailed",
                               "Only one ClusterPolicy is reconciled; this one is ignored")
            return
        if not nodes:
            self._write_status("v1", "clusterpolicies", policy, "ready", "Ready", "NoGPUNodes",
                               "No GPU node found, watching for new nodes to join the cluster.")
            return
        without_driver = [n for n in nodes if not (n in self.pods and self.pods[n].ready)]
        states = list(DRIVER_GATED_STATES) if without_driver else []
        reasons = []
        upgrading = [n for n, node in nodes.items()
                     if _labels(node).get(OWNER_LABEL) and _labels(node).get(SKIP_LABEL) != "true"
                     and _labels(node).get(STATE_LABEL, "") not in ("", DONE)]
        if upgrading:
            reasons = ["NVIDIADriver upgrade has not completed",
                       "one or more NVIDIADriver-owned Nodes are marked pending, in-progress, or failed"]
        if states or reasons:
            parts = ["ClusterPolicy is not ready"]
            if states:
                parts.append(f"states not ready: [{' '.join(states)}]")
            message = "; ".join(parts + reasons)
            self._write_status("v1", "clusterpolicies", policy, "notReady", "Error", "OperandNotReady", message)
            return
        self._write_status("v1", "clusterpolicies", policy, "ready", "Ready", "Reconciled",
                           "ClusterPolicy is ready as all resources have been successfully reconciled")

    # -- writing -------------------------------------------------------------------------------

    def _write_status(self, version: str, plural: str, obj: Obj, state: str, kind: str, reason: str,
                      message: str) -> None:
        """status.state (+ namespace) and the Ready/Error pair, written only when they change
        (``meta.SetStatusCondition`` keeps lastTransitionTime of an unchanged condition)."""
        name = obj["metadata"]["name"]
        key = f"{plural}/{name}"
        wanted = (obj["metadata"]["uid"], state, kind, reason, message)
        status = obj.get("status") or {}
        if self._written.get(key) == wanted and status.get("state") == state:
            return
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        before = time.monotonic()  # the event's time: before anyone can read the new status
        if kind == "Ready":
            conditions = [{"type": "Ready", "status": "True", "reason": reason, "message": message},
                          {"type": "Error", "status": "False", "reason": "Ready", "message": ""}]
        else:
            conditions = [{"type": "Ready", "status": "False", "reason": "Error", "message": ""},
                          {"type": "Error", "status": "True", "reason": reason, "message": message}]
        previous = {c.get("type"): c for c in status.get("conditions") or []}
        for condition in conditions:
            old = previous.get(condition["type"]) or {}
            condition["lastTransitionTime"] = (old.get("lastTransitionTime") if old.get("status") == condition["status"]
                                               and old.get("lastTransitionTime") else stamp)
        body = {"status": {"state": state, "namespace": self.settings.operator_namespace, "conditions": conditions}}
        self.custom.patch_cluster_custom_object_status(GROUP, version, plural, name, body)
        self._written[key] = wanted
        if status.get("state") != state or (previous.get("Error") or {}).get("reason") != reason:
            kind_name = "ClusterPolicy" if plural == "clusterpolicies" else "NVIDIADriver"
            self._note(f"{kind_name} {name}: {state} ({reason})", at=before)

    def _patch_node(self, name: str, *, labels: Mapping[str, str | None] | None = None,
                    unschedulable: bool | None = None) -> None:
        body: Obj = {}
        if labels:
            body["metadata"] = {"labels": dict(labels)}
        if unschedulable is not None:
            body["spec"] = {"unschedulable": unschedulable or None}
        self.core.patch_node(name, body)


def _labels(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _scaled(value: int | str, total: int) -> int:
    """intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=true)."""
    if isinstance(value, int):
        return value
    text = str(value)
    if text.endswith("%"):
        return math.ceil(int(text[:-1]) * total / 100)
    return int(text)


def _upgrades_available(states: Mapping[str, str], cordoned: Mapping[str, bool], policy: Mapping[str, Any]) -> int:
    """k8s-operator-libs ``GetUpgradesAvailable`` for one NVIDIADriver's nodes (``common_manager.go``):
    maxParallelUpgrades minus upgrades in progress, capped by maxUnavailable (scaled over the
    managed nodes, rounded up), zero once cordoned nodes plus nodes about to be cordoned reach it."""
    total = sum(1 for s in states.values())
    in_progress = sum(1 for s in states.values() if s not in ("", DONE, REQUIRED))
    max_unavailable = _scaled(policy.get("maxUnavailable", "25%"), total)
    parallel = int(policy.get("maxParallelUpgrades", 1))
    available = sum(1 for s in states.values() if s == REQUIRED) if parallel == 0 else parallel - in_progress
    unavailable = sum(1 for c in cordoned.values() if c) + sum(1 for s in states.values() if s == "cordon-required")
    available = min(available, max_unavailable)
    if unavailable >= max_unavailable:
        return 0
    if max_unavailable < total and unavailable + available > max_unavailable:
        return max_unavailable - unavailable
    return available
