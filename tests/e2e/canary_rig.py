"""The Argo CD rig of the canary controller's failure-mode tests: one canary pool per failure mode, all
rolled out by one commit and decided in parallel by ``gpugate stack canary --watch``.

On the Argo CD rig of ``argocd_env`` (its own control plane, Argo CD v3.2.11, NVIDIA's upgrade state
machine, the operator stand-in) with a layout of its own: a baseline pool ``default`` (two nodes,
a GPU workload under a PodDisruptionBudget), a ``fleet`` pool the healthy canary promotes to, and one
single-node canary pool per failure mode. The fake kubelet's per-pod rules make each canary node
fail the way its mode says (a driver that cannot load, one that never turns Ready, a validator that
never validates, a failing DCGM diagnostic), the test writes the rest as NVIDIA's components would (a
pod that holds the driver, a long job the upgrade waits for, MIG pending, an XID on the canary's GPUs
exported by a DCGM exporter and scraped by a real Prometheus). Only the gpu-operator Application is
bootstrapped (with its AppProject): the other children play no part in a driver rollout.

A ``Sampler`` reads every node and the baseline workload every second, so the test can prove no node
outside the canary pools moved and no GPU pod there was evicted, and when each node changed state.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.dcgmexporter import Device, Exporter, Reading
from tests.e2e.argocd_env import POD_LIFECYCLE, POOL_LABEL, GitOpsRig
from tests.e2e.argocd_gitops import git
from tests.e2e.argocd_harness import run
from tests.e2e.argocd_standin import DRIVER_VERSION_LABEL, STATE_LABEL
from tests.promserver import Prometheus
from webhook.localcluster import processes

Obj = dict[str, Any]
OLD, NEW = "595.91.07", "610.57.04"
GPUGATE = Path(sys.executable).with_name("gpugate")
MODES = {
    "canary-ok": "",
    "canary-failed": "upgrade-failed",
    "canary-pinned": "gpu-consumer",
    "canary-noload": "driver-not-ready",
    "canary-unvalid": "validation-timeout",
    "canary-stuck": "stuck-state",
    "canary-mig": "mig-pending",
    "canary-xid": "xid-rate",
    "canary-diag": "dcgm-diagnostic",
}
"""Canary pool -> the failure mode it shows ('' for the healthy one, promoted to ``fleet``)."""
LIMITS = {"stuckSeconds": 12, "driverReadySeconds": 12, "validationSeconds": 12, "migPendingSeconds": 8}
INTERVAL = 1.0
SOAK = 12
XID_WINDOW = 20
LONG_JOB = {"e2e.gpugate.io/long-job": "true"}
DIAG_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"
LAYOUT = ("default", "default", "fleet", *MODES)


def canary_yaml(prometheus: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "gpugate.io/v1alpha1", "kind": "CanaryAnalysis", "pools": list(MODES),
        "promoteTo": ["fleet"], "baseline": "default", "windowSeconds": SOAK, "intervalSeconds": INTERVAL,
        "timeoutSeconds": 600, "limits": LIMITS, "xid": {"windowSeconds": XID_WINDOW, "minimum": 1},
        "diagnostics": {"image": DIAG_IMAGE, "level": 1, "timeoutSeconds": 60, "namespace": "gpu-operator"},
        "prometheus": {"url": prometheus}}, sort_keys=False)


def pools_of(stack: Obj) -> list[Obj]:
    """stack.yaml's pools for the layout: default as shipped, then fleet and the canary pools."""
    default = next(p for p in stack["pools"] if p["name"] == "default")
    canary = next(p for p in stack["pools"] if p["name"] == "canary")
    pools = [default]
    for name in ("fleet", *MODES):
        pool = copy.deepcopy(canary)
        pool["name"] = name
        pool.pop("crName", None)
        pool["nodeSelector"] = {POOL_LABEL: name}
        if name == "canary-stuck":
            pool["upgradePolicy"]["waitForCompletion"] = {"timeoutSeconds": 0,
                                                          "podSelector": ",".join(f"{k}={v}" for k, v in
                                                                                  LONG_JOB.items())}
        pools.append(pool)
    return pools


@dataclass
class Sample:
    at: float
    nodes: dict[str, tuple[str, str, bool]]
    """node -> (driver version label, upgrade state, unschedulable)."""
    workload: frozenset[str]
    """The baseline GPU workload's Ready pod uids."""


