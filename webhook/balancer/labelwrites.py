"""The writers: a small pool that patches the nodes whose write the ``Labeller`` scheduled.

Writes are coalesced per node (``backoff.WriteSchedule``: the latest wanted marks win, a node is
patched at most once per ``write_interval``; only marks appearing or going away go at once) and
paced by a token bucket (``write_qps``, ``write_burst``) shared by the pool; a 429 pauses every
writer for its ``Retry-After``. A writer asks ``may_write`` (the lease) right before each patch
(fencing), never once for a whole pass.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kubernetes.client.exceptions import ApiException

from webhook import kubeclient
from webhook.balancer.backoff import Backoff, TokenBucket
from webhook.balancer.cluster import NodeWriter, retry_after
from webhook.balancer.labeller import Labeller
from webhook.balancer.metrics import Metrics
from webhook.kube.gpunode import NodeInfo
from webhook.placement import marks as marks_mod

log = logging.getLogger("gpugate.balancer")

RETRY_AFTER_DEFAULT = 1.0  # a 429 without Retry-After: wait this long before the next write


class LabelWrites:
    """Hands due nodes to a pool of ``write_concurrency`` writers; see the module docstring."""

    def __init__(self, labeller: Labeller, writer: NodeWriter, *, metrics: Metrics,
                 may_write: Callable[[], bool], on_error: Callable[[str, BaseException], None],
                 clock: Callable[[], float], rng: random.Random) -> None:
        s = labeller.settings
        self._labeller = labeller
        self._writer = writer
        self._metrics = metrics
        self._may_write = may_write
        self._on_error = on_error
        self._clock = clock
        self._bucket = TokenBucket(s.write_qps, s.write_burst)
        self._bucket_lock = threading.Lock()
        self.paused_until = 0.0
        """A 429 holds every writer until then."""
        self.backoff = Backoff(s.backoff_initial, s.backoff_max, rng)
        self.stop_event = threading.Event()
        self._writes_ok = metrics.label_writes.labels("ok")
        self._pool: ThreadPoolExecutor | None = None

    def start(self, stop: threading.Event) -> None:
        self.stop_event = stop
        self._pool = ThreadPoolExecutor(self._labeller.settings.write_concurrency, thread_name_prefix="patch")

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def dispatch(self) -> int:
        """Hand the nodes whose write is due to the writers; returns how many."""
        if not self._may_write() or self._pool is None:
            return 0
        now = self._clock()
        if now < self.paused_until:
            return 0
        with self._labeller.lock:
            due = self._labeller.schedule.due(now)
        for name in due:
            self._pool.submit(self._write, name)
        return len(due)

    # ---- one write (pool threads) ---------------------------------------------------------------
    def _write(self, name: str) -> None:
        try:
            self._write_one(name)
        except Exception:  # never lose a node: it stays pending and the loop retries it
            log.exception("node write failed", extra={"fields": {"node": name}})
            self._retry(name, self._clock() + self.backoff.next())

    def _pace(self) -> bool:
        """Wait for a token and for any 429 pause to end; False if we are stopping meanwhile."""
        with self._bucket_lock:
            wait = self._bucket.reserve(self._clock())
        while True:
            paused = self.paused_until - self._clock()
            if max(wait, paused) <= 0:
                return not self.stop_event.is_set()
            if self.stop_event.wait(max(wait, paused)):
                return False
            wait = 0.0

    def _write_one(self, name: str) -> None:
        lab = self._labeller
        if not self._pace():
            with lab.lock:
                lab.schedule.release(name)
            return
        with lab.lock:
            want = lab.schedule.take(name)  # the newest wanted marks, read as late as possible
            node = lab.ledger.nodes.get(name)
            patch = None if want is None or node is None else marks_mod.node_patch(node, want)
            if patch is None or node is None or want is None:
                lab.schedule.drop(name)
                lab.schedule.release(name)
                return
        if not self._may_write():  # fencing: asked right before the patch
            with lab.lock:
                lab.schedule.release(name)
            return
        try:
            self._writer.patch(name, patch)
        except ApiException as err:
            self._refused(node, err)
            return
        except Exception as err:
            self._metrics.label_writes.labels("error").inc()
            self._on_error("patch_node", err)
            log.warning("node patch failed", extra={"fields": {"node": name, "error": kubeclient.failure(err)}})
            self._retry(name, self._clock() + self.backoff.next())
            return
        self._written(node, want)

    def _written(self, node: NodeInfo, want: marks_mod.Marks) -> None:
        lab, name = self._labeller, node.name
        with lab.lock:
            current = lab.ledger.nodes.get(name)
            # Keep what we wrote unless the watch has already delivered something newer.
            if current is not None and current.resource_version == node.resource_version:
                lab.ledger.nodes[name] = marks_mod.after_patch(current, want)
            lab.schedule.written(name, want, self._clock())
        self.backoff.reset()
        self._writes_ok.inc()
        log.info("node marks updated", extra={"fields": {"node": name, "changes": marks_mod.describe(node, want)}})

    def _refused(self, node: NodeInfo, err: ApiException) -> None:
        name = node.name
        now = self._clock()
        if err.status == 404:  # deleted meanwhile; the watch will drop it
            with self._labeller.lock:
                self._labeller.schedule.forget(name)
            return
        if err.status == 429:
            wait = retry_after(err)
            wait = RETRY_AFTER_DEFAULT if wait is None else wait
            self.paused_until = max(self.paused_until, now + wait)
            self._metrics.label_writes.labels("throttled").inc()
            log.warning("API server asks us to slow down: pausing node writes",
                        extra={"fields": {"node": name, "retry_after_s": wait}})
            retry_at = now + wait
        elif err.status == 409:  # the node changed under a taint patch: wait for the watch's fresh copy
            self._metrics.label_writes.labels("conflict").inc()
            retry_at = now + self._labeller.settings.backoff_initial
        else:
            self._metrics.label_writes.labels("error").inc()
            self._on_error("patch_node", err)
            log.warning("node patch failed", extra={"fields": {"node": name, "error": f"{err.status} {err.reason}"}})
            retry_at = now + max(self.backoff.next(), retry_after(err) or 0.0)
        self._retry(name, retry_at)

    def _retry(self, name: str, retry_at: float) -> None:
        with self._labeller.lock:
            self._labeller.schedule.failed(name, retry_at=retry_at)
        self._labeller.wake.set()
