"""What the fake kubelet writes to the API server: Node, Lease and pod-status objects, built from data.

Pure builders (a moment in, an object out) that ``webhook.localcluster.fakekubelet`` sends with the
real client, and the vocabulary a test shares with it (``NodeSpec``, ``PodLifecycle``, the labels).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

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
    """Containers whose image contains one of these strings exit 1 at every start: CrashLoopBackOff, or,
    for a pod with ``restartPolicy: Never``, phase Failed."""
    restart_seconds: float = 0.3
    """Seconds between two restarts of a crash-looping container (a kubelet backs off 10 s, doubling to
    5 min; k8s-operator-libs only counts restarts, more than 10)."""
    max_restarts: int = 30
    """Restarts after which the loop stops writing (the count stays, the pod stays not Ready)."""
    crash_when: Callable[[Obj], bool] | None = None
    """A pod (as bound, with its node) whose containers crash-loop, beyond ``crash_images``: what a test
    decides per node (a driver that cannot load because something holds the old one)."""
    never_ready_when: Callable[[Obj], bool] | None = None
    """A pod that runs and never passes its readiness probe (a driver that never loads, a validator
    that never validates)."""
    exit_when: Callable[[Obj], tuple[float, int] | None] | None = None
    """A pod whose containers exit after (seconds, exit code): Succeeded for 0, else Failed (a Job's
    pod, such as a diagnostic that fails on one node)."""

    def crashes(self, pod: Obj) -> bool:
        images = [str(c.get("image") or "") for c in pod["spec"].get("containers") or []]
        if self.crash_when is not None and self.crash_when(pod):
            return True
        return any(bad in image for bad in self.crash_images for image in images)

    def never_ready(self, pod: Obj) -> bool:
        return self.never_ready_when is not None and self.never_ready_when(pod)

    def exits(self, pod: Obj) -> tuple[float, int] | None:
        return self.exit_when(pod) if self.exit_when is not None else None


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
