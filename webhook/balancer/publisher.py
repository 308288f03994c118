"""Writes the GPUInventory into its ConfigMap (the kubernetes-client edge of ``inventory``).

The leader alone writes, and asks right before each write (fencing, as for node patches). It
writes when the content changed (at most once per ``min_interval``, so a burst of binds costs one
write) and when the last write is ``refresh`` seconds old (a new ``generatedAt``, which keeps the
webhook's freshness bound). A new leader writes at once: it cannot know what its predecessor
wrote last, and one write too many costs nothing.

Create or update: a get first (404: create), then a replace carrying the resourceVersion that get
returned, so two writers (a deposed leader that has not noticed yet) cannot both win a race; a
409 is retried on the next turn with a fresh get. The Role grants get and update on this one
name, and create (which RBAC cannot restrict by name) in the namespace.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import kubeclient
from webhook.balancer.metrics import Metrics
from webhook.balancer.settings import InventorySettings
from webhook.placement import gpuinventory as inventory

log = logging.getLogger("gpugate.balancer.inventory")

MANAGED_BY = "gpugate-balancer"
TICK = 1.0
"""Longest sleep between looks, so leadership changes and due refreshes are noticed within a second."""


class InventoryPublisher:
    """One thread: compute the inventory from a snapshot of the caches, write it when due."""

    def __init__(self, api: client.ApiClient, settings: InventorySettings, *, namespace: str,
                 content: Callable[[], inventory.Content | None], may_write: Callable[[], bool],
                 metrics: Metrics, on_error: Callable[[str, BaseException], None],
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC), dry_run: bool = False) -> None:
        self._core = client.CoreV1Api(api)
        self._dry_run = dry_run
        """Log each different inventory it would write instead of writing it (``gpugate balance --dry-run``)."""
        self.settings = settings
        self.namespace = namespace
        self._content = content
        self._may_write = may_write
        self._metrics = metrics
        self._on_error = on_error
        self._clock = clock
        self._wall_clock = wall_clock
        self.changed = threading.Event()
        """Set by the informers' callbacks: the caches moved, look again."""
        self._written: inventory.Content | None = None
        self._written_at: float | None = None
        self._looked_at = -1e18

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop``; never raises (a failed write is logged, counted and retried)."""
        s = self.settings
        while not stop.is_set():
            self.changed.wait(self._sleep_for())
            if stop.is_set():
                break
            if not self._dry_run and not self._may_write():
                self._written, self._written_at = None, None  # a later leadership starts with a write
                self.changed.clear()
                continue
            now = self._clock()
            last = max(self._written_at or -1e18, self._looked_at)
            if now - last < s.min_interval:
                # At most one look per interval: ``changed`` stays set, looked at when the interval ends.
                stop.wait(s.min_interval - (now - last))
                continue
            self.changed.clear()
            found = self._content()
            if found is None:  # caches not synced yet: a partial view must not be published
                continue
            self._looked_at = now
            if self._dry_run:
                if found != self._written:  # each different inventory once; no refreshes to show
                    self._log_dry(found)
                    self._written = found
                continue
            due = self._written_at is None or now - self._written_at >= s.refresh
            if found == self._written and not due:
                continue
            try:
                self.write(found)
            except Exception as err:
                self._metrics.inventory_writes.labels("error").inc()
                self._on_error("inventory.write", err)
                log.warning("inventory not written", extra={"fields": {
                    "configmap": f"{self.namespace}/{s.name}", "error": kubeclient.failure(err)}})
                self._written_at = now  # retried after min_interval, not in a tight loop
                self._written = None
                self.changed.set()
                continue
            # From when the write is done, not when it was decided: a slow API server must not
            # bring the next refresh closer.
            self._written, self._written_at = found, self._clock()

    def _sleep_for(self) -> float:
        if self._written_at is None:
            return TICK
        due_in = self._written_at + self.settings.refresh - self._clock()
        return max(0.0, min(TICK, due_in))

    def _log_dry(self, found: inventory.Content) -> None:
        doc = inventory.document(found, generated_at=self._wall_clock())
        log.info("dry run: would publish inventory", extra={"fields": {
            "configmap": f"{self.namespace}/{self.settings.name}", "key": self.settings.key, "inventory": doc}})

    def write(self, found: inventory.Content) -> None:
        """Create or replace the ConfigMap with ``found`` stamped now; raises what the API answers."""
        s = self.settings
        text = inventory.serialize(inventory.document(found, generated_at=self._wall_clock()))
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": s.name, "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/managed-by": MANAGED_BY,
                                    "app.kubernetes.io/part-of": "gpugate"}},
            "data": {s.key: text},
        }
        current: dict[str, Any] | None
        try:
            response = self._core.read_namespaced_config_map(s.name, self.namespace, _preload_content=False,
                                                             _request_timeout=(10, 30))
            current = orjson.loads(cast(Any, response).data)
        except ApiException as err:
            if err.status != 404:
                raise
            current = None
        # Fencing: asked right before the write, never once for a whole turn.
        if not self._may_write():
            return
        if current is None:
            self._core.create_namespaced_config_map(self.namespace, cast(Any, body), field_manager=MANAGED_BY,
                                                    _request_timeout=(10, 30))
            action = "created"
        else:
            meta = current.get("metadata") or {}
            body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
            body["metadata"]["labels"] = {**(meta.get("labels") or {}), **body["metadata"]["labels"]}
            if meta.get("annotations"):
                body["metadata"]["annotations"] = meta["annotations"]
            self._core.replace_namespaced_config_map(s.name, self.namespace, cast(Any, body), field_manager=MANAGED_BY,
                                                     _request_timeout=(10, 30))
            action = "updated"
        self._metrics.inventory_writes.labels("ok").inc()
        self._metrics.inventory_last_write.set(self._wall_clock().timestamp())
        log.info("inventory published", extra={"fields": {
            "configmap": f"{self.namespace}/{s.name}", "action": action, "offers": len(found.offers),
            "free": {f"{o.resource}|{o.product}": o.free for o in found.offers},
            "default_priority_class": found.default_priority_class}})


