"""A fake kubelet for many fake GPU nodes: what a real kubelet tells the API server, minus containers.

Why: the scheduler, the node-lifecycle controller, the Job controller and our balancer only see
what kubelets write to the API server. This module writes the same things, with the real
``kubernetes`` client against the real API server (no mocks):

- a Node per :class:`NodeSpec`, with realistic capacity/allocatable (cpu, memory, pods,
  ephemeral-storage, ``nvidia.com/gpu`` and, if asked, ``nvidia.com/gpu.shared`` and MIG
  resources) and the labels GPU Feature Discovery would put on it; kept Ready through
  ``nodes/status`` and a Lease in ``kube-node-lease`` renewed every 10 s, as kubelets do;
- pods bound to one of our nodes become Running and Ready through ``pods/status``; with a
  :class:`PodLifecycle` they go the way a kubelet takes them: Pending (``ContainerCreating``) for a
  while, Running but not Ready until a readiness delay has passed, or, for a container whose image
  is configured as bad, Running and never Ready, its ``restartCount`` rising in
  ``CrashLoopBackOff`` (what k8s-operator-libs reads to fail a driver upgrade);
- pods labelled ``e2e.gpugate.io/complete-after: "<seconds>"`` become Succeeded (exit code 0)
  that long after they started, which is how a test makes a Job complete;
- pods that are Terminating (deletionTimestamp set) on our nodes are force-deleted (grace 0),
  or they would stay Terminating forever and block, for example, a Job's completion; with
  ``PodLifecycle.honour_grace`` only once their ``deletionGracePeriodSeconds`` (the pod's
  ``terminationGracePeriodSeconds`` unless the delete asked for another) have passed, as a kubelet
  waits for containers to stop.

Pods are followed with one list+watch, not polling, so a test sees Running within milliseconds
of the scheduler's binding. Only nodes this object created are touched, so it can also run
against an existing cluster (``GPUGATE_E2E_KUBECONFIG``) next to real nodes.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

Obj = dict[str, Any]

COMPLETE_AFTER = "e2e.gpugate.io/complete-after"
"""Pod label: seconds after Running at which the pod becomes Succeeded."""
FAKE_NODE = "e2e.gpugate.io/fake-node"
"""Node label on every node made here, so a test (or a human) can tell them apart."""
NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
"""A kubelet's default; it renews at a quarter of it."""
LEASE_RENEW_SECONDS = 10.0
WATCH_TIMEOUT_SECONDS = 60
STRATEGIC = "application/strategic-merge-patch+json"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """One fake node: an 8-GPU H100 box by default, a CPU-only node with ``gpus=0``.

    The GPU fields become the labels GPU Feature Discovery writes and the extended resources
    the NVIDIA device plugin advertises (see ../shared/reference/gpu-operator.md section 4).
    """

    name: str
    gpus: int = 8
    """Physical GPUs: ``nvidia.com/gpu.count``, and ``nvidia.com/gpu`` unless shared or MIG."""
    product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    family: str = "hopper"
    clique: str | None = None
    """``nvidia.com/gpu.clique``: the NVLink domain; only fabric-attached systems have one."""
    replicas: int = 1
    """Time-slicing/MPS replicas per GPU; above 1 the node advertises ``gpus * replicas``."""
    sharing_strategy: str = "time-slicing"
    """Used when ``replicas > 1``: ``time-slicing`` or ``mps``."""
    rename_shared: bool = True
    """With sharing, advertise ``nvidia.com/gpu.shared`` (renameByDefault) instead of ``nvidia.com/gpu``
    with a ``-SHARED`` product label."""
    mig: Mapping[str, int] = field(default_factory=dict)
    """MIG devices by profile under the mixed strategy, e.g. ``{"1g.10gb": 56}``."""
    mig_config: str | None = None
    """``nvidia.com/mig.config``, e.g. ``all-1g.10gb``."""
    whole_gpus: int | None = None
    """Override the ``nvidia.com/gpu`` count (e.g. some GPUs MIG-partitioned, some whole)."""
    cpu: int = 64
    memory_gib: int = 512
    ephemeral_storage_gib: int = 1024
    pods: int = 110
    reserved_cpu_millis: int = 500
    """Allocatable is capacity minus what a kubelet reserves for the system."""
    reserved_memory_mib: int = 2048
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    extra_resources: Mapping[str, str] = field(default_factory=dict)
    """More capacity (= allocatable), e.g. ``{"example.com/fpga": "2"}``."""

    def gpu_resources(self) -> dict[str, str]:
        """The extended resources the device plugin would advertise for this node."""
        if self.gpus <= 0:
            return {}
        shared = self.replicas > 1
        whole = self.whole_gpus
        if whole is None:
            whole = 0 if self.mig or (shared and self.rename_shared) else self.gpus * self.replicas
        resources = {"nvidia.com/gpu": whole}
        if shared and self.rename_shared:
            resources["nvidia.com/gpu.shared"] = self.gpus * self.replicas
        resources.update({f"nvidia.com/mig-{profile}": count for profile, count in self.mig.items()})
        return {name: str(count) for name, count in resources.items() if count > 0}

    def capacity(self) -> dict[str, str]:
        return {
            "cpu": str(self.cpu),
            "memory": f"{self.memory_gib}Gi",
            "pods": str(self.pods),
            "ephemeral-storage": f"{self.ephemeral_storage_gib}Gi",
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
            **self.gpu_resources(),
            **self.extra_resources,
        }

    def allocatable(self) -> dict[str, str]:
        return {
            **self.capacity(),
            "cpu": f"{self.cpu * 1000 - self.reserved_cpu_millis}m",
            "memory": f"{self.memory_gib * 1024 - self.reserved_memory_mib}Mi",
        }

    def node_labels(self) -> dict[str, str]:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            FAKE_NODE: "true",
        }
        if self.gpus > 0:
            labels.update(self._gfd_labels())
        labels.update(self.labels)
        return labels

    def _gfd_labels(self) -> dict[str, str]:
        shared = self.replicas > 1
        product = self.product + ("-SHARED" if shared and not self.rename_shared else "")
        labels = {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.memory": str(self.gpu_memory_mib),
            "nvidia.com/gpu.count": str(self.gpus),
            "nvidia.com/gpu.family": self.family,
            "nvidia.com/gpu.replicas": str(self.replicas),
            "nvidia.com/gpu.sharing-strategy": self.sharing_strategy if shared else "none",
        }
        if self.clique:
            labels["nvidia.com/gpu.clique"] = self.clique
        if self.mig_config:
            labels["nvidia.com/mig.config"] = self.mig_config
        if self.mig:
            labels["nvidia.com/mig.capable"] = "true"
            labels["nvidia.com/mig.strategy"] = "mixed"
            for profile, count in self.mig.items():
                labels[f"nvidia.com/mig-{profile}.count"] = str(count)
                labels[f"nvidia.com/mig-{profile}.product"] = f"{self.product}-MIG-{profile}"
                labels[f"nvidia.com/mig-{profile}.replicas"] = "1"
        return labels


