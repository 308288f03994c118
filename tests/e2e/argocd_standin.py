"""A stand-in for the GPU Operator's controllers: what they write that NVIDIA's upgrade library does not.

No GPU Operator runs in the e2e cluster (its module is not served by the Go module proxy). Driver
upgrades are run by NVIDIA's own state machine, k8s-operator-libs ``pkg/upgrade``, in
``gpu-upgrade-controller`` (``toolchain/upgrade-controller``, started by ``argocd_upgrades``):
node upgrade-state labels and annotations, cordon and uncordon, pod deletion and drain with real
evictions, driver-pod deletion and ``upgrade-failed`` all come from the library. This thread
writes the rest, from the same inputs as the operator (the ClusterPolicy and NVIDIADriver objects
Argo CD applied, the GPU nodes, the DaemonSets and pods), citing NVIDIA/gpu-operator v26.7.0:

* **Node ownership** ``nvidia.com/gpu-operator.driver.owner`` (``internal/nvidiadriver/
  nvidiadriver.go`` AssignOwners): over the nodes labelled ``nvidia.com/gpu.present=true``, a
  non-default CR owns the nodes its nodeSelector matches, the one default CR the rest, and a node
  nobody claims loses a stale owner label. Any conflict (two non-default CRs matching one node, two
  default CRs) fails the whole assignment before a single label changes.
* **Node deploy labels** ``nvidia.com/gpu.deploy.driver`` / ``.operator-validator`` on GPU nodes
  (``controllers/state_manager.go`` labels GPU nodes for each operand).
* **Driver DaemonSets**, one per NVIDIADriver and OS pool (``internal/state/driver.go`` and
  ``nodepool.go``; ``manifests/state-driver/0500_daemonset.yaml``): name
  ``nvidia-gpu-driver-<os>-<hash of the CR uid>``, labels ``app`` and
  ``app.kubernetes.io/component=nvidia-driver``, owner reference to the CR, ``updateStrategy:
  OnDelete``, a nodeSelector of the CR's selector plus ``gpu.present``, the owner label and the NFD
  OS labels, and ``DRIVER_CONFIG_DIGEST`` on the driver-manager init container and the driver
  container (``controllers/object_controls.go``: a hash of what installs the driver, so a change
  elsewhere, a label say, takes the library's restart-only path). The real DaemonSet controller
  makes the pods; "in sync" is the library comparing their controller-revision-hash with the
  DaemonSet's revision, not a version string.
* **The operator validator DaemonSet** (``app=nvidia-operator-validator``, what the library's
  validation step waits for: ``cmd/gpu-operator/main.go`` WithValidationEnabled).
* **NVIDIADriver status** (``controllers/nvidiadriver_controller.go``): ``disabled`` when the
  ClusterPolicy does not delegate the driver; ``notReady``/``ConflictingNodeSelector`` (or
  ``ReconcileFailed`` for two defaults) on an ownership conflict; ``notReady``/``DriverNotReady``
  until each of its DaemonSets is ready (``internal/state/state_skel.go`` isDaemonSetReady:
  desired = available = updated, read from the DaemonSet's status); ``ready``/``Reconciled``.
* **ClusterPolicy status** (``controllers/clusterpolicy_controller.go``): only the active (oldest)
  ClusterPolicy gets a status: a duplicate's ``ignored`` is set in memory and never saved
  (``instance.SetStatus(gpuv1.Ignored, ...)`` then return, no status update). ``notReady`` with
  ``OperandNotReady`` while a GPU node has no Ready driver pod (the operands wait for a loaded
  driver) or an NVIDIADriver-owned node has a pending, running or failed upgrade (PR #2665);
  ``ready``/``NoGPUNodes`` without GPU nodes; else ``ready``/``Reconciled``.
* **GFD's driver labels** ``nvidia.com/cuda.driver-version.*`` from the Ready driver pod on a node.

Test controls: :meth:`frozen` (no stand-in pass and the upgrade controller stopped with SIGSTOP
while a test reads ``gpugate stack status`` and the API together), :meth:`wait_passes`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
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
"""What NFD writes on a node with an NVIDIA PCI device; the ClusterPolicy finds GPU nodes by it."""
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
"""internal/consts GPUPresentLabel: the nodes NVIDIADriver ownership and node pools are taken from."""
NFD_OS_ID = "feature.node.kubernetes.io/system-os_release.ID"
NFD_OS_VERSION = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"
DEPLOY_VALIDATOR = "nvidia.com/gpu.deploy.operator-validator"
DRIVER_VERSION_LABEL = "nvidia.com/cuda.driver-version.full"
COMPONENT_LABEL = "app.kubernetes.io/component"
DRIVER_COMPONENT = "nvidia-driver"
DRIVER_CONTAINER = "nvidia-driver-ctr"
MANAGER_CONTAINER = "k8s-driver-manager"
MANAGER_IMAGE = "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.9.1"
VALIDATOR = "nvidia-operator-validator"
DIGEST_ENV = "DRIVER_CONFIG_DIGEST"
OPERATOR_DEPLOYMENT = "gpu-operator"

DONE, FAILED, REQUIRED = "upgrade-done", "upgrade-failed", "upgrade-required"
# Operand states whose pods wait in an init container until a driver is loaded on their node.
DRIVER_GATED_STATES = ("state-container-toolkit", "state-operator-validation", "state-device-plugin",
                       "state-dcgm-exporter", "gpu-feature-discovery", "state-mig-manager")


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
    operator_namespace: str = "gpu-operator"


class OwnershipConflict(Exception):
    """AssignOwners failed closed: no owner label was changed."""

    def __init__(self, by_driver: Mapping[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in sorted(by_driver.items())))
        self.by_driver = dict(by_driver)


class GPUOperatorStandIn:
    """One thread that reconciles the ClusterPolicy, every NVIDIADriver and their DaemonSets."""

    def __init__(self, api: client.ApiClient, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.events: list[Event] = []
        self.errors: list[str] = []
        self.operator_seen: float | None = None
        self.passes = 0
        """Reconcile passes completed (a test waits for some to be sure the stand-in looked)."""
        self.pause_others: list[Callable[[bool], None]] = []
        """Called with True when :meth:`frozen` starts and False when it ends (the upgrade controller)."""
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

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Nothing the operator would write moves inside the block: no stand-in pass runs and the
        upgrade controller is stopped, so a test reads the objects standing still."""
        with self._lock:
            for pause in self.pause_others:
                pause(True)
            try:
                yield
            finally:
                for pause in self.pause_others:
                    pause(False)

    def explain(self) -> str:
        """The last events and errors, for a failure message."""
        with self._lock:
            events = "\n".join(f"  {e.wall} {e.text}" for e in self.events[-25:])
            errors = "\n".join(self.errors[-5:]) or "none"
        return f"GPU Operator stand-in, last events:\n{events}\nerrors: {errors}"

    def snapshot(self) -> dict[str, Any]:
        """Per GPU node: owner, upgrade state, cordon, and the driver pod's version and readiness."""
        with self._lock:
            nodes = self._gpu_nodes()
            pods = self._driver_pods()
            out: dict[str, Any] = {}
            for name, node in sorted(nodes.items()):
                pod = pods.get(name)
                out[name] = {"owner": _labels(node).get(OWNER_LABEL), "state": _labels(node).get(STATE_LABEL),
                             "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
                             "driver": driver_version(pod) if pod else None,
                             "ready": pod_ready(pod) if pod else None,
                             "restarts": restarts(pod) if pod else None}
            return out

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
        policy = policies[0] if policies else None  # getSingletonClusterPolicy: the oldest
        self._label_deploy(nodes)
        if policy is not None:
            self._apply_daemonset(validator_daemonset(self.settings.operator_namespace))
        delegated = policy is None or bool(((policy.get("spec") or {}).get("driver") or {}).get("useNvidiaDriverCRD"))
        if delegated:
            conflicts: dict[str, str] = {}
            try:
                self._assign_owners(drivers, nodes)
            except OwnershipConflict as conflict:
                conflicts = conflict.by_driver
                self._note(f"node ownership not assigned: {conflict}")
            nodes = self._gpu_nodes()
            for driver in drivers:
                self._reconcile_driver(driver, nodes, conflicts)
        else:
            for driver in drivers:
                self._write_status("v1alpha1", "nvidiadrivers", driver, "disabled", "Error", "Reconciled",
                                   "useNvidiaDriverCRD is not enabled in ClusterPolicy")
        pods = self._driver_pods()
        self._label_driver_versions(nodes, pods)
        if policy is not None:
            self._reconcile_policy(policy, nodes, pods)

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
        response = self.core.list_node(label_selector=f"{GPU_PRESENT_LABEL}=true", _preload_content=False)
        return {n["metadata"]["name"]: n for n in json.loads(response.data)["items"]}

    def _driver_pods(self) -> dict[str, Obj]:
        """node -> the (newest, not Terminating) driver pod on it."""
        response = self.core.list_namespaced_pod(self.settings.operator_namespace,
                                                 label_selector=f"{COMPONENT_LABEL}={DRIVER_COMPONENT}",
                                                 _preload_content=False)
        found: dict[str, Obj] = {}
        for pod in sorted(json.loads(response.data)["items"], key=lambda p: p["metadata"]["creationTimestamp"]):
            node = (pod.get("spec") or {}).get("nodeName")
            if node and not pod["metadata"].get("deletionTimestamp"):
                found[node] = pod
        return found

    # -- nodes -----------------------------------------------------------------------------------

    def _label_deploy(self, nodes: Mapping[str, Obj]) -> None:
        for name, node in nodes.items():
            labels = _labels(node)
            missing = {k: "true" for k in (DEPLOY_DRIVER, DEPLOY_VALIDATOR) if k not in labels}
            if missing:
                self._patch_node(name, labels=missing)

    def _assign_owners(self, drivers: list[Obj], nodes: Mapping[str, Obj]) -> None:
        desired = desired_owners(drivers, {n: _labels(node) for n, node in nodes.items()})
        for name, node in nodes.items():
            current = _labels(node).get(OWNER_LABEL)
            if current != desired.get(name):
                self._patch_node(name, labels={OWNER_LABEL: desired.get(name)})
                self._note(f"node {name}: {OWNER_LABEL}={desired.get(name)}")

    # -- NVIDIADriver: DaemonSets and status ---------------------------------------------------

    def _reconcile_driver(self, driver: Obj, nodes: Mapping[str, Obj], conflicts: Mapping[str, str]) -> None:
        name = driver["metadata"]["name"]
        if name in conflicts:
            reason = "ReconcileFailed" if "default" in conflicts[name] else "ConflictingNodeSelector"
            self._write_status("v1alpha1", "nvidiadrivers", driver, "notReady", "Error", reason, conflicts[name])
            return
        owned = {n: node for n, node in nodes.items() if _labels(node).get(OWNER_LABEL) == name}
        pools = {pool for node in owned.values() if (pool := os_pool(_labels(node))) is not None}
        wanted = [driver_daemonset(driver, pool, self.settings.operator_namespace) for pool in sorted(pools)]
        names = {d["metadata"]["name"] for d in wanted}
        current = self.apps.list_namespaced_daemon_set(self.settings.operator_namespace,
                                                       label_selector=f"{COMPONENT_LABEL}={DRIVER_COMPONENT}",
                                                       _preload_content=False)
        for found in json.loads(current.data)["items"]:
            owners = [o.get("uid") for o in found["metadata"].get("ownerReferences") or []]
            if driver["metadata"]["uid"] in owners and found["metadata"]["name"] not in names:
                self.apps.delete_namespaced_daemon_set(found["metadata"]["name"], self.settings.operator_namespace)
                self._note(f"NVIDIADriver {name}: DaemonSet {found['metadata']['name']} deleted")
        ready = bool(wanted)
        for desired in wanted:
            stored = self._apply_daemonset(desired)
            ready = ready and daemonset_ready(stored)
        if ready:
            self._write_status("v1alpha1", "nvidiadrivers", driver, "ready", "Ready", "Reconciled",
                               "All resources have been successfully reconciled")
        else:
            self._write_status("v1alpha1", "nvidiadrivers", driver, "notReady", "Error", "DriverNotReady",
                               "Waiting for driver pod to be ready")

    def _apply_daemonset(self, desired: Obj) -> Obj:
        """Create the DaemonSet, or replace its spec when the desired one differs (the operator's
        state_skel createOrUpdateObjs); the stored object is returned."""
        namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
        try:
            stored = _json(self.apps.read_namespaced_daemon_set(name, namespace, _preload_content=False))
        except ApiException as error:
            if error.status != 404:
                raise
            self._note(f"DaemonSet {name} created")
            return _json(self.apps.create_namespaced_daemon_set(namespace, desired, _preload_content=False))
        fingerprint = desired["metadata"]["annotations"]["gpugate.io/spec-hash"]
        if stored["metadata"].get("annotations", {}).get("gpugate.io/spec-hash") == fingerprint:
            return stored
        desired = {**desired, "metadata": {**desired["metadata"],
                                           "resourceVersion": stored["metadata"]["resourceVersion"]}}
        self._note(f"DaemonSet {name} updated")
        return _json(self.apps.replace_namespaced_daemon_set(name, namespace, desired, _preload_content=False))

    # -- GFD and ClusterPolicy -----------------------------------------------------------------

    def _label_driver_versions(self, nodes: Mapping[str, Obj], pods: Mapping[str, Obj]) -> None:
        for name, pod in pods.items():
            version = driver_version(pod)
            if (name in nodes and version and pod_ready(pod)
                    and _labels(nodes[name]).get(DRIVER_VERSION_LABEL) != version):
                major, minor, *rest = version.split(".") + ["", ""]
                self._patch_node(name, labels={DRIVER_VERSION_LABEL: version,
                                               "nvidia.com/cuda.driver-version.major": major,
                                               "nvidia.com/cuda.driver-version.minor": minor,
                                               "nvidia.com/cuda.driver-version.revision": rest[0]})

    def _reconcile_policy(self, policy: Obj, nodes: Mapping[str, Obj], pods: Mapping[str, Obj]) -> None:
        gpu_nodes = {n: node for n, node in nodes.items() if _labels(node).get(NFD_GPU_LABEL) == "true"}
        if not gpu_nodes:
            self._write_status("v1", "clusterpolicies", policy, "ready", "Ready", "NoGPUNodes",
                               "No GPU node found, watching for new nodes to join the cluster.")
            return
        without_driver = [n for n in gpu_nodes if not (n in pods and pod_ready(pods[n]))]
        states = list(DRIVER_GATED_STATES) if without_driver else []
        reasons = []
        upgrading = [n for n, node in gpu_nodes.items()
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

    def _patch_node(self, name: str, *, labels: Mapping[str, str | None]) -> None:
        self.core.patch_node(name, {"metadata": {"labels": dict(labels)}})


# -- pure: what the operator would write, from what it reads --------------------------------------


def desired_owners(drivers: list[Obj], nodes: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """node -> owning NVIDIADriver (AssignOwners); a node no CR claims is absent (its label goes).

    Raises :class:`OwnershipConflict` on two default CRs or two non-default CRs matching one node:
    the operator then changes no label at all.
    """
    defaults = [d["metadata"]["name"] for d in drivers if (d.get("spec") or {}).get("default")]
    others = [d for d in drivers if not (d.get("spec") or {}).get("default")]
    conflicts: dict[str, str] = {}
    if len(defaults) > 1:
        for name in defaults:
            conflicts[name] = f"more than one default NVIDIADriver found: {', '.join(defaults)}"
    owners: dict[str, str] = {}
    for node, labels in sorted(nodes.items()):
        claimants = [d["metadata"]["name"] for d in others
                     if all(labels.get(k) == v for k, v in ((d.get("spec") or {}).get("nodeSelector") or {}).items())]
        if len(claimants) > 1:
            for name in claimants:
                conflicts.setdefault(name, f"nodeSelector of NVIDIADriver {name} selects node {node}, also selected "
                                           f"by {', '.join(c for c in claimants if c != name)}")
        elif claimants:
            owners[node] = claimants[0]
        elif len(defaults) == 1:
            owners[node] = defaults[0]
    if conflicts:
        raise OwnershipConflict(conflicts)
    return owners


def os_pool(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """The OS pool a node falls in (nodepool.go getNodePools: NFD's OS id and version), or None
    without NFD's OS labels (the operator skips such a node with a warning)."""
    os_id, version = labels.get(NFD_OS_ID), labels.get(NFD_OS_VERSION)
    return (os_id, version) if os_id and version else None


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def config_digest(manager: Obj, driver: Obj) -> str:
    """What installs the driver (object_controls.go extractDriverInstallConfig: the manager's image
    and env, the driver container's image, command, args and env), hashed."""
    install = {"managerImage": manager.get("image"), "managerEnv": manager.get("env") or [],
               "driverImage": driver.get("image"), "command": driver.get("command") or [],
               "args": driver.get("args") or [], "driverEnv": driver.get("env") or []}
    return _short_hash(json.dumps(install, sort_keys=True))


def driver_daemonset(driver: Obj, pool: tuple[str, str], namespace: str) -> Obj:
    """The driver DaemonSet the operator renders for one NVIDIADriver and OS pool (nodepool.go
    getOSTag: ``<os id><version id>``, e.g. ubuntu24.04)."""
    spec = driver.get("spec") or {}
    name, uid = driver["metadata"]["name"], driver["metadata"]["uid"]
    os_id, os_version = pool
    tag = f"{os_id}{os_version}"
    app = f"nvidia-{spec.get('driverType', 'gpu')}-driver-{tag}-{_short_hash(uid)}"
    image = f"{spec.get('repository', 'nvcr.io/nvidia')}/{spec.get('image', 'driver')}:{spec.get('version')}-{tag}"
    manager: Obj = {"name": MANAGER_CONTAINER, "image": MANAGER_IMAGE,
                    "env": [{"name": "ENABLE_GPU_POD_EVICTION", "value": "false"},
                            {"name": "ENABLE_AUTO_DRAIN", "value": "false"}]}
    container: Obj = {"name": DRIVER_CONTAINER, "image": image, "env": list(spec.get("env") or []),
                      **({"args": spec["args"]} if spec.get("args") else {})}
    digest = config_digest(manager, container)
    for part in (manager, container):
        part["env"] = [*part["env"], {"name": DIGEST_ENV, "value": digest}]
    labels = {"app": app, COMPONENT_LABEL: DRIVER_COMPONENT, "nvidia.com/node.os-version": tag,
              "nvidia.com/precompiled": str(bool(spec.get("usePrecompiled"))).lower()}
    node_selector = {DEPLOY_DRIVER: "true", **(spec.get("nodeSelector") or {}), GPU_PRESENT_LABEL: "true",
                     OWNER_LABEL: name, NFD_OS_ID: os_id, NFD_OS_VERSION: os_version}
    template = {
        "metadata": {"labels": {**labels, **(spec.get("labels") or {})},
                     "annotations": {"kubectl.kubernetes.io/default-container": DRIVER_CONTAINER}},
        "spec": {
            "nodeSelector": node_selector,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                            *(spec.get("tolerations") or [])],
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchExpressions": [{"key": COMPONENT_LABEL, "operator": "In",
                                                        "values": ["nvidia-driver", "nvidia-vgpu-manager"]}]},
                "topologyKey": "kubernetes.io/hostname"}]}},
            "priorityClassName": spec.get("priorityClassName") or "system-node-critical",
            "hostPID": True,
            "initContainers": [manager],
            "containers": [container],
        },
    }
    body = {"selector": {"matchLabels": {"app": app}}, "updateStrategy": {"type": "OnDelete"}, "template": template}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": app, "namespace": namespace, "labels": {**labels, **(spec.get("labels") or {})},
                     "annotations": {"gpugate.io/spec-hash": _short_hash(json.dumps(body, sort_keys=True))},
                     "ownerReferences": [{"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "name": name,
                                          "uid": uid, "controller": True, "blockOwnerDeletion": True}]},
        "spec": body,
    }