@dataclass
class Sampler:
    """Every second: each node's driver, state and cordon, and the baseline workload's pods."""

    api: client.ApiClient
    workload_namespace: str | None = None
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Sampler:
        threading.Thread(target=self._loop, name="canary-sampler", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            try:
                nodes = {n.metadata.name: ((n.metadata.labels or {}).get(DRIVER_VERSION_LABEL, ""),
                                           (n.metadata.labels or {}).get(STATE_LABEL, ""),
                                           bool(n.spec.unschedulable)) for n in core.list_node().items}
                pods: frozenset[str] = frozenset()
                if self.workload_namespace:
                    pods = frozenset(p.metadata.uid for p in core.list_namespaced_pod(self.workload_namespace).items
                                     if not p.metadata.deletion_timestamp and any(
                                         c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))
                self.samples.append(Sample(time.time(), nodes, pods))
            except Exception:  # a sample missed is a gap, said by the sample times
                pass
            self._stop.wait(1.0)


@dataclass
class Faults:
    """What the fake kubelet makes of each canary node's pods (read at every pod start)."""

    nodes: dict[str, str] = field(default_factory=dict)
    """canary node -> its pool."""
    validator_broken: bool = False

    def _pool(self, pod: Obj) -> str:
        return self.nodes.get(str((pod.get("spec") or {}).get("nodeName")), "")

    @staticmethod
    def _new_driver(pod: Obj) -> bool:
        return any(f"driver:{NEW}-" in str(c.get("image")) for c in pod["spec"].get("containers") or [])

    def crash(self, pod: Obj) -> bool:
        return self._new_driver(pod) and self._pool(pod) in ("canary-failed", "canary-pinned")

    def never_ready(self, pod: Obj) -> bool:
        if self._new_driver(pod) and self._pool(pod) == "canary-noload":
            return True
        validator = ((pod.get("metadata") or {}).get("labels") or {}).get("app") == "nvidia-operator-validator"
        return validator and self.validator_broken and self._pool(pod) == "canary-unvalid"

    def exit(self, pod: Obj) -> tuple[float, int] | None:
        if not any("dcgm:" in str(c.get("image")) for c in pod["spec"].get("containers") or []):
            return None
        return (1.0, 1) if self._pool(pod) == "canary-diag" else (1.0, 0)


class CanaryRig(GitOpsRig):
    """The Argo CD rig with the failure-mode layout, Prometheus, a DCGM exporter and the controllers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, layout=LAYOUT, **kwargs)
        self.faults = Faults()
        self.exporter: Exporter | None = None
        self.prometheus: Prometheus | None = None
        self.controllers: list[processes.Process] = []
        self.sampler: Sampler | None = None

    def start(self) -> CanaryRig:
        super().start()
        self.faults.nodes = {n: p for n, p in self.nodes.items() if p in MODES}
        self.cluster.kubelet.lifecycle = dataclasses.replace(
            POD_LIFECYCLE, crash_when=self.faults.crash, never_ready_when=self.faults.never_ready,
            exit_when=self.faults.exit)
        self.exporter = Exporter()
        self.show_xids(0)
        self.prometheus = Prometheus(self.workdir / "prometheus", {"dcgm": [self.exporter.target]})
        self._step("prometheus")
        self._lay_out_pools()
        self.sampler = Sampler(self.api).start()
        return self

    def _lay_out_pools(self) -> None:
        """stack.yaml's pools for the layout and canary.yaml, committed in the fork (one sync commit)."""
        assert self.fork is not None and self.prometheus is not None
        path = self.fork.path / "manifests" / "gpu-operator" / "stack.yaml"
        stack = yaml.safe_load(path.read_text())
        stack["pools"] = pools_of(stack)
        path.write_text(yaml.safe_dump(stack, sort_keys=False))
        self.fork.stack("sync")
        (self.fork.path / "manifests" / "gpu-operator" / "canary.yaml").write_text(canary_yaml(self.prometheus.url))
        git(self.fork.path, "add", "-A")
        git(self.fork.path, "commit", "-q", "--no-verify", "-m", "canary.yaml: one canary pool per failure mode")
        # The controller pushes into this working clone: the pushed branch updates its files too.
        git(self.fork.path, "config", "receive.denyCurrentBranch", "updateInstead")
        self._step("pools")

    def bootstrap_operator(self) -> None:
        """Only the AppProject and the gpu-operator Application, rendered from the fork as the root would;
        and the RuntimeClass ``nvidia`` the operator's toolkit state creates (the diagnostic Jobs name it)."""
        assert self.fork is not None
        self.kubectl.apply_objects([{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                     "metadata": {"name": "nvidia"}, "handler": "nvidia"}])
        rendered = run(["kubectl", "kustomize", str(self.fork.path / "argocd" / "apps")]).stdout
        wanted = [d for d in yaml.safe_load_all(rendered) if d and (
            d["kind"] == "AppProject" or (d["kind"] == "Application" and d["metadata"]["name"] == "gpu-operator"))]
        self.kubectl.apply_objects(wanted)
        self.waves = {"gpu-operator": 3}

    def show_xids(self, code: int) -> None:
        """The canary-xid node's GPUs report XID ``code`` (0: none); the baseline's never do."""
        assert self.exporter is not None
        readings = []
        for name, pool in self.nodes.items():
            if pool in ("default", "canary-xid"):
                xid = code if pool == "canary-xid" else 0
                readings += [Reading(device=Device(host=name, gpu=i), active=0.3, xid=xid) for i in range(8)]
        self.exporter.show(readings)

    def start_controllers(self, replicas: int = 2) -> None:
        """``gpugate stack canary --watch`` as the Deployment runs it, twice, leader-elected."""
        assert self.fork is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env.update({"KUBECONFIG": str(self.cluster.kubeconfig), "GPUGATE_GIT_URL": str(self.fork.path),
                    "GPUGATE_GIT_BRANCH": "main", "GIT_CONFIG_NOSYSTEM": "1"})
        for index in range(replicas):
            name = f"gpugate-canary-{index}"
            workdir = self.workdir / name
            workdir.mkdir(parents=True, exist_ok=True)
            launch = processes.Launch(
                name=name, ports=0, timeout=60,
                command=lambda _ports: [str(GPUGATE), "stack", "canary", "--watch", "--lease-namespace", "default"],
                probe=lambda _ports, w=workdir: (w / "repo" / ".git").is_dir())
            self.controllers.append(processes.start(launch, self.workdir, env={
                **env, "POD_NAME": name, "HOME": str(workdir), "GPUGATE_WORKDIR": str(workdir)}))

    def controller_logs(self, lines: int = 30) -> str:
        return "\n".join(f"{c.name}:\n{c.tail(lines)}" for c in self.controllers)

    def explain(self) -> str:
        return super().explain() + "\n" + self.controller_logs(15)

    def stop(self) -> None:
        for part in (*self.controllers, self.sampler, self.prometheus, self.exporter):
            if part is not None:
                try:
                    part.stop()
                except Exception:
                    pass
        super().stop()