@dataclass(frozen=True, slots=True)
class PodLifecycle:
    """How long a fake container takes at each step, and which ones never work.

    The default is the instant kubelet most e2e tests want (Running and Ready at once, deleted at
    once). The Argo CD e2e sets delays, so the GPU Operator's upgrade state machine sees pods that
    take time to start and stop, and a bad driver image, so it sees a driver that never loads.
    """

    creating_seconds: float = 0.0
    """Pending with containers waiting in ``ContainerCreating`` (image pull, sandbox) this long."""
    ready_seconds: float = 0.0
    """Running this long before the readiness probe passes (containers ``ready: false`` until then)."""
    honour_grace: bool = False
    """Wait a Terminating pod's ``deletionGracePeriodSeconds`` before removing it."""
    max_grace_seconds: float = 60.0
    """Never wait longer than this (a test's patience), whatever the pod asks."""
    crash_images: frozenset[str] = frozenset()
    """Containers whose image contains one of these strings exit 1 at every start: CrashLoopBackOff."""
    restart_seconds: float = 0.3
    """Seconds between two restarts of a crash-looping container (a kubelet backs off 10 s, doubling to
    5 min; k8s-operator-libs only counts restarts, more than 10)."""
    max_restarts: int = 30
    """Restarts after which the loop stops writing (the count stays, the pod stays not Ready)."""

    def crashes(self, pod: Obj) -> bool:
        images = [str(c.get("image") or "") for c in pod["spec"].get("containers") or []]
        return any(bad in image for bad in self.crash_images for image in images)