def validator_daemonset(namespace: str) -> Obj:
    """The operator validator (state-operator-validation): one pod per GPU node, Ready once it validated."""
    labels = {"app": VALIDATOR, COMPONENT_LABEL: "gpu-operator"}
    body = {"selector": {"matchLabels": {"app": VALIDATOR}},
            "template": {"metadata": {"labels": labels},
                         "spec": {"nodeSelector": {DEPLOY_VALIDATOR: "true"},
                                  "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                   "effect": "NoSchedule"}],
                                  "priorityClassName": "system-node-critical",
                                  "containers": [{"name": "nvidia-operator-validator",
                                                  "image": "nvcr.io/nvidia/gpu-operator:v26.7.0"}]}}}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": VALIDATOR, "namespace": namespace, "labels": labels,
                         "annotations": {"gpugate.io/spec-hash": _short_hash(json.dumps(body, sort_keys=True))}},
            "spec": body}


def daemonset_ready(ds: Obj) -> bool:
    """state_skel.go isDaemonSetReady: observed, and every desired pod available and updated (a
    DaemonSet with no node to run on is ready)."""
    status = ds.get("status") or {}
    desired = int(status.get("desiredNumberScheduled") or 0)
    observed = int(status.get("observedGeneration") or 0) >= int(ds["metadata"].get("generation") or 0)
    if observed and desired == 0 and not status.get("numberMisscheduled") and not status.get("currentNumberScheduled"):
        return True
    available = int(status.get("numberAvailable") or 0)
    return observed and desired != 0 and desired == available == int(status.get("updatedNumberScheduled") or 0)


def driver_version(pod: Obj | None) -> str | None:
    """The driver version a driver pod runs: its driver image's tag up to the OS suffix."""
    for container in ((pod or {}).get("spec") or {}).get("containers") or []:
        if container.get("name") == DRIVER_CONTAINER:
            tag = str(container.get("image", "")).rpartition(":")[2]
            return tag.split("-")[0] or None
    return None


def pod_ready(pod: Obj | None) -> bool:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    return ((pod or {}).get("status") or {}).get("phase") == "Running" and bool(statuses) and all(
        s.get("ready") for s in statuses)


def restarts(pod: Obj | None) -> int:
    return max((int(s.get("restartCount") or 0)
                for s in ((pod or {}).get("status") or {}).get("containerStatuses") or []), default=0)


def _labels(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _json(response: Any) -> Obj:
    try:
        return dict(json.loads(response.data))
    finally:
        response.release_conn()
