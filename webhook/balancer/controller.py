"""The balancer's wiring: informers whose events fan out to three consumers, and the loop.

The consumers, each under a lock of its own (never two held together):

- ``labeller.Labeller``: GPU accounting, tiers, which node to write when; its writers are
  ``labelwrites.LabelWrites``, a small pool paced by a token bucket;
- ``extendercache.ExtenderCache``: the scheduler extender's view and its HTTPS listener
  (only with ``extender.bind``);
- ``inventorysource.InventorySource``: the GPUInventory the publisher writes (only with
  ``inventory.enabled``).

Threads: one informer per resource (nodes, pods, DRA, templates, PriorityClasses), the lease
elector, the Prometheus poller, the health server, the loop in :meth:`Balancer.run`, which alone
decides, and the writers, which alone patch. Every replica runs all of them, so a standby's
caches are warm; only the lease holder patches, and a writer asks the elector right before each
patch (fencing).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from webhook import kubeclient
from webhook.balancer import drawatch, placementfeed, quarantineloop, templatekeeper, utilization
from webhook.balancer.backoff import Backoff
from webhook.balancer.cluster import Informer, NodeWriter
from webhook.balancer.extendercache import ExtenderCache
from webhook.balancer.health import HealthServer
from webhook.balancer.inventorysource import InventorySource
from webhook.balancer.labeller import Labeller
from webhook.balancer.labelwrites import LabelWrites
from webhook.balancer.metrics import Metrics
from webhook.balancer.mover import Mover
from webhook.balancer.prometheus import PrometheusClient
from webhook.balancer.publisher import InventoryPublisher
from webhook.balancer.settings import BalancerSettings, load_mix, parse_bind
from webhook.balancer.state import PodUsage, may_hold_gpus, pod_key, pod_usage
from webhook.balancer.usagewiring import UsageWiring
from webhook.errors import GpugateError
from webhook.kube.gpunode import NodeInfo, node_info
from webhook.lease import LeaderElector
from webhook.placement import dracount
from webhook.placement import gpuinventory as inventory_mod

log = logging.getLogger("gpugate.balancer")

LIVENESS_SECONDS = 60.0  # a loop silent this long is stuck: /healthz turns 503 and the kubelet restarts us
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""Only pods that can hold devices: bound and not finished. A pod that finishes leaves the selection,
which the API server reports as DELETED; completed Job pods that linger are never listed."""


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
        self._rng = rng or random.Random()
        self._clock = clock
        self._force_full = True
        self._heartbeat = clock()
        self.stop_event = threading.Event()
        self.fatal = ""
        """Why the balancer stopped itself (a change of configuration is needed), else empty."""
        self.health: HealthServer | None = None
        self._serve_health = serve_health
        self._client_factory = client_factory
        self._pod_events = self.metrics.watch_events.labels("pods")
        self._node_events = self.metrics.watch_events.labels("nodes")

        self.labeller = Labeller(settings, self.metrics, clock=clock)
        self.writes_pool = LabelWrites(self.labeller, NodeWriter(self._api()), metrics=self.metrics,
                                       may_write=self.writes, on_error=self._api_error, clock=clock,
                                       rng=random.Random(self._rng.random()))
        self.extender_cache = ExtenderCache(settings.extender, self.metrics, mix=mix, clock=clock) \
            if settings.extender.bind else None
        self.nodes = Informer[NodeInfo](
            name="nodes", list_call=client.CoreV1Api(self._api()).list_node,
            reduce=lambda obj: (obj["metadata"]["name"], node_info(obj)),
            on_replace=self._replace_nodes, on_event=self._node_event, **self._informer_args())
        self.pods = self._pod_informer()
        # DRA: ResourceSlices and ResourceClaims, counted in webhook.placement.dracount (claimed GPUs are used).
        self.dra = drawatch.DraWatch(self._api(), informer_args=self._informer_args(), on_slices=self._replace_slices,
                                     on_slice=self._slice_event, on_claims=self._replace_claims,
                                     on_claim=self._claim_event)
        # Right-sizing through DRA: the templates right-sized pods name, created where missing (the webhook can't).
        self.templates = templatekeeper.TemplateKeeper(self._api(), informer_args=self._informer_args(),
                                                       may_write=self.writes, on_error=self._api_error,
                                                       dra_served=lambda: self.dra.available)
        self.priority_classes: Informer[bool] | None = None
        self.publisher: InventoryPublisher | None = None
        self.inventory: InventorySource | None = None
        if settings.inventory.enabled:
            self._inventory_consumer()
        self.elector: LeaderElector | None = None
        if settings.lease.enabled and not settings.dry_run:
            self.elector = LeaderElector(self._api(), settings.lease, clock=clock,
                                         on_change=self._leader_changed, on_error=self._api_error)
        self._prometheus = PrometheusClient(settings.prometheus.url, window=settings.prometheus.window,
                                            timeout=settings.prometheus.timeout) if settings.prometheus.url else None
        self._run_time_loops(settings)

    def _run_time_loops(self, settings: BalancerSettings) -> None:
        """The leader's loops over running work, each off unless its section turns it on."""
        # The rebalancer (docs/rebalance.md): watches of its own, acting only where this replica writes.
        self.mover = Mover(settings, self._api, metrics=self.metrics, may_write=self.writes,
                           informer_args=self._informer_args()) if settings.rebalance.enabled else None
        # GPU health quarantine (docs/health.md): a loop of the leader's, off unless health.enabled.
        self.quarantine = quarantineloop.build(
            settings, self._api(), self.labeller, registry=self.metrics.registry, may_write=self.writes,
            synced=lambda: self.synced, on_error=self._api_error) if settings.health.enabled else None
        # GPU accounting per pod and owner, and idle allocations reclaimed where a policy allows (docs/usage.md).
        self.usage = UsageWiring(settings, api=self._api, informer_args=self._informer_args(),
                                 field_selector=POD_FIELD_SELECTOR, labeller=self.labeller,
                                 registry=self.metrics.registry, prometheus=self._prometheus,
                                 leading=lambda: self.elector is None or self.elector.is_leader(),
                                 ready=lambda: self.synced) if settings.usage.enabled else None

    def _api(self) -> client.ApiClient:
        made = self._client_factory()
        # The API server's audit log (and our fake's request log) then tells replicas apart.
        made.user_agent = f"gpugate-balancer ({self.settings.lease.identity or 'no identity'})"
        return made

    def _informer_args(self) -> dict[str, Any]:
        s = self.settings
        return {"page_size": s.page_size, "watch_timeout": s.watch_timeout, "stream_lists": s.stream_lists,
                "backoff": Backoff(s.backoff_initial, s.backoff_max, random.Random(self._rng.random())),
                "on_error": self._api_error, "on_relist": lambda name: self.metrics.relists.labels(name).inc()}

    def _pod_informer(self) -> Informer[Any]:
        """Pods reduced for the labels alone, or, with the extender, for both consumers.

        The extender weighs every bound pod's cpu and memory, not only GPU pods: no prefilter then.
        """
        list_pods = client.CoreV1Api(self._api()).list_pod_for_all_namespaces
        if self.extender_cache is not None:
            return Informer[placementfeed.FeedPod](
                name="pods", list_call=list_pods, reduce=lambda obj: (pod_key(obj), placementfeed.feed_pod(obj)),
                on_replace=self._replace_feed_pods, on_event=self._feed_pod_event,
                field_selector=POD_FIELD_SELECTOR, **self._informer_args())
        return Informer[PodUsage | None](
            name="pods", list_call=list_pods, reduce=lambda obj: (pod_key(obj), pod_usage(obj)),
            on_replace=self._replace_pods, on_event=self._pod_event, prefilter=may_hold_gpus,
            on_skip=self._pod_events.inc, field_selector=POD_FIELD_SELECTOR, **self._informer_args())

    def _inventory_consumer(self) -> None:
        """PriorityClasses (few, rarely changed: a watch costs nothing) and the GPUInventory publisher."""
        s = self.settings
        self.inventory = InventorySource(
            self.labeller, ready=lambda: self.synced and self.priority_classes is not None
            and self.priority_classes.synced.is_set(),
            pressure=None if self.extender_cache is None else self.extender_cache.type_pressure)
        self.priority_classes = Informer[bool](
            name="priorityclasses", list_call=client.SchedulingV1Api(self._api()).list_priority_class,
            reduce=lambda obj: ((obj.get("metadata") or {}).get("name", ""), bool(obj.get("globalDefault"))),
            on_replace=self._replace_priority_classes, on_event=self._priority_class_event,
            **self._informer_args())
        self.publisher = InventoryPublisher(
            self._api(), s.inventory, namespace=s.inventory.namespace or s.lease.namespace,
            content=self.inventory.content, may_write=self.writes, metrics=self.metrics,
            on_error=self._api_error, clock=self._clock, dry_run=s.dry_run)

    # ---- the fan-out (informer threads) -----------------------------------------------------------
    def _replace_nodes(self, infos: dict[str, NodeInfo]) -> None:
        if self.extender_cache is not None:
            self.extender_cache.replace_nodes(infos)
        self.labeller.replace_nodes(infos)
        self._inventory_changed()

    def _node_event(self, etype: str, name: str, info: NodeInfo | None) -> None:
        if self.extender_cache is not None:
            self.extender_cache.node(name, info)
        self.labeller.node(name, info)
        self._node_events.inc()
        self._inventory_changed()

    def _replace_pods(self, usages: dict[str, PodUsage | None]) -> None:
        self.labeller.replace_pods({k: v for k, v in usages.items() if v is not None})
        self._inventory_changed()

    def _pod_event(self, etype: str, key: str, usage: PodUsage | None) -> None:
        changed = self.labeller.pod(key, usage)
        self._pod_events.inc()
        if changed:
            self._inventory_changed()

    def _replace_feed_pods(self, records: dict[str, placementfeed.FeedPod]) -> None:
        assert self.extender_cache is not None
        self.extender_cache.replace_pods(records)
        self._replace_pods({key: record.usage for key, record in records.items()})

    def _feed_pod_event(self, etype: str, key: str, record: placementfeed.FeedPod | None) -> None:
        assert self.extender_cache is not None
        self.extender_cache.pod(key, record)
        self._pod_event(etype, key, None if record is None else record.usage)

    def _replace_slices(self, found: dict[str, Any]) -> None:
        self._dra_update(lambda cache: cache.replace_slices(found))

    def _slice_event(self, etype: str, name: str, found: Any) -> None:
        self._dra_update(lambda cache: cache.set_slice(name, found))

    def _replace_claims(self, found: dict[str, Any]) -> None:
        self._dra_update(lambda cache: cache.replace_claims(found))

    def _claim_event(self, etype: str, key: str, found: Any) -> None:
        self._dra_update(lambda cache: cache.set_claim(key, found))

    def _dra_update(self, change: Callable[[dracount.DraCache], set[str]]) -> None:
        """Apply one slice or claim change; the nodes whose DRA devices changed get a new look."""
        devices = self.labeller.dra(change)
        if not devices:
            return
        if self.extender_cache is not None:
            self.extender_cache.dra(devices)
        self._inventory_changed()

    def _replace_priority_classes(self, marked: dict[str, bool]) -> None:
        assert self.inventory is not None
        self.inventory.replace_priority_classes(marked)
        self._inventory_changed()

    def _priority_class_event(self, etype: str, name: str, is_default: bool | None) -> None:
        assert self.inventory is not None
        self.inventory.priority_class(name, is_default)
        self._inventory_changed()

    def _inventory_changed(self) -> None:
        if self.publisher is not None:
            self.publisher.changed.set()

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
            self.labeller.wake.set()

    # ---- what the other parts read ------------------------------------------------------------------
    @property
    def feed(self) -> placementfeed.Feed | None:
        return None if self.extender_cache is None else self.extender_cache.feed

    @property
    def extender(self) -> Any:
        """The ``extenderserver.ExtenderServer`` once it listens, else None."""
        return None if self.extender_cache is None else self.extender_cache.server

    def extender_mix(self) -> list[dict[str, Any]] | None:
        """The pod-shape mix the extender measures with, as ``--extender-mix`` reads it; None when off."""
        return None if self.extender_cache is None else self.extender_cache.mix()

    def inventory_content(self) -> inventory_mod.Content | None:
        """What the GPUInventory says now, or None until every cache it reads holds a full list."""
        return None if self.inventory is None else self.inventory.content()

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
        return {"ok": alive, "synced": self.synced, "leader": self.writes(),
                "seconds_since_full_sync": round(self.metrics.seconds_since_full_sync(), 3),
                "allocation_only": self.labeller.allocation_only(), "pending_writes": self.labeller.pending()}

    def ready(self) -> bool:
        """Ready once both caches hold a full list: before that, tiers (and the extender's answers)
        would come from a partial view, and a standby promoted then would write from it."""
        return self.synced

    def tiers(self) -> dict[str, str]:
        return self.labeller.tiers()

    def stop(self) -> None:
        """Ask :meth:`run` to finish (release the lease, stop the threads) as soon as it can."""
        self.stop_event.set()
        self.labeller.wake.set()

    # ---- running --------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        """Run until ``stop`` (or :attr:`stop_event`) is set; release the lease on the way out."""
        stop = stop or self.stop_event
        self.stop_event = stop
        if self._serve_health:
            self._start_health()
        self.metrics.leader.set(0)
        lease_thread = self._start_threads(stop)
        s = self.settings
        log.info("balancer started", extra={"fields": {
            "dry_run": s.dry_run, "prometheus": s.prometheus.url,
            "lease": None if self.elector is None else f"{s.lease.namespace}/{s.lease.name}",
            "identity": s.lease.identity, "write_qps": s.write_qps,
            "write_burst": s.write_burst, "write_interval": s.write_interval}})
        self.writes_pool.start(stop)
        try:
            self._loop(stop)
        finally:
            self._shut_down(lease_thread)
        if self.fatal:
            raise GpugateError(self.fatal)

    def _start_health(self) -> None:
        host, port = parse_bind(self.settings.health_bind)
        try:
            self.health = HealthServer(host, port, metrics=self.metrics, status=self.status,
                                       ready=self.ready, mix=self.extender_mix).start()
        except OSError as err:
            raise GpugateError(f"cannot serve /healthz and /metrics on {self.settings.health_bind}: "
                               f"{err.strerror or err}; pick another --health-bind") from err

    def _start_threads(self, stop: threading.Event) -> threading.Thread | None:
        """Start every thread but the loop's; returns the lease's (joined before the release)."""
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
            threads.append(threading.Thread(target=self.publisher.run, args=(stop,), name="inventory", daemon=True))
        if self.extender_cache is not None:
            threads.append(threading.Thread(target=self.extender_cache.serve, args=(stop, self.ready),
                                            name="extender-start", daemon=True))
        if self._prometheus is not None:
            threads.append(threading.Thread(target=self._poll_prometheus, args=(stop,), name="prometheus",
                                            daemon=True))
        if self.quarantine is not None:
            threads.append(threading.Thread(target=self.quarantine.run, args=(stop,), name="health", daemon=True))
        if self.usage is not None:
            threads += self.usage.threads(stop)
        for thread in threads:
            thread.start()
        if self.mover is not None:
            self.mover.start(stop)
        return lease_thread

    def _poll_prometheus(self, stop: threading.Event) -> None:
        assert self._prometheus is not None
        utilization.poll(self._prometheus, self.settings.prometheus, self.labeller, self.metrics,
                         clock=self._clock, stop=stop)

    def _loop(self, stop: threading.Event) -> None:
        """Decide and dispatch whenever woken (or a write falls due); a full pass every ``resync_interval``."""
        wake = self.labeller.wake
        last_full: float | None = None
        while not stop.is_set():
            wake.wait(self._sleep_for())
            wake.clear()
            self._heartbeat = self._clock()
            if stop.is_set() or not self.synced:
                continue
            now = self._clock()
            full = self._force_full or last_full is None or now - last_full >= self.settings.resync_interval
            try:
                self.labeller.reconcile(full=full)
                self.writes_pool.dispatch()
            except Exception:
                log.exception("reconcile pass failed")
                stop.wait(self.writes_pool.backoff.next())
                continue
            if full:
                self._force_full = False
                last_full = now
                self.metrics.full_sync_done()

    def _sleep_for(self) -> float:
        """Until the next node write falls due, at most a second (the heartbeat)."""
        ceiling = min(1.0, self.settings.resync_interval)
        at = self.labeller.next_write_at()
        if at is None or not self.writes():
            return ceiling
        return max(0.0, min(ceiling, max(at, self.writes_pool.paused_until) - self._clock()))

    def _shut_down(self, lease_thread: threading.Thread | None) -> None:
        for informer in (self.nodes, self.pods, self.priority_classes):
            if informer is not None:
                informer.close()
        self.dra.close()
        self.templates.close()
        if self.mover is not None:
            self.mover.close()
        if self.usage is not None:
            self.usage.close()
        self.writes_pool.shutdown()
        if self.elector is not None:
            if lease_thread is not None:
                lease_thread.join(timeout=15)  # a renewal in flight ends before we release
            self.elector.release()
        if self.health is not None:
            self.health.stop()
        if self.extender_cache is not None:
            self.extender_cache.stop()
        log.info("balancer stopped", extra={"fields": {"identity": self.settings.lease.identity}})
