"""NVIDIA's driver upgrade state machine on the e2e cluster, and a record of every node it moved.

:class:`UpgradeController` runs ``gpu-upgrade-controller`` (``toolchain/upgrade-controller``:
k8s-operator-libs ``pkg/upgrade`` ``ClusterUpgradeStateManager``, BuildState then ApplyState per
reconcile, as gpu-operator ``controllers/upgrade_controller.go`` does) as a child process with
the admin kubeconfig, stopped by PID. :meth:`UpgradeController.paused` stops it with SIGSTOP (a
test reading the cluster and ``gpugate stack status`` together wants nothing to move).

:class:`NodeHistory` follows the nodes with one list+watch and keeps every change of a node's
upgrade state, owner or cordon, with the time it was seen: the library's own transitions, in
order, so a test can check "at most N nodes upgrading at any instant" over every state the API
server held, not over samples.

:class:`PoolReconcile` is one reconcile's view of one pool, read from the controller's report:
the library's counters over the state BuildState built, whether ApplyState ran on it, and the
nodes that state lacked because their re-created driver pod was not bound yet (BuildState skips
such a pod and its node; main.go holds that pool for the reconcile). A state missing one of a
pool's nodes counts one upgrade fewer in progress; :meth:`UpgradeController.partial_applies`
finds every ApplyState that ran on one, which is how a second node could start past
maxParallelUpgrades (a canary flake test_argocd once showed).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.e2e.argocd_harness import json_lines
from tests.e2e.argocd_standin import DONE, OWNER_LABEL, REQUIRED, STATE_LABEL
from tests.e2e.namespaces import has_default_account
from tests.e2e.waiting import WatchThread, wait_until
from webhook.localcluster import processes

Obj = dict[str, Any]
NOT_UPGRADING = ("", DONE, REQUIRED)
"""k8s-operator-libs GetUpgradesInProgress counts every managed node in no other state."""
IN_PLACE_STEPS = ("upgrade-required", "cordon-required", "wait-for-jobs-required", "pod-deletion-required",
                  "pod-restart-required", "validation-required", "uncordon-required", "upgrade-done")
"""k8s-operator-libs pkg/upgrade consts.go: the in-place states an upgraded node walks, in this order
(drain-required may come between pod-deletion-required and pod-restart-required)."""


def in_order(walked: list[str], steps: tuple[str, ...]) -> bool:
    """``steps`` appear in ``walked`` in this order (other states may come between)."""
    position = 0
    for state in walked:
        if position < len(steps) and state == steps[position]:
            position += 1
    return position == len(steps)


class UpgradeController:
    """``gpu-upgrade-controller`` against the cluster of ``kubeconfig``, its log in ``logs``."""

    def __init__(self, binary: Path, kubeconfig: Path, logs: Path, *, namespace: str = "gpu-operator",
                 interval: float = 0.3) -> None:
        self.binary, self.kubeconfig, self.logs = binary, kubeconfig, logs
        self.namespace, self.interval = namespace, interval
        self.process: processes.Process | None = None
        self._stopped = False

    @property
    def log(self) -> Path:
        return self.logs / "gpu-upgrade-controller.log"

    @property
    def report(self) -> Path:
        return self.logs / "gpu-upgrade-controller.reconciles.jsonl"

    def start(self) -> UpgradeController:
        self.logs.mkdir(parents=True, exist_ok=True)
        launch = processes.Launch(
            name="gpu-upgrade-controller", ports=0, timeout=30,
            command=lambda _ports: [str(self.binary), f"--kubeconfig={self.kubeconfig}",
                                    f"--namespace={self.namespace}", f"--interval={self.interval}s",
                                    f"--report={self.report}"],
            probe=lambda _ports: self.reconciles() > 0)
        self.process = processes.start(launch, self.logs)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.pause(False)
            self.process.stop()

    def pause(self, stopped: bool) -> None:
        """SIGSTOP (True) or SIGCONT (False) the controller, by its PID."""
        if self.process is None or not self.process.running() or stopped == self._stopped:
            return
        os.kill(self.process.pid, signal.SIGSTOP if stopped else signal.SIGCONT)
        self._stopped = stopped

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.pause(True)
        try:
            yield
        finally:
            self.pause(False)

    def reports(self) -> list[Obj]:
        """Every reconcile's JSON line (the library's counters per NVIDIADriver)."""
        found = []
        try:
            text = self.report.read_text(errors="replace")
        except FileNotFoundError:
            return []
        for line in text.splitlines():
            if line.startswith("{\"serial\""):
                try:
                    found.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line being written
        return found

    def reconciles(self) -> int:
        reports = self.reports()
        return int(reports[-1]["serial"]) if reports else 0

    def wait_reconciles(self, count: int, timeout: float = 30.0) -> None:
        """Until ``count`` more reconciles have finished (each BuildState reads everything afresh)."""
        target = self.reconciles() + count
        deadline = time.monotonic() + timeout
        while self.reconciles() < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"gpu-upgrade-controller did not reconcile {count} times in {timeout:.0f}s:\n"
                                     f"{self.tail()}")
            time.sleep(self.interval / 2)

    def errors(self) -> list[str]:
        return [str(r["error"]) for r in self.reports() if r.get("error")]

    def pool_reconciles(self, pool: str, after: int = 0) -> list[PoolReconcile]:
        """Every reconcile after serial ``after`` that reported ``pool``, in order."""
        return [PoolReconcile.of(r, p) for r in self.reports() if int(r["serial"]) > after
                for p in r.get("pools") or [] if p["name"] == pool]

    def partial_applies(self, sizes: Mapping[str, int], after: int = 0) -> list[PoolReconcile]:
        """The reconciles after ``after`` whose ApplyState ran on a state lacking some of a pool's
        ``sizes[pool]`` nodes: the library then counts that node neither in progress nor unavailable."""
        return [seen for pool, size in sizes.items() for seen in self.pool_reconciles(pool, after)
                if seen.applied and seen.managed < size]

    def pool_timeline(self, pool: str, after: int = 0) -> str:
        """``pool``'s reconciles after ``after``, one line each time what they saw changed."""
        lines, last = [], None
        for seen in self.pool_reconciles(pool, after):
            if seen.counters() != last:
                lines.append(f"  {seen}")
                last = seen.counters()
        return f"gpu-upgrade-controller, pool {pool}:\n" + "\n".join(lines)

    def tail(self, lines: int = 20) -> str:
        return "gpu-upgrade-controller log:\n" + processes.tail(self.log, lines)

    def running(self) -> bool:
        return self.process is not None and self.process.running()