# -- what a kubelet writes (pure functions of their inputs) ---------------------------------


def rfc3339(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(moment: float) -> str:
    """The MicroTime a Lease's renewTime takes."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_manifest(spec: NodeSpec) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": spec.node_labels()},
        "spec": {"providerID": f"fake://{spec.name}", "taints": [dict(t) for t in spec.taints]},
    }


def node_status(spec: NodeSpec, *, address: str, kubelet_version: str, now: float) -> Obj:
    """A Ready node's status: capacity, conditions, addresses and node info."""
    stamp = rfc3339(now)

    def condition(kind: str, status: str, reason: str, message: str) -> Obj:
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}

    return {"status": {
        "capacity": spec.capacity(),
        "allocatable": spec.allocatable(),
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "fake kubelet has sufficient memory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "fake kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "fake kubelet has sufficient PID"),
            condition("Ready", "True", "KubeletReady", "fake kubelet (gpugate e2e) is posting ready status"),
        ],
        "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": spec.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, spec.name).hex,
            "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, spec.name)),
            "bootID": str(uuid.uuid4()),
            "kernelVersion": "6.8.0-gpugate-e2e",
            "osImage": "gpugate e2e fake node",
            "containerRuntimeVersion": "fake://0.0.0",
            "kubeletVersion": kubelet_version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }}


