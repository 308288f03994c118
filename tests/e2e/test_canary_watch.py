"""``gpugate stack canary --watch`` in a real Argo CD with NVIDIA's upgrade library: every failure mode
rolled back by its own commit, the healthy canary promoted, nothing outside the canary pools moved.

One rig for the module (``canary_rig``: its own control plane, Argo CD v3.2.11, gpu-upgrade-controller
built from k8s-operator-libs, the operator stand-in, Prometheus scraping a DCGM exporter, two
leader-elected controller replicas). One commit moves all nine canary pools to a new driver; each
pool's node then fails in its own way (or not), so the decisions come in parallel. A thread refreshes
Argo CD after every push to the fork, as the Git webhook of a real setup does.

What each test asserts, and what it cost, is printed at the end of the module (the decision times).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e import argocd_harness as harness
from tests.e2e.argocd_env import healthy, rig_binaries
from tests.e2e.argocd_gitops import git
from tests.e2e.argocd_standin import DRIVER_VERSION_LABEL, STATE_LABEL
from tests.e2e.argocd_upgrades import start_gpu_workload
from tests.e2e.canary_rig import INTERVAL, LIMITS, LONG_JOB, MODES, NEW, OLD, SOAK, CanaryRig
from tests.e2e.local import own_control_plane
from tests.e2e.waiting import wait_until
from tests.prerequisites import missing

pytestmark = pytest.mark.e2e
DECISION_ALLOWANCE = 30.0
"""Seconds a decision may take beyond one look interval after its signal, to the pushed commit: a look
at nine pools, then each decision's commit (rendered and validated twice, as every stack commit is)
and push, one after another when several pools fail in the same seconds, on a shared two-core
machine. The measured delays are printed; docs/stack.md gives them."""
ROLLBACK_MODES = {pool: mode for pool, mode in MODES.items() if mode}


@dataclass
class Run:
    """What the module's one rollout produced, for the tests to judge."""

    rollout: str = ""
    pushed_at: float = 0.0
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """pool -> {sha, at, decision, mode, body}"""
    signals: dict[str, float] = field(default_factory=dict)
    health_messages: dict[str, set[str]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def rig() -> Iterator[CanaryRig]:
    found = rig_binaries()
    if shutil.which("prometheus") is None:
        missing("prometheus is not on PATH (Debian's prometheus package)")
    cidr = f"127.{secrets.randbelow(180) + 64}.{secrets.randbelow(256)}.0/24"
    workdir = Path(tempfile.mkdtemp(prefix="gpugate-canary-"))
    with own_control_plane("the canary rig needs a control plane of its own", service_cidr=cidr) as cluster:
        started = CanaryRig(cluster, workdir, found)
        try:
            started.start()
            yield started
        finally:
            started.stop()
            print(f"\ncanary rig: start steps {started.timings} s; kept in {workdir}", file=sys.stderr)
            if not os.environ.get("GPUGATE_E2E_KEEP"):
                shutil.rmtree(workdir, ignore_errors=True)


def _decisions(rig: CanaryRig, rollout: str) -> dict[str, dict[str, Any]]:
    """pool -> its decision on ``rollout``: the commit that carries it (trailer ``Gpugate-Canary``)."""
    assert rig.fork is not None
    out = git(rig.fork.path, "log", "-n50",
              "--format=%H%x1f%ct%x1f%(trailers:key=Gpugate-Canary,valueonly,separator=%x1d)%x1f%B%x1e")
    found = {}
    for record in out.split("\x1e"):
        parts = record.strip("\n").split("\x1f")
        if len(parts) < 4:
            continue
        sha, when, values, body = parts
        for value in values.split("\x1d"):
            fields = value.split()
            if len(fields) >= 3 and fields[1] == rollout:
                found[fields[0]] = {"sha": sha, "at": float(when), "body": body, "decision": fields[2],
                                    "mode": fields[3] if len(fields) > 3 else ""}
    return found


def _refresh_on_push(rig: CanaryRig, stop: threading.Event) -> None:
    """Argo CD's Git webhook: a refresh of the Application each time the fork's branch moves."""
    assert rig.fork is not None
    last = rig.fork.head()
    while not stop.wait(0.5):
        head = rig.fork.head()
        if head != last:
            last = head
            harness.refresh(rig.custom, "gpu-operator")


def _node(rig: CanaryRig, pool: str) -> str:
    [name] = rig.pool(pool)
    return name


def _entered(rig: CanaryRig, node: str, state: str, after: float) -> float | None:
    """Wall time the node's upgrade state became ``state`` after ``after`` (wall), from the history."""
    assert rig.history is not None
    offset = time.time() - time.monotonic()
    return next((c.at + offset for c in rig.history.since(after - offset, [node]) if c.state == state), None)


def _break_validator(rig: CanaryRig, core: client.CoreV1Api) -> None:
    """The validator of the validation-timeout canary node stops validating (its pod, re-made by the
    DaemonSet, never turns Ready), from the rollout on: the library's validation step waits on it."""
    rig.faults.validator_broken = True
    unvalid = _node(rig, "canary-unvalid")
    for pod in core.list_namespaced_pod("gpu-operator", label_selector="app=nvidia-operator-validator").items:
        if pod.spec.node_name == unvalid:
            core.delete_namespaced_pod(pod.metadata.name, "gpu-operator", grace_period_seconds=0)


def _note_new_driver_pod(rig: CanaryRig, run: Run, core: client.CoreV1Api) -> None:
    """When the never-loading driver pod was made (it is gone once the rollback replaced it)."""
    if "noload" in run.signals:
        return
    node = _node(rig, "canary-noload")
    drivers = core.list_namespaced_pod("gpu-operator", label_selector="app.kubernetes.io/component=nvidia-driver")
    for pod in drivers.items:
        if pod.spec.node_name == node and any(f":{NEW}-" in c.image for c in pod.spec.containers):
            run.signals["noload"] = pod.metadata.creation_timestamp.timestamp()


def _inject(rig: CanaryRig, run: Run, core: client.CoreV1Api) -> None:
    """An XID on the canary-xid node's GPUs once it runs the new driver, as the driver would log it."""
    _note_new_driver_pod(rig, run, core)
    labels = core.read_node(_node(rig, "canary-xid")).metadata.labels or {}
    if "xid" not in run.signals and labels.get(STATE_LABEL) == "upgrade-done" and \
            labels.get(DRIVER_VERSION_LABEL) == NEW:
        rig.show_xids(79)
        run.signals["xid"] = time.time() + 1.0  # the next scrape (every second) carries it


def _record_health(rig: CanaryRig, run: Run) -> None:
    assert rig.argocd is not None
    try:
        tree = rig.argocd.api_json("/api/v1/applications/gpu-operator/resource-tree")
    except Exception:
        return
    for node in tree.get("nodes") or []:
        if node.get("kind") == "NVIDIADriver":
            message = str((node.get("health") or {}).get("message") or "")
            run.health_messages.setdefault(node["name"], set()).add(message)


@pytest.fixture(scope="module")
def run(rig: CanaryRig) -> Run:
    """First install of the gpu-operator Application, workloads, the controllers, one rollout commit
    moving every canary pool to the new driver, and every pool's decision."""
    result = Run()
    core = client.CoreV1Api(rig.api)
    rig.bootstrap_operator()
    rig.wait(lambda s: healthy(s, ("gpu-operator",)), "gpu-operator Synced and Healthy", timeout=300, stall=120)
    wait_until(lambda: all(n["state"] == "upgrade-done" and n["driver"] == OLD and n["ready"]
                           for n in rig.standin.snapshot().values()), timeout=180,
               what="every node upgrade-done at the old driver", explain=rig.explain)
    rig.timings["install"] = round(time.monotonic() - rig._last, 1)
    assert rig.sampler is not None and rig.standin is not None
    rig.sampler.workload_namespace = _baseline_workload(rig)
    _consumer_and_long_job(rig, core)
    rig.start_controllers()
    stop = threading.Event()
    threading.Thread(target=_refresh_on_push, args=(rig, stop), daemon=True).start()
    try:
        result.rollout = _rollout_commit(rig)
        result.pushed_at = time.time()
        _break_validator(rig, core)
        core.patch_node(_node(rig, "canary-mig"), {"metadata": {"labels": {"nvidia.com/mig.config.state": "pending"}}})
        result.signals["mig"] = time.time()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(result.decisions) < len(MODES):
            _inject(rig, result, core)
            _record_health(rig, result)
            result.decisions = _decisions(rig, result.rollout)
            time.sleep(0.5)
        for _ in range(20):  # the rollbacks syncing: Argo CD's health message says so
            _record_health(rig, result)
            time.sleep(0.5)
        result.notes["after"] = _decisions(rig, result.rollout)
    finally:
        stop.set()
    assert len(result.decisions) == len(MODES), (f"decided {sorted(result.decisions)} of {sorted(MODES)}\n"
                                                 + rig.explain())
    return result


def _baseline_workload(rig: CanaryRig) -> str:
    """The baseline pool's GPU workload (two pods, a PDB): what a canary must never evict."""
    core = client.CoreV1Api(rig.api)
    for name in rig.pool("default"):
        core.patch_node(name, {"metadata": {"labels": {"e2e.gpugate.io/baseline": "true"}}})
    return start_gpu_workload(rig.api, {"e2e.gpugate.io/baseline": "true"}, explain=rig.explain)


def _consumer_and_long_job(rig: CanaryRig, core: client.CoreV1Api) -> None:
    """A pod holding the driver on the pinned canary node (no GPU request: the upgrade never frees it),
    and a long job on the stuck canary node that its pool's upgrade policy waits for."""
    core.create_namespace({"metadata": {"name": "ops"}})
    tolerations = [{"operator": "Exists"}]
    core.create_namespaced_pod("ops", {"metadata": {"name": "gpu-probe-0"}, "spec": {
        "nodeName": _node(rig, "canary-pinned"), "tolerations": tolerations,
        "volumes": [{"name": "nvidia0", "hostPath": {"path": "/dev/nvidia0"}}],
        "containers": [{"name": "probe", "image": "registry.example/gpu-probe:2",
                        "securityContext": {"privileged": True},
                        "volumeMounts": [{"name": "nvidia0", "mountPath": "/dev/nvidia0"}]}]}})
    core.create_namespaced_pod("ops", {"metadata": {"name": "long-job-0", "labels": dict(LONG_JOB)}, "spec": {
        "nodeName": _node(rig, "canary-stuck"), "tolerations": tolerations,
        "containers": [{"name": "job", "image": "registry.example/long-job:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})


def _rollout_commit(rig: CanaryRig) -> str:
    """Every canary pool to the new driver, one hand edit committed by ``gpugate stack sync``."""
    assert rig.fork is not None
    path = rig.fork.path / "manifests" / "gpu-operator" / "stack.yaml"
    stack = yaml.safe_load(path.read_text())
    for pool in stack["pools"]:
        if pool["name"] in MODES:
            pool["driver"] = NEW
    path.write_text(yaml.safe_dump(stack, sort_keys=False))
    rig.fork.stack("sync")
    return rig.fork.head()


# --- the failure modes ----------------------------------------------------------------------------

def signal_of(rig: CanaryRig, run: Run, pool: str) -> float:
    """When the pool's failure became a fact, as the test saw it (not as the controller says)."""
    node, limits = _node(rig, pool), {k: float(v) for k, v in LIMITS.items()}
    mode = MODES[pool]
    if mode == "upgrade-failed":
        return _entered(rig, node, "upgrade-failed", run.pushed_at) or 0.0
    if mode == "gpu-consumer":
        return (_entered(rig, node, "pod-restart-required", run.pushed_at) or 0.0) + 0.5
    if mode == "driver-not-ready":
        return run.signals["noload"] + limits["driverReadySeconds"]
    if mode == "validation-timeout":
        return (_entered(rig, node, "validation-required", run.pushed_at) or 0.0) + limits["validationSeconds"]
    if mode == "stuck-state":
        return (_entered(rig, node, "wait-for-jobs-required", run.pushed_at) or 0.0) + limits["stuckSeconds"]
    if mode == "mig-pending":
        return run.signals["mig"] + limits["migPendingSeconds"]
    if mode == "xid-rate":
        return run.signals["xid"]
    jobs = client.BatchV1Api(rig.api).list_namespaced_job("gpu-operator",
                                                          label_selector=f"gpugate.io/canary-pool={pool}")
    failed = [c.last_transition_time.timestamp() for j in jobs.items for c in j.status.conditions or []
              if c.type == "Failed" and c.status == "True"]
    return min(failed)


EVIDENCE = {
    "upgrade-failed": "went upgrade-failed",
    "gpu-consumer": "pod ops/gpu-probe-0",
    "driver-not-ready": "not Ready",
    "validation-timeout": "in validation-required",
    "stuck-state": "in wait-for-jobs-required",
    "mig-pending": "nvidia.com/mig.config.state=pending",
    "xid-rate": "new XID error(s) on 1 canary node(s)",
    "dcgm-diagnostic": "exit code 1",
}


@pytest.mark.parametrize("pool", sorted(ROLLBACK_MODES), ids=[ROLLBACK_MODES[p] for p in sorted(ROLLBACK_MODES)])
def test_each_failure_mode_rolls_its_canary_back_by_one_commit_in_time(rig: CanaryRig, run: Run, pool: str) -> None:
    decision = run.decisions[pool]
    mode = ROLLBACK_MODES[pool]
    assert (decision["decision"], decision["mode"]) == ("rollback", mode), decision
    assert f"canary pool {pool}, rollout {run.rollout[:12]} ({OLD} -> {NEW}): failure mode: {mode}" in \
        decision["body"], decision["body"]
    assert any(line.startswith(f"  evidence ({pool}):") and EVIDENCE[mode] in line
               for line in decision["body"].splitlines()), decision["body"]
    assert decision["body"].startswith("gpugate stack: rollback ") and f"{pool} driver {NEW} -> {OLD}" in \
        decision["body"] or f"{pool} ({mode})" in decision["body"].splitlines()[0]
    signal = signal_of(rig, run, pool)
    delay = decision["at"] - signal
    run.notes.setdefault("delays", {})[mode] = round(delay, 1)
    assert delay <= INTERVAL + DECISION_ALLOWANCE, f"{mode}: decided {delay:.1f}s after the signal"
    assert delay >= -1.5, f"{mode}: decided {-delay:.1f}s before the signal the test saw (a false call?)"
    stack = yaml.safe_load(git(rig.fork.path, "show", f"{decision['sha']}:manifests/gpu-operator/stack.yaml"))
    drivers = {p["name"]: p["driver"] for p in stack["pools"]}
    assert drivers[pool] == OLD and drivers["default"] == OLD
    events = client.CoreV1Api(rig.api).list_namespaced_event("default", field_selector="reason=CanaryRollback")
    assert any(e.involved_object.name == pool and mode in e.message for e in events.items)


def test_the_healthy_canary_is_promoted_after_its_diagnostic_and_the_soak(rig: CanaryRig, run: Run) -> None:
    decision = run.decisions["canary-ok"]
    assert decision["decision"] == "promote", decision
    assert decision["body"].startswith(f"gpugate stack: promote driver {NEW} from pool canary-ok to pool fleet")
    assert "DCGM diagnostics passed" in decision["body"]
    done = _entered(rig, _node(rig, "canary-ok"), "upgrade-done", run.pushed_at)
    assert done is not None and decision["at"] >= done + SOAK - 1, "promoted before the soak"
    jobs = client.BatchV1Api(rig.api).list_namespaced_job("gpu-operator",
                                                          label_selector="gpugate.io/canary-pool=canary-ok")
    # Kubernetes 1.37 writes SuccessCriteriaMet before Complete (the Job success policy)
    assert "Complete" in [c.type for j in jobs.items for c in j.status.conditions or [] if c.status == "True"]


def test_nothing_outside_the_canary_pools_moved_and_no_gpu_pod_there_was_evicted(rig: CanaryRig, run: Run) -> None:
    assert rig.sampler is not None
    samples = [s for s in rig.sampler.samples if s.at >= run.pushed_at]
    promoted = run.decisions["canary-ok"]["at"]
    assert len(samples) >= (max(d["at"] for d in run.decisions.values()) - run.pushed_at) * 0.8, "sampled each second"
    baseline = rig.pool("default")
    for sample in samples:
        for node in baseline:
            assert sample.nodes[node] == (OLD, "upgrade-done", False), (sample.at - run.pushed_at, node,
                                                                          sample.nodes[node])
        if sample.at < promoted:
            assert sample.nodes[_node(rig, "fleet")][:2] == (OLD, "upgrade-done")
    workloads = {s.workload for s in samples}
    assert len(workloads) == 1 and len(next(iter(workloads))) == 2, "the baseline's GPU pods were never replaced"


def test_each_rollout_is_decided_once_by_the_leader_and_argo_cd_says_so(rig: CanaryRig, run: Run) -> None:
    time.sleep(3 * INTERVAL)  # the controllers keep looking after every pool is decided
    assert _decisions(rig, run.rollout) == run.decisions
    assert all(c.running() for c in rig.controllers), rig.controller_logs()
    logs = "".join((rig.workdir / f"{c.name}.log").read_text() for c in rig.controllers)
    committed = logs.count(" by commit ")
    assert committed == len(MODES), f"{committed} decisions logged for {len(MODES)} pools:\n{rig.controller_logs()}"
    leases = client.CoordinationV1Api(rig.api).list_namespaced_lease("default").items
    assert [lease.metadata.name for lease in leases if lease.metadata.name == "gpugate-canary"] == ["gpugate-canary"]
    saw = {pool: messages for pool, messages in run.health_messages.items() if pool in ROLLBACK_MODES}
    assert any("canary rollback" in m for messages in saw.values() for m in messages), saw
    print(f"\ncanary decisions, seconds after the signal: {run.notes.get('delays')}", file=sys.stderr)
