"""The balancer's loop: informers fill the state, a pass turns dirty nodes into wanted marks, and
a small pool of writers patches nodes at a bounded rate.

Threads: one informer per resource (nodes, pods), the lease elector, the Prometheus poller,
the health server, the loop in :meth:`Balancer.run`, which alone decides, and the writers,
which alone patch. Every replica runs all of them, so a standby's caches are warm; only the
lease holder patches, and a writer asks the elector right before each patch (fencing).
Hysteresis needs the previous tier: that is the node's own ``gpugate.io/gpu-load`` label, so a
new leader continues exactly where the old one stopped.

Writes are coalesced per node (``backoff.WriteSchedule``: the latest wanted marks win, a node is
patched at most once per ``write_interval``; only marks appearing or going away go at once) and paced by a token bucket
(``write_qps``, ``write_burst``); a 429 pauses every writer for its ``Retry-After``.
"""

from __future__ import annotations

import json
import logging
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import kubeclient
from webhook.balancer import dracount, drawatch, placementfeed, templatekeeper
from webhook.balancer import inventory as inventory_mod
from webhook.balancer import marks as marks_mod
from webhook.balancer.backoff import Backoff, TokenBucket, WriteSchedule
from webhook.balancer.cluster import Informer, NodeWriter, retry_after
from webhook.balancer.health import HealthServer
from webhook.balancer.lease import LeaderElector
from webhook.balancer.metrics import Metrics
from webhook.balancer.prometheus import PrometheusClient, PrometheusError
from webhook.balancer.publisher import InventoryPublisher
from webhook.balancer.settings import BalancerSettings, load_mix, parse_bind
from webhook.balancer.state import ClusterState, NodeInfo, PodUsage, may_hold_gpus, node_info, pod_key, pod_usage
from webhook.errors import GpugateError
from webhook.names import LOAD_TIERS
from webhook.placement.devices import DevicePolicy
from webhook.placement.extender import ExtenderSettings, ExtenderState
from webhook.placement.shapes import mix_entries

log = logging.getLogger("gpugate.balancer")

LIVENESS_SECONDS = 60.0  # a loop silent this long is stuck: /healthz turns 503 and the kubelet restarts us
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""Only pods that can hold devices: bound and not finished. A pod that finishes leaves the selection,
which the API server reports as DELETED; completed Job pods that linger are never listed."""
EXTENDER_RETRY_SECONDS = 5.0
"""Wait between attempts to start the extender's listener (certificate not mounted yet, port taken)."""
RETRY_AFTER_DEFAULT = 1.0  # a 429 without Retry-After: wait this long before the next write


def missing_namespace_message(namespace: str, *, what: str) -> str:
    """What to do when the namespace the balancer writes its ``what`` (Lease, GPUInventory) into is absent."""
    return (f"the {what} namespace {namespace} does not exist: create it (kubectl create namespace {namespace}) "
            f"or pass --lease-namespace NS, the namespace gpugate runs in ($POD_NAMESPACE in the Deployment)")