def lease_manifest(node: Obj, *, now: float) -> Obj:
    name = node["metadata"]["name"]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE, "ownerReferences": [{
            "apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}]},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                 "renewTime": micro_time(now)},
    }


def creating_status(pod: Obj, *, host_ip: str, now: float) -> Obj:
    """Bound, containers not started yet: Pending, each container waiting in ContainerCreating."""
    stamp = rfc3339(now)
    return {"status": {
        "phase": "Pending", "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "startTime": stamp,
        "conditions": [{"type": kind, "status": "False", "lastTransitionTime": stamp}
                       for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")],
        "containerStatuses": [{"name": c["name"], "image": c.get("image") or "unknown", "imageID": "",
                               "ready": False, "started": False, "restartCount": 0,
                               "state": {"waiting": {"reason": "ContainerCreating"}}}
                              for c in pod["spec"]["containers"]],
    }}


def ready_status(running: Obj, *, now: float) -> Obj:
    """The readiness probe passed: every container of the ``running`` pod and the pod Ready, the
    container states as they were (the whole list is sent: it is replaced, not merged)."""
    stamp = rfc3339(now)
    return {"status": {
        "conditions": [{"type": kind, "status": "True", "lastTransitionTime": stamp}
                       for kind in ("Ready", "ContainersReady")],
        "containerStatuses": [{**c, "ready": True} for c in (running.get("status") or {}).get("containerStatuses")
                              or []],
    }}


def crashloop_status(pod: Obj, *, restarts: int, now: float) -> Obj:
    """Running, but every container exited 1 again and waits in CrashLoopBackOff: never Ready."""
    stamp = rfc3339(now)
    uid = pod["metadata"]["uid"]
    return {"status": {
        "phase": "Running",
        "conditions": [{"type": kind, "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": stamp}
                       for kind in ("Ready", "ContainersReady")],
        "containerStatuses": [{
            "name": c["name"], "image": c.get("image") or "unknown", "imageID": "",
            "containerID": f"fake://{uid}/{c['name']}/{restarts}", "ready": False, "started": False,
            "restartCount": restarts,
            "state": {"running": None, "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off restarting failed container {c['name']} (fake kubelet: bad image)"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": stamp, "finishedAt": stamp}},
        } for c in pod["spec"]["containers"]],
    }}


def running_status(pod: Obj, *, host_ip: str, pod_ip: str, now: float, ready: bool = True) -> Obj:
    """The status a kubelet reports once every container started (and, with ``ready``, passed
    readiness)."""
    stamp = rfc3339(now)
    spec = pod["spec"]
    uid = pod["metadata"]["uid"]
    ip = host_ip if spec.get("hostNetwork") else pod_ip

    def container(c: Obj, state: Obj, *, ready: bool, started: bool) -> Obj:
        return {"name": c["name"], "image": c.get("image") or "unknown", "imageID": "",
                "containerID": f"fake://{uid}/{c['name']}", "ready": ready, "started": started,
                "restartCount": 0, "state": state}

    running = {"waiting": None, "running": {"startedAt": stamp}}
    completed = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": stamp, "finishedAt": stamp}}
    inits = [container(c, running, ready=True, started=True) if c.get("restartPolicy") == "Always"
             else container(c, completed, ready=True, started=False)
             for c in spec.get("initContainers") or []]
    status: Obj = {
        "phase": "Running",
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": ip, "podIPs": [{"ip": ip}],
        "startTime": stamp,
        "conditions": [{"type": kind, "status": "True" if ready or kind in ("PodReadyToStartContainers",
                                                                            "Initialized") else "False",
                        "lastTransitionTime": stamp}
                       for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")],
        "containerStatuses": [container(c, running, ready=ready, started=True) for c in spec["containers"]],
    }
    if inits:
        status["initContainerStatuses"] = inits
    return {"status": status}


def succeeded_status(pod: Obj, *, now: float) -> Obj:
    """Every container exited 0; ``running: None`` removes the old state in the strategic merge."""
    return exited_status(pod, now=now, exit_code=0)


def exited_status(pod: Obj, *, now: float, exit_code: int) -> Obj:
    """Every container exited with ``exit_code``: phase Succeeded for 0, else Failed."""
    stamp = rfc3339(now)
    uid = pod["metadata"]["uid"]
    started = (pod.get("status") or {}).get("startTime") or stamp
    reason = "Completed" if exit_code == 0 else "Error"
    return {"status": {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "conditions": [{"type": kind, "status": "False", "reason": "PodCompleted" if exit_code == 0 else "PodFailed",
                        "lastTransitionTime": stamp}
                       for kind in ("Ready", "ContainersReady")],
        "containerStatuses": [{
            "name": c["name"], "image": c.get("image") or "unknown", "imageID": "",
            "containerID": f"fake://{uid}/{c['name']}", "ready": False, "started": False, "restartCount": 0,
            "state": {"running": None, "terminated": {"exitCode": exit_code, "reason": reason,
                                                      "startedAt": started, "finishedAt": stamp}},
        } for c in pod["spec"]["containers"]],
    }}


# -- the loops ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FakeNode:
    """A node this kubelet serves: its spec, its uid and the addresses it hands out."""

    spec: NodeSpec
    uid: str
    index: int

    @property
    def address(self) -> str:
        return f"10.200.{self.index // 250}.{self.index % 250 + 1}"

    def pod_ip(self, serial: int) -> str:
        return f"10.{64 + self.index // 250}.{self.index % 250}.{serial % 250 + 2}"


class FakeKubelet:
    """Serves every node added with :meth:`add_node` until :meth:`stop`.

    Three daemon threads: the heartbeat (Leases), the pod list+watch, and a timer for
    ``complete-after``. Errors in them are kept in :attr:`errors` (and shown by ``describe``)
    rather than lost, so a stuck test can say why.
    """

    def __init__(self, api: client.ApiClient, *, lease_renew_seconds: float = LEASE_RENEW_SECONDS,
                 lifecycle: PodLifecycle | None = None) -> None:
        self.api = api
        self.lifecycle = lifecycle or PodLifecycle()
        """Read at each pod's start and deletion: a test may replace it while the kubelet runs."""
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.lease_renew_seconds = lease_renew_seconds
        self.errors: list[str] = []
        self._nodes: dict[str, FakeNode] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._indexes = itertools.count()
        self._pod_serial = itertools.count()
        self._timer_serial = itertools.count()
        self._started: set[str] = set()  # pod uids we made Running
        self._terminating: set[str] = set()  # pod uids whose grace period is being waited out
        self._timers: list[tuple[float, int, Callable[[], object]]] = []
        self._timer_wakeup = threading.Condition(self._lock)
        self._watch_response: Any = None
        self._kubelet_version = ""

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeKubelet:
        self._kubelet_version = client.VersionApi(self.api).get_code().git_version
        for target, name in ((self._heartbeat_loop, "heartbeat"), (self._pod_loop, "pods"),
                             (self._timer_loop, "timers")):
            thread = threading.Thread(target=target, name=f"fake-kubelet-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop the loops; nodes stay (the control plane goes away anyway, or a test removes them)."""
        self._stopping.set()
        with self._timer_wakeup:
            self._timer_wakeup.notify_all()
        response = self._watch_response
        if response is not None:
            try:
                response.shutdown()  # unblocks the watch thread's read at once
            except Exception:
                pass
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    # -- nodes -----------------------------------------------------------------------------

    def add_node(self, spec: NodeSpec, *, wait_schedulable: bool = True, timeout: float = 60.0) -> Obj:
        """Create the Node and its Lease, post a Ready status, and (by default) wait until the
        node-lifecycle controller has removed the ``not-ready`` taint, so pods can land on it."""
        created = _raw(self.core.create_node, node_manifest(spec))
        node = FakeNode(spec=spec, uid=created["metadata"]["uid"], index=next(self._indexes))
        with self._lock:
            self._nodes[spec.name] = node
        self._post_status(node)
        self._renew_lease(node)
        if wait_schedulable:
            self.wait_schedulable(spec.name, timeout=timeout)
        return _raw(self.core.read_node, spec.name)

    def wait_schedulable(self, name: str, *, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            node = _raw(self.core.read_node, name)
            taints = {t["key"] for t in node["spec"].get("taints") or []}
            if not taints & {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {name} still has taints {sorted(taints)} after {timeout:.0f}s "
                                   f"(is kube-controller-manager running?)")
            time.sleep(0.1)

    def remove_node(self, name: str) -> None:
        """Delete the node; its pods are force-deleted first, as a drained node's would be gone."""
        with self._lock:
            self._nodes.pop(name, None)
        pods = _raw(self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={name}")["items"]
        for pod in pods:
            meta = pod["metadata"]
            self._force_delete(meta["namespace"], meta["name"], meta["uid"])
        _ignore_missing(lambda: self.core.delete_node(name))

    @property
    def node_names(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._nodes)

    def describe(self) -> str:
        """One paragraph for a failure message: nodes served and the last errors seen."""
        errors = "\n".join(self.errors[-10:]) or "none"
        return f"fake kubelet serving {sorted(self.node_names)}; last errors:\n{errors}"

    def _post_status(self, node: FakeNode) -> None:
        body = node_status(node.spec, address=node.address, kubelet_version=self._kubelet_version, now=time.time())
        self.core.patch_node_status(node.spec.name, body, _content_type=STRATEGIC)

    def _renew_lease(self, node: FakeNode) -> None:
        now = time.time()
        body = {"spec": {"holderIdentity": node.spec.name, "renewTime": micro_time(now)}}
        try:
            self.coordination.patch_namespaced_lease(node.spec.name, NODE_LEASE_NAMESPACE, body,
                                                     _content_type="application/merge-patch+json")
        except ApiException as error:
            if error.status != 404:
                raise
            manifest = lease_manifest({"metadata": {"name": node.spec.name, "uid": node.uid}}, now=now)
            _raw(self.coordination.create_namespaced_lease, NODE_LEASE_NAMESPACE, manifest)

    def _heartbeat_loop(self) -> None:
        while not self._stopping.wait(self.lease_renew_seconds):
            with self._lock:
                nodes = list(self._nodes.values())
            for node in nodes:
                self._guard(f"renewing the lease of {node.spec.name}", functools.partial(self._renew_lease, node))

    # -- pods ------------------------------------------------------------------------------

    def _pod_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                version: str | None = self._list_pods()
                while version and not self._stopping.is_set():
                    version = self._watch_pods(version)
            except Exception as error:
                if not self._stopping.is_set():
                    self._note(f"pod watch: {error!r}")
                    self._stopping.wait(0.5)

    def _list_pods(self) -> str:
        listing = _raw(self.core.list_pod_for_all_namespaces, field_selector="spec.nodeName!=")
        for pod in listing["items"]:
            self._on_pod(pod)
        return str(listing["metadata"]["resourceVersion"])

    def _watch_pods(self, version: str) -> str | None:
        """Follow pod events from ``version``; the version to resume from, or None to relist."""
        response: Any = self.core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=", watch=True, resource_version=version,
            allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT_SECONDS, _preload_content=False)
        self._watch_response = response
        try:
            for event in _json_lines(response):
                kind, pod = event["type"], event["object"]
                if kind == "ERROR":
                    if pod.get("code") == 410:  # too old: list again
                        return None
                    raise RuntimeError(f"watch error: {pod}")
                version = pod["metadata"]["resourceVersion"]
                if kind in ("ADDED", "MODIFIED"):
                    self._on_pod(pod)
                elif kind == "DELETED":
                    with self._lock:
                        self._started.discard(pod["metadata"]["uid"])
                        self._terminating.discard(pod["metadata"]["uid"])
        finally:
            self._watch_response = None
            response.release_conn()
        return version

    def _on_pod(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        with self._lock:
            node = self._nodes.get(spec.get("nodeName", ""))
            started = meta["uid"] in self._started
        if node is None:
            return
        if meta.get("deletionTimestamp"):
            done = self._guard(f"force-deleting {meta['namespace']}/{meta['name']}", lambda: self._terminate(pod))
        elif not started and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
            done = self._guard(f"starting {meta['namespace']}/{meta['name']}", lambda: self._start_pod(node, pod))
        else:
            done = True
        if not done:  # no new event may come for this pod: look again in a second
            self._later(1.0, lambda: self._guard("re-reading a pod", lambda: self._revisit(meta)))

    def _revisit(self, meta: Obj) -> None:
        try:
            pod = _raw(self.core.read_namespaced_pod, meta["name"], meta["namespace"])
        except ApiException as error:
            if error.status == 404:
                return
            raise
        if pod["metadata"]["uid"] == meta["uid"]:
            self._on_pod(pod)

    def _terminate(self, pod: Obj) -> None:
        """A Terminating pod: gone at once, or once its grace period has passed (PodLifecycle)."""
        meta = pod["metadata"]
        lifecycle = self.lifecycle
        grace = min(float(meta.get("deletionGracePeriodSeconds") or 0), lifecycle.max_grace_seconds)
        if not lifecycle.honour_grace or grace <= 0:
            self._force_delete(meta["namespace"], meta["name"], meta["uid"])
            return
        with self._lock:
            if meta["uid"] in self._terminating:
                return
            self._terminating.add(meta["uid"])
        self._later(grace, lambda: self._guard(
            f"deleting {meta['namespace']}/{meta['name']} after its grace period",
            lambda: self._force_delete(meta["namespace"], meta["name"], meta["uid"])))

    def _patch_if_current(self, meta: Obj, status: Obj) -> Obj | None:
        """Patch the status of this very pod (same uid, not Terminating); None when it is gone."""
        try:
            current = _raw(self.core.read_namespaced_pod, meta["name"], meta["namespace"])
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        if current["metadata"]["uid"] != meta["uid"] or current["metadata"].get("deletionTimestamp"):
            return None
        return _raw(self.core.patch_namespaced_pod_status, meta["name"], meta["namespace"], status,
                    _content_type=STRATEGIC)

    def _start_pod(self, node: FakeNode, pod: Obj) -> None:
        meta = pod["metadata"]
        lifecycle = self.lifecycle
        if lifecycle.creating_seconds > 0:
            _raw(self.core.patch_namespaced_pod_status, meta["name"], meta["namespace"],
                 creating_status(pod, host_ip=node.address, now=time.time()), _content_type=STRATEGIC)
            with self._lock:
                self._started.add(meta["uid"])
            self._later(lifecycle.creating_seconds, lambda: self._guard(
                f"running {meta['namespace']}/{meta['name']}", lambda: self._run_pod(node, pod, lifecycle)))
            return
        self._run_pod(node, pod, lifecycle, fresh=True)

    def _run_pod(self, node: FakeNode, pod: Obj, lifecycle: PodLifecycle, *, fresh: bool = False) -> None:
        """Containers started; ``fresh`` when ``pod`` was just read (no need to check it is still there)."""
        meta = pod["metadata"]
        crashes = lifecycle.crashes(pod)
        ready = lifecycle.ready_seconds <= 0 and not crashes
        status = running_status(pod, host_ip=node.address, pod_ip=node.pod_ip(next(self._pod_serial)),
                                now=time.time(), ready=ready)
        if fresh:
            running: Obj | None = _raw(self.core.patch_namespaced_pod_status, meta["name"], meta["namespace"],
                                       status, _content_type=STRATEGIC)
            with self._lock:
                self._started.add(meta["uid"])
        else:
            running = self._patch_if_current(meta, status)
        if running is None:
            return
        current = running
        if crashes:
            self._later(lifecycle.restart_seconds, lambda: self._guard(
                f"crash-looping {meta['namespace']}/{meta['name']}", lambda: self._crash(pod, 1, lifecycle)))
            return
        if not ready:
            self._later(lifecycle.ready_seconds, lambda: self._guard(
                f"readying {meta['namespace']}/{meta['name']}",
                lambda: self._patch_if_current(meta, ready_status(current, now=time.time()))))
        after = (meta.get("labels") or {}).get(COMPLETE_AFTER)
        if after is not None:
            self._later(float(after), lambda: self._guard(
                f"completing {meta['namespace']}/{meta['name']}", lambda: self._complete_pod(current)))

    def _crash(self, pod: Obj, restarts: int, lifecycle: PodLifecycle) -> None:
        """One more exit 1 and restart; again after ``restart_seconds`` up to ``max_restarts``."""
        if self._patch_if_current(pod["metadata"], crashloop_status(pod, restarts=restarts, now=time.time())) is None:
            return
        if restarts < lifecycle.max_restarts:
            self._later(lifecycle.restart_seconds, lambda: self._guard(
                f"crash-looping {pod['metadata']['name']}", lambda: self._crash(pod, restarts + 1, lifecycle)))

    def _complete_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        current = _raw(self.core.read_namespaced_pod, meta["name"], meta["namespace"])["metadata"]
        if current["uid"] != meta["uid"] or current.get("deletionTimestamp"):
            return
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], succeeded_status(pod, now=time.time()),
                                              _content_type=STRATEGIC)

    def _force_delete(self, namespace: str, name: str, uid: str) -> None:
        """What a kubelet does once containers are gone: delete with grace 0, only this very pod."""
        options = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid))
        _ignore_missing(lambda: self.core.delete_namespaced_pod(name, namespace, body=options,
                                                                grace_period_seconds=0))

    # -- timers ----------------------------------------------------------------------------

    def _later(self, seconds: float, action: Callable[[], object]) -> None:
        with self._timer_wakeup:
            heapq.heappush(self._timers, (time.monotonic() + seconds, next(self._timer_serial), action))
            self._timer_wakeup.notify()

    def _timer_loop(self) -> None:
        while not self._stopping.is_set():
            with self._timer_wakeup:
                due: list[Callable[[], object]] = []
                while self._timers and self._timers[0][0] <= time.monotonic():
                    due.append(heapq.heappop(self._timers)[2])
                if not due:
                    wait = self._timers[0][0] - time.monotonic() if self._timers else None
                    self._timer_wakeup.wait(wait)
                    continue
            for action in due:
                action()

    # -- errors ----------------------------------------------------------------------------

    def _guard(self, what: str, action: Callable[[], object]) -> bool:
        """Run ``action``; on an error keep it for :meth:`describe` and return False."""
        try:
            action()
            return True
        except Exception as error:
            if not self._stopping.is_set():
                self._note(f"{what}: {error!r}"[:2000])
            return False

    def _note(self, message: str) -> None:
        self.errors.append(f"{time.strftime('%H:%M:%S')} {message}")


def _raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
    """Call an API method for the JSON the server sent: every field kept, camelCase as on the wire."""
    response = call(*args, _preload_content=False, **kwargs)
    try:
        return dict(json.loads(response.data))
    finally:
        response.release_conn()


def _json_lines(response: Any) -> Iterator[Obj]:
    """JSON objects from a chunked watch response, one per line, across chunk boundaries."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)


def _ignore_missing(action: Callable[[], object]) -> None:
    """Deleting what is already gone (404) or was replaced (409 on a uid precondition) is fine."""
    try:
        action()
    except ApiException as error:
        if error.status not in (404, 409):
            raise
