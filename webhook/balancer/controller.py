"""The balancer's loop: informers fill the state, a pass turns dirty nodes into patches.

Threads: one informer per resource (nodes, pods), the lease elector, the Prometheus poller,
the health server, and the loop in :meth:`Balancer.run`, which alone decides and writes. Every
replica runs all of them, so a standby's caches are warm; only the lease holder patches.
Hysteresis needs the previous tier: that is the node's own ``gpugate.io/gpu-load`` label, so a
new leader continues exactly where the old one stopped.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.balancer import marks as marks_mod
from webhook.balancer.backoff import Backoff
from webhook.balancer.cluster import Informer, NodeWriter
from webhook.balancer.health import HealthServer
from webhook.balancer.lease import LeaderElector
from webhook.balancer.metrics import Metrics
from webhook.balancer.prometheus import PrometheusClient, PrometheusError
from webhook.balancer.settings import BalancerSettings, parse_bind
from webhook.balancer.state import ClusterState, NodeInfo, PodUsage, node_info, pod_key, pod_usage
from webhook.errors import GpugateError

log = logging.getLogger("gpugate.balancer")

LIVENESS_SECONDS = 60.0  # a loop silent this long is stuck: /healthz turns 503 and the kubelet restarts us


class Balancer:
    """One replica of the node-load balancer; :meth:`run` blocks until ``stop`` is set."""

    def __init__(self, settings: BalancerSettings, *, client_factory: Callable[[], client.ApiClient],
                 metrics: Metrics | None = None, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic, serve_health: bool = False) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.state = ClusterState()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._rng = rng or random.Random()
        self._clock = clock
        self._tiers: dict[str, str] = {}
        self._util: dict[str, float] = {}
        self._util_at: float | None = None
        self._util_usable = False
        self._force_full = True
        self._dry_logged: dict[str, str] = {}
        self._heartbeat = clock()
        self.stop_event = threading.Event()
        self.health: HealthServer | None = None
        self._serve_health = serve_health

        self.nodes = Informer[NodeInfo](
            name="nodes", list_call=client.CoreV1Api(client_factory()).list_node,
            reduce=lambda obj: (obj["metadata"]["name"], node_info(obj)),
            on_replace=self._replace_nodes, on_event=self._node_event, **self._informer_args())
        self.pods = Informer[PodUsage | None](
            name="pods", list_call=client.CoreV1Api(client_factory()).list_pod_for_all_namespaces,
            reduce=lambda obj: (pod_key(obj), pod_usage(obj)),
            on_replace=self._replace_pods, on_event=self._pod_event, **self._informer_args())
        self._writer = NodeWriter(client_factory())
        self.elector: LeaderElector | None = None
        if settings.lease.enabled and not settings.dry_run:
            self.elector = LeaderElector(client_factory(), settings.lease, clock=clock,
                                         on_change=self._leader_changed, on_error=self._api_error)
        self._prometheus = None
        if settings.prometheus.url:
            self._prometheus = PrometheusClient(settings.prometheus.url, window=settings.prometheus.window,
                                                timeout=settings.prometheus.timeout)

    def _informer_args(self) -> dict[str, Any]:
        s = self.settings
        return {"page_size": s.page_size, "watch_timeout": s.watch_timeout,
                "backoff": Backoff(s.backoff_initial, s.backoff_max, random.Random(self._rng.random())),
                "on_error": self._api_error, "on_relist": lambda name: self.metrics.relists.labels(name).inc()}

    # ---- informer callbacks (informer threads) --------------------------------------------------
    def _replace_nodes(self, infos: dict[str, NodeInfo]) -> None:
        with self._lock:
            self.state.replace_nodes(infos)
            self._tiers = {k: v for k, v in self._tiers.items() if k in infos}
        self._wake.set()

    def _node_event(self, etype: str, name: str, info: NodeInfo | None) -> None:
        with self._lock:
            if info is None:
                self.state.delete_node(name)
                self._tiers.pop(name, None)
                self._dry_logged.pop(name, None)
            else:
                self.state.set_node(info)
        self.metrics.watch_events.labels("nodes").inc()
        self._wake.set()

    def _replace_pods(self, usages: dict[str, PodUsage | None]) -> None:
        held = {k: v for k, v in usages.items() if v is not None}
        with self._lock:
            self.state.replace_pods(held)
        self._wake.set()

    def _pod_event(self, etype: str, key: str, usage: PodUsage | None) -> None:
        with self._lock:
            self.state.set_pod(key, usage)
            wake = bool(self.state.dirty)
        self.metrics.watch_events.labels("pods").inc()
        if wake:
            self._wake.set()

    def _api_error(self, operation: str, err: BaseException) -> None:
        self.metrics.api_errors.labels(operation).inc()

    def _leader_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if leading:
            self._force_full = True
            self._wake.set()

    # ---- status ------------------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        return self.nodes.synced.is_set() and self.pods.synced.is_set()

    def writes(self) -> bool:
        """True when this replica may patch nodes now."""
        if self.settings.dry_run:
            return False
        return self.elector is None or self.elector.is_leader()

    def status(self) -> dict[str, Any]:
        alive = self._clock() - self._heartbeat < LIVENESS_SECONDS
        return {"ok": alive, "synced": self.synced, "leader": self.writes(),
                "seconds_since_full_sync": round(self.metrics.seconds_since_full_sync(), 3),
                "allocation_only": not self._util_usable}

    def tiers(self) -> dict[str, str]:
        with self._lock:
            return dict(self._tiers)

    def stop(self) -> None:
        """Ask :meth:`run` to finish (release the lease, stop the threads) as soon as it can."""
        self.stop_event.set()
        self._wake.set()

    # ---- main loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        """Run until ``stop`` (or :attr:`stop_event`) is set; release the lease on the way out."""
        stop = stop or self.stop_event
        self.stop_event = stop
        if self._serve_health:
            host, port = parse_bind(self.settings.health_bind)
            try:
                self.health = HealthServer(host, port, metrics=self.metrics, status=self.status).start()
            except OSError as err:
                raise GpugateError(f"cannot serve /healthz and /metrics on {self.settings.health_bind}: "
                                   f"{err.strerror or err}; pick another --health-bind") from err
        self.metrics.leader.set(0)
        threads = [threading.Thread(target=self.nodes.run, args=(stop,), name="informer-nodes", daemon=True),
                   threading.Thread(target=self.pods.run, args=(stop,), name="informer-pods", daemon=True)]
        if self.elector is not None:
            threads.append(threading.Thread(target=self.elector.run, args=(stop,), name="lease", daemon=True))
        else:
            self.metrics.leader.set(0 if self.settings.dry_run else 1)
        if self._prometheus is not None:
            threads.append(threading.Thread(target=self._poll_prometheus, args=(stop,), name="prometheus",
                                            daemon=True))
        for thread in threads:
            thread.start()
        log.info("balancer started", extra={"fields": {
            "dry_run": self.settings.dry_run, "prometheus": self.settings.prometheus.url,
            "lease": None if self.elector is None else f"{self.settings.lease.namespace}/{self.settings.lease.name}",
            "identity": self.settings.lease.identity}})
        pool = ThreadPoolExecutor(self.settings.write_concurrency, thread_name_prefix="patch")
        backoff = Backoff(self.settings.backoff_initial, self.settings.backoff_max, random.Random(self._rng.random()))
        last_full: float | None = None
        try:
            while not stop.is_set():
                self._wake.wait(min(1.0, self.settings.resync_interval))
                self._wake.clear()
                self._heartbeat = self._clock()
                if stop.is_set() or not self.synced:
                    continue
                now = self._clock()
                full = self._force_full or last_full is None or now - last_full >= self.settings.resync_interval
                try:
                    ok = self.reconcile(pool, full=full)
                except Exception:
                    log.exception("reconcile pass failed")
                    ok = False
                if full and ok:
                    self._force_full = False
                    last_full = now
                    self.metrics.full_sync_done()
                if ok:
                    backoff.reset()
                else:
                    stop.wait(backoff.next())
                    self._wake.set()  # retry the failed nodes right after the backoff
        finally:
            for informer in (self.nodes, self.pods):
                informer.close()
            pool.shutdown(wait=True)
            if self.elector is not None:
                self.elector.release()
            if self.health is not None:
                self.health.stop()
            log.info("balancer stopped", extra={"fields": {"identity": self.settings.lease.identity}})

    def reconcile(self, pool: ThreadPoolExecutor, *, full: bool) -> bool:
        """One pass over the dirty nodes (all nodes if ``full``); False if a write failed."""
        s = self.settings
        plans: list[tuple[NodeInfo, marks_mod.Marks, dict[str, Any]]] = []
        with self._lock:
            if full:
                self.state.mark_all()
            for name in self.state.take_dirty():
                node = self.state.nodes.get(name)
                if node is None:
                    continue
                load = None
                if node.is_gpu_node:
                    load = marks_mod.node_load(node, self.state.requested.get(name, {}), self._utilization(node))
                want = marks_mod.desired(node, load, thresholds=s.tiers, taint_congested=s.taint_congested)
                if want.load is None:
                    self._tiers.pop(name, None)
                else:
                    self._tiers[name] = want.load
                patch = marks_mod.node_patch(node, want)
                if patch is not None:
                    plans.append((node, want, patch))
            counts = {tier: 0 for tier in ("idle", "busy", "congested")}
            for tier in self._tiers.values():
                counts[tier] += 1
        for tier, count in counts.items():
            self.metrics.nodes.labels(tier).set(count)
        if not plans:
            return True
        if s.dry_run:
            for node, want, patch in plans:
                text = json.dumps(patch, sort_keys=True)
                if self._dry_logged.get(node.name) != text:
                    self._dry_logged[node.name] = text
                    self.metrics.label_writes.labels("dry_run").inc()
                    log.info("dry run: would patch node", extra={"fields": {
                        "node": node.name, "changes": marks_mod.describe(node, want), "patch": patch}})
            return True
        if not self.writes():
            return True
        return all(pool.map(self._apply, plans))

    def _apply(self, plan: tuple[NodeInfo, marks_mod.Marks, dict[str, Any]]) -> bool:
        node, want, patch = plan
        try:
            stored = self._writer.patch(node.name, patch)
        except ApiException as err:
            if err.status == 404:  # deleted meanwhile; the watch will drop it
                return True
            result = "conflict" if err.status == 409 else "error"
            self.metrics.label_writes.labels(result).inc()
            if result == "error":
                self._api_error("patch_node", err)
                log.warning("node patch failed", extra={"fields": {"node": node.name,
                                                                   "error": f"{err.status} {err.reason}"}})
            with self._lock:
                self.state.dirty.add(node.name)
            return result == "conflict"  # a conflict is retried when the watch brings the fresh node
        except Exception as err:
            self.metrics.label_writes.labels("error").inc()
            self._api_error("patch_node", err)
            log.warning("node patch failed", extra={"fields": {"node": node.name, "error": str(err)[:300]}})
            with self._lock:
                self.state.dirty.add(node.name)
            return False
        info = node_info(stored)
        with self._lock:
            current = self.state.nodes.get(node.name)
            # Keep what we wrote unless the watch has already delivered something newer.
            if current is not None and current.resource_version == node.resource_version:
                self.state.nodes[node.name] = info
        self.metrics.label_writes.labels("ok").inc()
        log.info("node marks updated", extra={"fields": {"node": node.name,
                                                         "changes": marks_mod.describe(node, want)}})
        return True

    # ---- utilization ---------------------------------------------------------------------------
    def _utilization(self, node: NodeInfo) -> float | None:
        if not self._util_usable:
            return None
        for host in node.hostnames:
            if host in self._util:
                return self._util[host]
        return None

    def _poll_prometheus(self, stop: threading.Event) -> None:
        assert self._prometheus is not None
        p = self.settings.prometheus
        reported_down = False
        while not stop.is_set():
            try:
                result = self._prometheus.utilization()
            except PrometheusError as err:
                self.metrics.prometheus_up.set(0)
                if not reported_down:
                    log.warning("Prometheus unreachable: tiers fall back to allocation only once the last "
                                "sample is stale", extra={"fields": {"error": str(err)[:300],
                                                                     "stale_after_s": p.stale_after}})
                    reported_down = True
                result = None
            else:
                self.metrics.prometheus_up.set(1)
                if reported_down and result is not None:
                    log.info("Prometheus reachable again", extra={"fields": {"hosts": len(result.by_host)}})
                reported_down = False
            now = self._clock()
            with self._lock:
                changed = False
                if result is not None:
                    changed = result.by_host != self._util
                    self._util, self._util_at = result.by_host, now
                usable = self._util_at is not None and now - self._util_at <= p.stale_after
                changed = changed or usable != self._util_usable
                self._util_usable = usable
                if changed:
                    self.state.mark_all()
            self.metrics.allocation_only.set(0 if usable else 1)
            if changed:
                self._wake.set()
            stop.wait(p.interval)