class Balancer:
    """One replica of the node-load balancer; :meth:`run` blocks until ``stop`` is set."""

    def __init__(self, settings: BalancerSettings, *, client_factory: Callable[[], client.ApiClient],
                 metrics: Metrics | None = None, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic, serve_health: bool = False) -> None:
        self.settings = settings
        # First: a bad mix file is refused before anything reaches for a cluster.
        mix = load_mix(settings.extender.mix_file) if settings.extender.mix_file else None
        self.metrics = metrics or Metrics()
        self.state = ClusterState()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._rng = rng or random.Random()
        self._clock = clock
        self._tiers: dict[str, str] = {}
        self._tier_counts: Counter[str] = Counter()
        self._util: dict[str, float] = {}
        self._util_at: float | None = None
        self._util_usable = False
        self._force_full = True
        self._dry_logged: dict[str, str] = {}
        self._heartbeat = clock()
        self.stop_event = threading.Event()
        self.fatal = ""
        """Why the balancer stopped itself (a change of configuration is needed), else empty."""
        self.health: HealthServer | None = None
        self._serve_health = serve_health
        self._schedule: WriteSchedule[marks_mod.Marks] = WriteSchedule(settings.write_interval)
        self._bucket = TokenBucket(settings.write_qps, settings.write_burst)
        self._bucket_lock = threading.Lock()
        self._paused_until = 0.0  # a 429 holds every writer until then
        self._write_backoff = Backoff(settings.backoff_initial, settings.backoff_max,
                                      random.Random(self._rng.random()))

        # Children of labelled series, looked up once: labels() costs more than the event it counts.
        self._pod_events = self.metrics.watch_events.labels("pods")
        self._node_events = self.metrics.watch_events.labels("nodes")
        self._writes_ok = self.metrics.label_writes.labels("ok")
        self._tier_gauges = {tier: self.metrics.nodes.labels(tier) for tier in LOAD_TIERS}

        def api() -> client.ApiClient:
            made = client_factory()
            # The API server's audit log (and our fake's request log) then tells replicas apart.
            made.user_agent = f"gpugate-balancer ({settings.lease.identity or 'no identity'})"
            return made

        self.nodes = Informer[NodeInfo](
            name="nodes", list_call=client.CoreV1Api(api()).list_node,
            reduce=lambda obj: (obj["metadata"]["name"], node_info(obj)),
            on_replace=self._replace_nodes, on_event=self._node_event, **self._informer_args())
        self.feed: placementfeed.Feed | None = None
        self._feed_lock = threading.Lock()  # never held together with self._lock
        self.pods: Informer[Any]
        self.extender: Any = None
        """The ``extenderserver.ExtenderServer`` once it listens (imported only when configured: it
        brings the webhook's TLS machinery, whose imports cost a second on a busy node)."""
        if settings.extender.bind:
            # The extender weighs every bound pod's cpu and memory, not only GPU pods: no prefilter,
            # and each pod is reduced to both records (what the labels count, what the measure counts).
            self.feed = placementfeed.Feed(ExtenderState(ExtenderSettings(
                device_policy=cast(DevicePolicy, settings.extender.device_policy),
                assume_ttl=settings.extender.assume_ttl, mix=mix)))
            self.metrics.extender_serving.set(0)
            self.pods = Informer[placementfeed.PodRecord](
                name="pods", list_call=client.CoreV1Api(api()).list_pod_for_all_namespaces,
                reduce=lambda obj: (pod_key(obj), placementfeed.pod_record(obj)),
                on_replace=self._replace_pod_records, on_event=self._pod_record_event,
                field_selector=POD_FIELD_SELECTOR, **self._informer_args())
        else:
            self.pods = Informer[PodUsage | None](
                name="pods", list_call=client.CoreV1Api(api()).list_pod_for_all_namespaces,
                reduce=lambda obj: (pod_key(obj), pod_usage(obj)),
                on_replace=self._replace_pods, on_event=self._pod_event, prefilter=may_hold_gpus,
                on_skip=self._pod_events.inc,
                field_selector=POD_FIELD_SELECTOR, **self._informer_args())
        self._writer = NodeWriter(api())
        # DRA: ResourceSlices and ResourceClaims, counted in webhook.balancer.dracount (issue 24).
        self.dra_cache = dracount.DraCache()
        self.dra = drawatch.DraWatch(api(), informer_args=self._informer_args(), on_slices=self._replace_slices,
                                     on_slice=self._slice_event, on_claims=self._replace_claims,
                                     on_claim=self._claim_event)
        # Right-sizing through DRA: the templates right-sized pods name, created where missing (issue 25).
        self.templates = templatekeeper.TemplateKeeper(api(), informer_args=self._informer_args(),
                                                       may_write=self.writes, on_error=self._api_error,
                                                       dra_served=lambda: self.dra.available)
        self._global_defaults: dict[str, bool] = {}
        self.priority_classes: Informer[bool] | None = None
        self.publisher: InventoryPublisher | None = None
        if settings.inventory.enabled:
            # PriorityClasses change rarely and are few: a watch (list + watch verbs) costs nothing.
            self.priority_classes = Informer[bool](
                name="priorityclasses", list_call=client.SchedulingV1Api(api()).list_priority_class,
                reduce=lambda obj: ((obj.get("metadata") or {}).get("name", ""), bool(obj.get("globalDefault"))),
                on_replace=self._replace_priority_classes, on_event=self._priority_class_event,
                **self._informer_args())
            self.publisher = InventoryPublisher(
                api(), settings.inventory, namespace=settings.inventory.namespace or settings.lease.namespace,
                content=self.inventory_content, may_write=self.writes, metrics=self.metrics,
                on_error=self._api_error, clock=clock, dry_run=settings.dry_run)
        self.elector: LeaderElector | None = None
        if settings.lease.enabled and not settings.dry_run:
            self.elector = LeaderElector(api(), settings.lease, clock=clock,
                                         on_change=self._leader_changed, on_error=self._api_error)
        self._prometheus = None
        if settings.prometheus.url:
            self._prometheus = PrometheusClient(settings.prometheus.url, window=settings.prometheus.window,
                                                timeout=settings.prometheus.timeout)

    def _informer_args(self) -> dict[str, Any]:
        s = self.settings
        return {"page_size": s.page_size, "watch_timeout": s.watch_timeout, "stream_lists": s.stream_lists,
                "backoff": Backoff(s.backoff_initial, s.backoff_max, random.Random(self._rng.random())),
                "on_error": self._api_error, "on_relist": lambda name: self.metrics.relists.labels(name).inc()}

    # ---- informer callbacks (informer threads) --------------------------------------------------
    def _replace_nodes(self, infos: dict[str, NodeInfo]) -> None:
        if self.feed is not None:
            with self._feed_lock:
                self.feed.replace_nodes(infos)
        with self._lock:
            self.state.replace_nodes(infos)
            for name in [k for k in self._tiers if k not in infos]:
                self._set_tier(name, None)
            for name in list(self._schedule.wanted):
                if name not in infos:
                    self._schedule.forget(name)
        self._wake.set()
        self._inventory_changed()

    def _node_event(self, etype: str, name: str, info: NodeInfo | None) -> None:
        if self.feed is not None:
            with self._feed_lock:
                self.feed.node(name, info)
        with self._lock:
            if info is None:
                self.state.delete_node(name)
                self._set_tier(name, None)
                self._dry_logged.pop(name, None)
                self._schedule.forget(name)
            else:
                self.state.set_node(info)
        self._node_events.inc()
        self._wake.set()
        self._inventory_changed()

    def _replace_pods(self, usages: dict[str, PodUsage | None]) -> None:
        held = {k: v for k, v in usages.items() if v is not None}
        with self._lock:
            self.state.replace_pods(held)
        self._wake.set()
        self._inventory_changed()

    def _pod_event(self, etype: str, key: str, usage: PodUsage | None) -> None:
        with self._lock:
            self.state.set_pod(key, usage)
            wake = bool(self.state.dirty)
        self._pod_events.inc()
        if wake:
            self._wake.set()
            self._inventory_changed()

    def _replace_pod_records(self, records: dict[str, placementfeed.PodRecord]) -> None:
        assert self.feed is not None
        with self._feed_lock:
            self.feed.replace_pods(records)
        self._replace_pods({key: record.usage for key, record in records.items()})

    def _pod_record_event(self, etype: str, key: str, record: placementfeed.PodRecord | None) -> None:
        assert self.feed is not None
        with self._feed_lock:
            self.feed.pod(key, record)
        self._pod_event(etype, key, None if record is None else record.usage)

    def _replace_slices(self, found: dict[str, Any]) -> None:
        self._dra_update(lambda: self.dra_cache.replace_slices(found))

    def _slice_event(self, etype: str, name: str, found: Any) -> None:
        self._dra_update(lambda: self.dra_cache.set_slice(name, found))

    def _replace_claims(self, found: dict[str, Any]) -> None:
        self._dra_update(lambda: self.dra_cache.replace_claims(found))

    def _claim_event(self, etype: str, key: str, found: Any) -> None:
        self._dra_update(lambda: self.dra_cache.set_claim(key, found))

    def _dra_update(self, change: Callable[[], set[str]]) -> None:
        """Apply one slice or claim change; the nodes whose DRA devices changed get a new look."""
        with self._lock:
            changed = change()
            self.state.dirty |= changed & set(self.state.nodes)
            devices = {name: self.dra_cache.node(name) for name in changed}
        if not changed:
            return
        if self.feed is not None:
            with self._feed_lock:
                for name, found in devices.items():
                    self.feed.dra(name, found)
        self._wake.set()
        self._inventory_changed()

    def extender_mix(self) -> list[dict[str, Any]] | None:
        """The pod-shape mix the extender measures with (configured or learned), in the YAML form
        ``--extender-mix`` reads; None when the extender is off."""
        if self.feed is None:
            return None
        with self._feed_lock:
            mix = self.feed.state.fragmenter.mix
        return mix_entries(mix)

    def extender_answer(self, args: Any) -> list[Any]:
        """kube-scheduler's prioritize: a HostPriorityList from the caches (every replica answers)."""
        assert self.feed is not None
        with self._feed_lock:
            try:
                return cast(list[Any], self.feed.prioritize(args, now=self._clock()))
            except placementfeed.ArgsError as err:
                from webhook.balancer.extenderserver import BadRequest
                raise BadRequest(str(err)) from err
            finally:
                self.metrics.extender_assumed.set(self.feed.state.assumed)

    def _serve_extender(self, stop: threading.Event) -> None:
        """Start the HTTPS listener, retrying until the certificate is there (the Secret may come later).

        The labels and the inventory go on meanwhile; ``gpugate_balancer_extender_serving`` says 0.
        """
        from webhook.balancer.extenderserver import ExtenderServer

        e = self.settings.extender
        host, port = parse_bind(e.bind, what="extender.bind")
        reported = ""
        while not stop.is_set():
            try:
                self.extender = ExtenderServer(host, port, path=e.path, certfile=Path(e.cert_file),
                                               keyfile=Path(e.key_file), answer=self.extender_answer,
                                               ready=self.ready, metrics=self.metrics).start()
            except (OSError, ssl.SSLError) as err:
                problem = f"{type(err).__name__}: {err}"
                if problem != reported:
                    log.error("scheduler extender not served; retrying", extra={"fields": {
                        "bind": e.bind, "cert_file": e.cert_file, "error": problem}})
                    reported = problem
                stop.wait(EXTENDER_RETRY_SECONDS)
                continue
            self.metrics.extender_serving.set(1)
            log.info("scheduler extender serving", extra={"fields": {
                "bind": e.bind, "port": self.extender.port, "path": f"{e.path.rstrip('/')}/prioritize",
                "pod_mix": e.mix_file or "learned from the last pods created"}})
            return

    def _replace_priority_classes(self, marked: dict[str, bool]) -> None:
        with self._lock:
            self._global_defaults = dict(marked)
        self._inventory_changed()

    def _priority_class_event(self, etype: str, name: str, is_default: bool | None) -> None:
        with self._lock:
            if is_default is None:
                self._global_defaults.pop(name, None)
            else:
                self._global_defaults[name] = is_default
        self._inventory_changed()

    def _inventory_changed(self) -> None:
        if self.publisher is not None:
            self.publisher.changed.set()

    def inventory_content(self) -> inventory_mod.Content | None:
        """What the GPUInventory says now, or None until every cache it reads holds a full list."""
        if not self.synced or (self.priority_classes is not None and not self.priority_classes.synced.is_set()):
            return None
        pressure: dict[str, float] = {}
        if self.feed is not None:
            with self._feed_lock:
                pressure = self.feed.state.type_pressure()
        with self._lock:  # a snapshot under the lock, the sums outside it
            nodes = list(self.state.nodes.values())
            requested = {name: dict(sums) for name, sums in self.state.requested.items()}
            defaults = dict(self._global_defaults)
            dra = dict(self.dra_cache.nodes)
        return inventory_mod.content(nodes, requested, defaults, pressure, dra=dra)

    def _api_error(self, operation: str, err: BaseException) -> None:
        self.metrics.api_errors.labels(operation).inc()
        missing = kubeclient.missing_namespace(err)
        if missing and operation in ("lease", "inventory.write"):
            # No retry can create a namespace: stop with the fix instead of looping on 404s.
            self.fatal = missing_namespace_message(missing, what="Lease" if operation == "lease" else "GPUInventory")
            log.error("cannot continue", extra={"fields": {"error": self.fatal}})
            self.stop()

    def _leader_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if leading:
            self._force_full = True
            self._wake.set()

    # ---- status ------------------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        return self.nodes.synced.is_set() and self.pods.synced.is_set() and self.dra.synced

    def writes(self) -> bool:
        """True when this replica may patch nodes now (asked again right before every patch)."""
        if self.settings.dry_run:
            return False
        return self.elector is None or self.elector.is_leader()

    def status(self) -> dict[str, Any]:
        alive = self._clock() - self._heartbeat < LIVENESS_SECONDS
        with self._lock:
            pending = self._schedule.pending()
        return {"ok": alive, "synced": self.synced, "leader": self.writes(),
                "seconds_since_full_sync": round(self.metrics.seconds_since_full_sync(), 3),
                "allocation_only": not self._util_usable, "pending_writes": pending}

    def ready(self) -> bool:
        """Ready once both caches hold a full list: before that, tiers (and the extender's answers)
        would come from a partial view, and a standby promoted then would write from it."""
        return self.synced

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
                self.health = HealthServer(host, port, metrics=self.metrics, status=self.status,
                                           ready=self.ready, mix=self.extender_mix).start()
            except OSError as err:
                raise GpugateError(f"cannot serve /healthz and /metrics on {self.settings.health_bind}: "
                                   f"{err.strerror or err}; pick another --health-bind") from err
        self.metrics.leader.set(0)
        threads = [threading.Thread(target=self.nodes.run, args=(stop,), name="informer-nodes", daemon=True),
                   threading.Thread(target=self.pods.run, args=(stop,), name="informer-pods", daemon=True),
                   threading.Thread(target=self.dra.run, args=(stop,), name="informer-resourceslices", daemon=True),
                   threading.Thread(target=self.templates.run, args=(stop,), name="claim-templates", daemon=True)]
        lease_thread = None
        if self.elector is not None:
            lease_thread = threading.Thread(target=self.elector.run, args=(stop,), name="lease", daemon=True)
            threads.append(lease_thread)
        else:
            self.metrics.leader.set(0 if self.settings.dry_run else 1)
        if self.priority_classes is not None and self.publisher is not None:
            threads.append(threading.Thread(target=self.priority_classes.run, args=(stop,),
                                            name="informer-priorityclasses", daemon=True))
            threads.append(threading.Thread(target=self.publisher.run, args=(stop,), name="inventory",
                                            daemon=True))
        if self.feed is not None:
            threads.append(threading.Thread(target=self._serve_extender, args=(stop,), name="extender-start",
                                            daemon=True))
        if self._prometheus is not None:
            threads.append(threading.Thread(target=self._poll_prometheus, args=(stop,), name="prometheus",
                                            daemon=True))
        for thread in threads:
            thread.start()
        log.info("balancer started", extra={"fields": {
            "dry_run": self.settings.dry_run, "prometheus": self.settings.prometheus.url,
            "lease": None if self.elector is None else f"{self.settings.lease.namespace}/{self.settings.lease.name}",
            "identity": self.settings.lease.identity, "write_qps": self.settings.write_qps,
            "write_burst": self.settings.write_burst, "write_interval": self.settings.write_interval}})
        pool = ThreadPoolExecutor(self.settings.write_concurrency, thread_name_prefix="patch")
        last_full: float | None = None
        try:
            while not stop.is_set():
                self._wake.wait(self._sleep_for())
                self._wake.clear()
                self._heartbeat = self._clock()
                if stop.is_set() or not self.synced:
                    continue
                now = self._clock()
                full = self._force_full or last_full is None or now - last_full >= self.settings.resync_interval
                try:
                    self.reconcile(full=full)
                    self.dispatch(pool)
                except Exception:
                    log.exception("reconcile pass failed")
                    stop.wait(self._write_backoff.next())
                    continue
                if full:
                    self._force_full = False
                    last_full = now
                    self.metrics.full_sync_done()
        finally:
            for informer in (self.nodes, self.pods, self.priority_classes):
                if informer is not None:
                    informer.close()
            self.dra.close()
            self.templates.close()
            pool.shutdown(wait=True, cancel_futures=True)
            if self.elector is not None:
                if lease_thread is not None:
                    lease_thread.join(timeout=15)  # a renewal in flight ends before we release
                self.elector.release()
            if self.health is not None:
                self.health.stop()
            if self.extender is not None:
                self.extender.stop()
                self.metrics.extender_serving.set(0)
            log.info("balancer stopped", extra={"fields": {"identity": self.settings.lease.identity}})
        if self.fatal:
            raise GpugateError(self.fatal)

    def _sleep_for(self) -> float:
        """Until the next node write falls due, at most a second (the heartbeat)."""
        ceiling = min(1.0, self.settings.resync_interval)
        with self._lock:
            at = self._schedule.next_at()
        if at is None or not self.writes():
            return ceiling
        return max(0.0, min(ceiling, max(at, self._paused_until) - self._clock()))

    def reconcile(self, *, full: bool) -> None:
        """Decide the marks of the dirty nodes (all nodes if ``full``) and schedule what must change."""
        s = self.settings
        logged: list[tuple[NodeInfo, marks_mod.Marks, dict[str, Any]]] = []
        with self._lock:
            if full:
                self.state.mark_all()
            for name in self.state.take_dirty():
                node = self.state.nodes.get(name)
                if node is None:
                    continue
                load = None
                devices = self.dra_cache.node(name)
                if dracount.is_gpu_node(node, devices):
                    load = dracount.node_load(node, self.state.requested.get(name, {}), self._utilization(node),
                                              devices)
                want = marks_mod.desired(node, load, thresholds=s.tiers, taint_congested=s.taint_congested)
                self._set_tier(name, want.load)
                patch = marks_mod.node_patch(node, want)
                if patch is None:
                    self._schedule.drop(name)
                elif s.dry_run:
                    logged.append((node, want, patch))
                else:
                    self._schedule.want(name, want, urgent=marks_mod.urgent(node, want))
            counts = dict(self._tier_counts)
            pending, coalesced = self._schedule.pending(), self._schedule.coalesced
        for tier, gauge in self._tier_gauges.items():
            gauge.set(counts.get(tier, 0))
        self.metrics.pending_writes.set(pending)
        self.metrics.set_coalesced(coalesced)
        for node, want, patch in logged:
            text = json.dumps(patch, sort_keys=True)
            if self._dry_logged.get(node.name) != text:
                self._dry_logged[node.name] = text
                self.metrics.label_writes.labels("dry_run").inc()
                log.info("dry run: would patch node", extra={"fields": {
                    "node": node.name, "changes": marks_mod.describe(node, want), "patch": patch}})

    def _set_tier(self, name: str, tier: str | None) -> None:
        """Record a node's tier (None: not a GPU node) and keep the per-tier counts (lock held)."""
        old = self._tiers.pop(name, None) if tier is None else self._tiers.get(name)
        if old == tier:
            return
        if old is not None:
            self._tier_counts[old] -= 1
        if tier is not None:
            self._tiers[name] = tier
            self._tier_counts[tier] += 1

    def dispatch(self, pool: ThreadPoolExecutor) -> int:
        """Hand the nodes whose write is due to the writers; returns how many."""
        if not self.writes():
            return 0
        now = self._clock()
        if now < self._paused_until:
            return 0
        with self._lock:
            due = self._schedule.due(now)
        for name in due:
            pool.submit(self._write, name)
        return len(due)

    # ---- writers (pool threads) -------------------------------------------------------------------
    def _write(self, name: str) -> None:
        try:
            self._write_one(name)
        except Exception:  # never lose a node: it stays pending and the loop retries it
            log.exception("node write failed", extra={"fields": {"node": name}})
            with self._lock:
                self._schedule.failed(name, retry_at=self._clock() + self._write_backoff.next())
            self._wake.set()

    def _pace(self) -> bool:
        """Wait for a token and for any 429 pause to end; False if we are stopping meanwhile."""
        with self._bucket_lock:
            wait = self._bucket.reserve(self._clock())
        while True:
            paused = self._paused_until - self._clock()
            if max(wait, paused) <= 0:
                return not self.stop_event.is_set()
            if self.stop_event.wait(max(wait, paused)):
                return False
            wait = 0.0

    def _write_one(self, name: str) -> None:
        if not self._pace():
            with self._lock:
                self._schedule.release(name)
            return
        with self._lock:
            want = self._schedule.take(name)  # the newest wanted marks, read as late as possible
            node = self.state.nodes.get(name)
            patch = None if want is None or node is None else marks_mod.node_patch(node, want)
            if patch is None or node is None or want is None:
                self._schedule.drop(name)
                self._schedule.release(name)
                return
        # Fencing: the lease is checked right before each patch, never once for a whole pass.
        if not self.writes():
            with self._lock:
                self._schedule.release(name)
            return
        try:
            self._writer.patch(name, patch)
        except ApiException as err:
            self._write_refused(node, err)
            return
        except Exception as err:
            self.metrics.label_writes.labels("error").inc()
            self._api_error("patch_node", err)
            log.warning("node patch failed", extra={"fields": {"node": name, "error": kubeclient.failure(err)}})
            with self._lock:
                self._schedule.failed(name, retry_at=self._clock() + self._write_backoff.next())
            self._wake.set()
            return
        now = self._clock()
        with self._lock:
            current = self.state.nodes.get(name)
            # Keep what we wrote unless the watch has already delivered something newer.
            if current is not None and current.resource_version == node.resource_version:
                self.state.nodes[name] = marks_mod.after_patch(current, want)
            self._schedule.written(name, want, now)
        self._write_backoff.reset()
        self._writes_ok.inc()
        log.info("node marks updated", extra={"fields": {"node": name, "changes": marks_mod.describe(node, want)}})

    def _write_refused(self, node: NodeInfo, err: ApiException) -> None:
        name = node.name
        now = self._clock()
        if err.status == 404:  # deleted meanwhile; the watch will drop it
            with self._lock:
                self._schedule.forget(name)
            return
        if err.status == 429:
            wait = retry_after(err)
            wait = RETRY_AFTER_DEFAULT if wait is None else wait
            self._paused_until = max(self._paused_until, now + wait)
            self.metrics.label_writes.labels("throttled").inc()
            log.warning("API server asks us to slow down: pausing node writes",
                        extra={"fields": {"node": name, "retry_after_s": wait}})
            retry_at = now + wait
        elif err.status == 409:  # the node changed under a taint patch: wait for the watch's fresh copy
            self.metrics.label_writes.labels("conflict").inc()
            retry_at = now + self.settings.backoff_initial
        else:
            self.metrics.label_writes.labels("error").inc()
            self._api_error("patch_node", err)
            log.warning("node patch failed", extra={"fields": {"node": name, "error": f"{err.status} {err.reason}"}})
            retry_at = now + max(self._write_backoff.next(), retry_after(err) or 0.0)
        with self._lock:
            self._schedule.failed(name, retry_at=retry_at)
        self._wake.set()

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
                                "sample is stale", extra={"fields": {"error": str(err),
                                                                     "stale_after_s": p.stale_after}})
                    reported_down = True
                result = None
            else:
                self.metrics.prometheus_up.set(1)
                self.metrics.prometheus_succeeded()
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
