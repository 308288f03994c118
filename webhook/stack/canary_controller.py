"""``gpugate stack canary --watch``: the canary controller that acts by itself, in the cluster.

One replica leads (a ``coordination.k8s.io`` Lease, ``webhook.lease``) and asks ``is_leader()`` right
before every write. Every ``intervalSeconds`` it brings its clone of the GitOps repository to the
remote's head, finds each canary pool's rollout (``canarygit``), skips one decided already (Git is
the record, so a restart or a new leader never acts twice), looks at the pool (``canary_observe``)
and lets ``canarymodes.decide`` judge it. A decision is a commit pushed to the branch Argo CD
follows (never forced), an Event on the pool's NVIDIADriver, metrics, annotations on the
NVIDIADriver that its Argo CD health check reads, and a log line; ``gpugate stack status`` lists
the decisions from Git.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from webhook import kubeclient
from webhook.errors import GpugateError
from webhook.kube.yamlload import fast_load
from webhook.lease import LeaderElector, LeaseSettings
from webhook.stack import canary_observe, canary_watch, canarygit, canarymetrics, manifests
from webhook.stack.canary import Analysis
from webhook.stack.canarymodes import CanaryDecision, Memory, Rollout, decide

log = logging.getLogger("gpugate.stack.canary")
ANNOTATION = "gpugate.io/canary-"
"""Prefix of the NVIDIADriver annotations the Argo CD health check reads (decision, mode, versions)."""
EVENT_SOURCE = "gpugate-canary"


@dataclass
class ControllerSettings:
    where: canarygit.Where
    eyes: canary_observe.Eyes
    events_namespace: str = "default"
    """Events about a cluster-scoped NVIDIADriver go to ``default``, as client-go records them."""
    lease: LeaseSettings | None = None
    """None: act as the only writer (one replica, a test)."""
    analysis_file: Path | None = None
    push_attempts: int = canarygit.PUSH_ATTEMPTS


@dataclass
class PoolState:
    rollout: Rollout | None = None
    memory: Memory = field(default_factory=Memory)
    gave_up: bool = False
    last: str = ""


class CanaryController:
    """Follows every canary pool of canary.yaml until ``stop`` is set."""

    def __init__(self, settings: ControllerSettings, *, wall: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.wall = wall
        self.pools: dict[str, PoolState] = {}
        self.elector = (LeaderElector(settings.eyes.api, settings.lease, on_change=canarymetrics.LEADER.set)
                        if settings.lease is not None else None)
        self.core = client.CoreV1Api(settings.eyes.api)
        self.custom = client.CustomObjectsApi(settings.eyes.api)

    def leading(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def run(self, stop: threading.Event) -> None:
        if self.elector is not None:
            threading.Thread(target=self.elector.run, args=(stop,), name="canary-lease", daemon=True).start()
        interval = 5.0
        while not stop.is_set():
            started = time.monotonic()
            try:
                if self.leading():
                    interval = self.round()
            except Exception as err:  # one bad round must not end the controller; the next one retries
                canarymetrics.ERRORS.inc()
                log.warning("canary round failed", extra={"fields": {"error": kubeclient.failure(err)}})
            stop.wait(max(0.0, interval - (time.monotonic() - started)))
        if self.elector is not None:
            self.elector.release()

    def round(self) -> float:
        """One look at every canary pool; returns the interval canary.yaml asks for."""
        where = self.settings.where
        where.repo.sync_to_remote(where.remote, where.branch)
        stack = manifests.load_stack(where.repo.root)
        analysis = canary_watch.load_analysis(where.repo.root, stack, pool=None, path=self.settings.analysis_file)
        values = fast_load((where.repo.root / manifests.VALUES_FILE).read_text(encoding="utf-8"))
        decided = canarygit.decisions(where.repo)
        seen: canary_observe.Seen | None = None
        due: list[tuple[CanaryDecision, Rollout, PoolState]] = []
        for pool, rollout in canarygit.rollouts(where.repo, analysis.pools).items():
            state = self.pools.setdefault(pool, PoolState())
            if rollout is None or (state.rollout is not None and state.rollout.commit != rollout.commit):
                state.memory, state.gave_up = Memory(), False
            state.rollout = rollout
            if rollout is None:
                canarymetrics.state(pool, "idle")
                continue
            if (pool, rollout.commit) in decided or state.gave_up:
                canarymetrics.state(pool, "decided" if (pool, rollout.commit) in decided else "gave-up")
                continue
            seen = seen or canary_observe.gather(self.settings.eyes, stack, analysis)
            decision = self.judge(analysis, stack, rollout, state, values, seen)
            if decision.action in ("promote", "rollback"):
                due.append((decision, rollout, state))
        # Every pool judged on one read; then one commit for all the rollbacks, one per promotion.
        rollbacks = [(r, d) for d, r, _ in due if d.action == "rollback"]
        batches = ([rollbacks] if rollbacks else []) + [[(r, d)] for d, r, _ in due if d.action == "promote"]
        states = {r.pool: s for _, r, s in due}
        for batch in batches:
            if self.leading():
                self.act(analysis, batch, states)
        return analysis.interval_seconds

    def judge(self, analysis: Analysis, stack: Any, rollout: Rollout, state: PoolState, values: Any,
              seen: canary_observe.Seen) -> CanaryDecision:
        look = canary_observe.look(self.settings.eyes, seen, stack, analysis, rollout, values, now=self.wall())
        decision = decide(analysis, rollout, state.memory, look)
        state.memory = decision.memory
        canarymetrics.state(rollout.pool, "watching")
        summary = f"{decision.action}: {'; '.join(decision.evidence)}"
        if summary != state.last:
            log.info(f"canary {rollout.pool} at {rollout.to_driver}: {summary}")
            state.last = summary
        if decision.diagnose and self.leading():
            self.start_diagnostics(analysis, rollout, [n.name for n in look.nodes if n.name not in look.diagnoses])
        return decision

    def act(self, analysis: Analysis, batch: list[canarygit.Due], states: dict[str, PoolState]) -> None:
        pools = ", ".join(r.pool for r, _ in batch)

        def refused(attempt: int, why: str) -> None:
            for rollout, _ in batch:
                canarymetrics.PUSH_REFUSED.labels(pool=rollout.pool).inc()
            log.warning(f"canary {pools}: push {attempt} refused, redoing it on the new head: {why}")

        try:
            sha, decided = canarygit.commit_and_push(self.settings.where, analysis, batch,
                                                     attempts=self.settings.push_attempts, on_refused=refused)
        except canarygit.GaveUp as err:
            log.error(str(err))
            for rollout, _ in batch:
                states[rollout.pool].gave_up = True
                canarymetrics.GAVE_UP.labels(pool=rollout.pool).inc()
                self.event(rollout, "Warning", "CanaryPushRefused", str(err))
            return
        except GpugateError as err:
            log.info(f"canary {pools}: {err}")
            return
        for rollout, decision in decided:
            self.report(rollout, decision, sha)

    def report(self, rollout: Rollout, decision: CanaryDecision, sha: str) -> None:
        """A pushed decision as an Event, metrics, a log line and the NVIDIADriver's annotations."""
        delay = self.wall() - (decision.signal_at if decision.signal_at is not None else self.wall())
        canarymetrics.decided(rollout.pool, decision.action, decision.mode, delay)
        moved = (f"{rollout.to_driver} -> {rollout.from_driver}" if decision.action == "rollback"
                 else f"{rollout.to_driver} from pool {rollout.pool}")
        message = (f"{decision.action} {moved} by commit {sha[:12]}"
                   + (f" ({decision.mode})" if decision.mode else "") + ": " + "; ".join(decision.evidence))
        log.info(f"canary {rollout.pool}: {message} ({delay:.1f}s after the signal)")
        self.event(rollout, "Warning" if decision.action == "rollback" else "Normal",
                   "CanaryRollback" if decision.action == "rollback" else "CanaryPromote", message)
        self.annotate(rollout, decision, sha)

    def event(self, rollout: Rollout, kind: str, reason: str, message: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        name = f"{rollout.pool}.{rollout.commit[:12]}.{int(self.wall() * 1000):x}"
        body = {"metadata": {"name": name, "namespace": self.settings.events_namespace},
                "involvedObject": {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
                                   "name": rollout.pool},
                "reason": reason, "message": message[:1024], "type": kind, "source": {"component": EVENT_SOURCE},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self.core.create_namespaced_event(self.settings.events_namespace, kubeclient.body(body))
        except Exception as err:  # the commit is made; an Event is a report of it
            log.warning("canary event not written", extra={"fields": {"error": kubeclient.failure(err)}})

    def annotate(self, rollout: Rollout, decision: CanaryDecision, sha: str) -> None:
        """What the NVIDIADriver's Argo CD health check says while the decision rolls out."""
        annotations = {ANNOTATION + "decision": decision.action, ANNOTATION + "mode": decision.mode or None,
                       ANNOTATION + "rollout-version": rollout.to_driver,
                       ANNOTATION + "rollback-to": rollout.from_driver if decision.action == "rollback" else None,
                       ANNOTATION + "evidence": (decision.evidence[0][:240] if decision.evidence else None),
                       ANNOTATION + "commit": sha}
        try:
            self.custom.patch_cluster_custom_object("nvidia.com", "v1alpha1", "nvidiadrivers", rollout.pool,
                                                    {"metadata": {"annotations": annotations}})
        except Exception as err:
            log.warning("canary annotation not written", extra={"fields": {"error": kubeclient.failure(err)}})

    def start_diagnostics(self, analysis: Analysis, rollout: Rollout, nodes: list[str]) -> None:
        spec = analysis.diagnostics
        assert spec is not None
        batch = client.BatchV1Api(self.settings.eyes.api)
        for node in nodes:
            job = diagnostic_job(spec.image, spec.level, spec.timeout_seconds, rollout, node)
            try:
                batch.create_namespaced_job(spec.namespace, kubeclient.body(job))
                log.info(f"canary {rollout.pool}: DCGM diagnostic {job['metadata']['name']} started on {node}")
            except client.exceptions.ApiException as err:
                if err.status != 409:
                    raise


def diagnostic_job(image: str, level: int, timeout: float, rollout: Rollout, node: str) -> dict[str, Any]:
    """``dcgmi diag -r <level>`` pinned to ``node``, privileged with every GPU (it tests the GPUs, not
    a share of them), never retried: one failure is the answer."""
    import hashlib

    suffix = hashlib.sha256(node.encode()).hexdigest()[:8]
    labels = {canary_observe.ROLLOUT_LABEL: rollout.commit[:12], canary_observe.NODE_LABEL: node,
              "gpugate.io/canary-pool": rollout.pool, "app.kubernetes.io/name": "gpugate-dcgm-diag"}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"dcgm-diag-{rollout.commit[:8]}-{suffix}", "labels": labels},
            "spec": {"backoffLimit": 0, "activeDeadlineSeconds": int(timeout), "ttlSecondsAfterFinished": 86400,
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"nodeName": node, "restartPolicy": "Never", "runtimeClassName": "nvidia",
                                           "tolerations": [{"operator": "Exists"}],
                                           "containers": [{"name": "diag", "image": image,
                                                           "command": ["dcgmi", "diag", "-r", str(level)],
                                                           "env": [{"name": "NVIDIA_VISIBLE_DEVICES",
                                                                    "value": "all"}],
                                                           "securityContext": {"privileged": True}}]}}}}