@dataclass(frozen=True, slots=True)
class PoolReconcile:
    """One reconcile's view of one pool (gpu-upgrade-controller's report line)."""

    serial: int
    at: str
    pool: str
    managed: int
    in_progress: int
    pending: int
    failed: int
    available: int
    applied: bool
    held: tuple[str, ...]

    @classmethod
    def of(cls, reconcile: Obj, pool: Obj) -> PoolReconcile:
        return cls(int(reconcile["serial"]), str(reconcile["at"]), pool["name"], pool["managed"],
                   pool["inProgress"], pool["pending"], pool["failed"], pool["available"],
                   bool(pool.get("applied")), tuple(pool.get("held") or ()))

    def counters(self) -> tuple[int, int, int, int, int, bool, tuple[str, ...]]:
        return (self.managed, self.in_progress, self.pending, self.failed, self.available, self.applied, self.held)

    def __str__(self) -> str:
        verdict = "applied" if self.applied else "held: " + ", ".join(self.held) if self.held else "not applied"
        return (f"#{self.serial} {self.at[11:23]} managed {self.managed} in progress {self.in_progress} "
                f"pending {self.pending} failed {self.failed} available {self.available}; {verdict}")


@dataclass(frozen=True, slots=True)
class NodeChange:
    """One node as the API server held it from ``at`` (time.monotonic()) on."""

    at: float
    node: str
    state: str
    owner: str
    unschedulable: bool


class NodeHistory(WatchThread):
    """Every upgrade-state, owner and cordon change of the watched nodes, in the order the API server
    made them (one list+watch; resourceVersion order)."""

    def __init__(self, api: client.ApiClient, nodes: Iterable[str]) -> None:
        super().__init__("node-history")
        self.core = client.CoreV1Api(api)
        self.nodes = frozenset(nodes)
        self.changes: list[NodeChange] = []
        self._last: dict[str, NodeChange] = {}
        self._lock = threading.Lock()
        self.errors: list[str] = []

    def _seen(self, node: Obj) -> None:
        name = node["metadata"]["name"]
        if name not in self.nodes:
            return
        labels = node["metadata"].get("labels") or {}
        change = NodeChange(time.monotonic(), name, labels.get(STATE_LABEL, ""), labels.get(OWNER_LABEL, ""),
                            bool((node.get("spec") or {}).get("unschedulable")))
        with self._lock:
            last = self._last.get(name)
            if last is None or (last.state, last.owner, last.unschedulable) != (
                    change.state, change.owner, change.unschedulable):
                self._last[name] = change
                self.changes.append(change)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                listing = json.loads(self.core.list_node(_preload_content=False).data)
                for node in listing["items"]:
                    self._seen(node)
                version = listing["metadata"]["resourceVersion"]
                response: Any = self.core.list_node(watch=True, resource_version=version, timeout_seconds=60,
                                                    allow_watch_bookmarks=True, _preload_content=False)
                self._response = response
                for event in json_lines(response):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._seen(event["object"])
            except Exception as error:
                if not self._stopping.is_set():
                    self.errors.append(repr(error))
                    self._stopping.wait(0.5)

    def since(self, moment: float, nodes: Iterable[str] | None = None) -> list[NodeChange]:
        wanted = self.nodes if nodes is None else frozenset(nodes)
        with self._lock:
            return [c for c in self.changes if c.at >= moment and c.node in wanted]

    def states_walked(self, node: str, since: float) -> list[str]:
        """The upgrade states ``node`` went through after ``since``, in order, repeats folded."""
        walked: list[str] = []
        for change in self.since(since, [node]):
            if not walked or walked[-1] != change.state:
                walked.append(change.state)
        return walked

    def most_upgrading(self, nodes: Iterable[str], since: float) -> tuple[int, list[str]]:
        """The most of ``nodes`` upgrading at once after ``since`` (in a state the library counts as in
        progress), and the instant's node list, replaying every change in order."""
        wanted = frozenset(nodes)
        with self._lock:
            before = [c for c in self.changes if c.at < since and c.node in wanted]
            after = [c for c in self.changes if c.at >= since and c.node in wanted]
        current: dict[str, str] = {}
        for change in before:
            current[change.node] = change.state
        best: tuple[int, list[str]] = (0, [])
        for change in after:
            current[change.node] = change.state
            upgrading = sorted(n for n, s in current.items() if s not in NOT_UPGRADING)
            if len(upgrading) > best[0]:
                best = (len(upgrading), upgrading)
        return best

    def timeline(self, since: float, nodes: Iterable[str] | None = None) -> str:
        return "\n".join(f"  +{c.at - since:6.2f}s {c.node}: {c.state or '(none)'}"
                         f"{' cordoned' if c.unschedulable else ''} owner={c.owner or '-'}"
                         for c in self.since(since, nodes))


# --- the workload an upgrade must drain ----------------------------------------------------------

WORKLOAD = "gpu-training"


def start_gpu_workload(api: client.ApiClient, node_selector: Obj, *, explain: Callable[[], str],
                       namespace_labels: Obj | None = None) -> str:
    """Two GPU training pods on the nodes ``node_selector`` picks (a Deployment, a PDB of minAvailable 1,
    an emptyDir scratch volume, which pod deletion refuses, and a 2 s grace period) in a namespace of
    their own; returns the namespace once both pods are Ready.

    Why shared: the operator's upgrade (test_driver_upgrades) and the Argo CD rollout (test_argocd)
    must drain the same kind of workload, the one NVIDIA's upgrade library has to wait for.
    """
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    namespace = f"train-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": namespace, "labels": dict(namespace_labels or {})}})
    wait_until(lambda: has_default_account(core, namespace), timeout=30, what="the default ServiceAccount")
    labels = {"app": WORKLOAD}
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": WORKLOAD},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"nodeSelector": dict(node_selector),
                     "terminationGracePeriodSeconds": 2,
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "volumes": [{"name": "scratch", "emptyDir": {}}],
                     "containers": [{"name": "train", "image": "registry.example/train:1",
                                     "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(namespace, {
        "metadata": {"name": WORKLOAD}, "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}})
    wait_until(lambda: len(ready_workload_pods(api, namespace)) == 2, timeout=60,
               what="the GPU training pods Ready", explain=explain)
    return namespace


def ready_workload_pods(api: client.ApiClient, namespace: str) -> dict[str, str]:
    """uid -> node of the workload's Ready, not Terminating pods."""
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"app={WORKLOAD}").items
    return {p.metadata.uid: p.spec.node_name for p in pods if not p.metadata.deletion_timestamp
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])}
