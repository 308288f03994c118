"""Leader election on a ``coordination.k8s.io/v1`` Lease, the way client-go does it.

Shared by the edges that must have one writer: the balancer's leader and the stack's canary controller.

Expiry is judged on this replica's own clock, from the moment it last saw the lease record
change, never by comparing the holder's ``renewTime`` with our wall clock: two nodes' clocks
may disagree by more than a lease duration. The leader stops writing once it has failed to
renew for ``renew_deadline`` (< ``duration``), so it is silent before any standby may start.

Fencing, against a slow API server: the leader counts its deadline from the moment it *sent*
the renewal that succeeded, not from the answer (the API server may have stored it, and a
standby seen it, long before a slow answer came back; counting from the answer let both
replicas lead at once), and the controller asks :meth:`LeaderElector.is_leader` right before
every single write, not once per pass. Release (on SIGTERM) waits for a renewal in flight,
then empties ``holderIdentity`` so a standby takes over at its next retry; no round runs after
it, so a late renewal cannot take the lease back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import kubeclient

log = logging.getLogger("gpugate.lease")

Obj = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class LeaseSettings:
    """Leader election: one replica writes, the others keep caches warm."""

    name: str = "gpugate-balancer"
    namespace: str = ""
    """Empty: ``$POD_NAMESPACE`` (downward API), else ``gpugate-system``; resolved by the command."""
    identity: str = ""
    """This replica's name in the Lease. Empty: ``$POD_NAME``, else the host name."""
    duration: float = 15.0
    """Seconds a standby waits after the last renewal it saw before taking over (client-go default)."""
    renew_deadline: float = 10.0
    """Seconds the leader keeps writing without a successful renewal; must be below ``duration``
    so it stops before a standby can start (no two writers)."""
    retry_period: float = 2.0
    """Seconds between acquire/renew attempts."""
    enabled: bool = True
    """False: act as the only writer (a single replica, or tests); ``--dry-run`` also skips it."""


def micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Observation:
    """The last lease record we saw and when (our monotonic clock) we first saw it."""

    record: tuple[Any, ...]
    seen_at: float


def may_acquire(spec: Obj, *, me: str, observed: Observation, now: float) -> bool:
    """True when ``me`` may take or keep the lease described by ``spec`` (pure).

    Free (no holder), ours, or not renewed within its duration since we saw it last change.
    """
    holder = spec.get("holderIdentity") or ""
    if not holder or holder == me:
        return True
    duration = float(spec.get("leaseDurationSeconds") or 0)
    return now >= observed.seen_at + duration


class LeaderElector:
    """Acquire and renew one Lease in a loop; ``is_leader()`` is safe to call from any thread."""

    def __init__(self, api: client.ApiClient, settings: LeaseSettings, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 on_change: Callable[[bool], None] = lambda leading: None,
                 on_error: Callable[[str, BaseException], None] = lambda op, err: None) -> None:
        self._api = client.CoordinationV1Api(api)
        self._settings = settings
        self._clock = clock
        self._wall = wall
        self._on_change = on_change
        self._on_error = on_error
        self._observed: Observation | None = None
        self._renewed_at: float | None = None  # monotonic time we sent our last successful write
        self._leading = False
        self._published = False
        self._closed = False
        self._lock = threading.Lock()  # guards the fields above; never held across a request
        self._round = threading.Lock()  # one acquire/renew/release round at a time

    @property
    def identity(self) -> str:
        return self._settings.identity

    def is_leader(self) -> bool:
        with self._lock:
            return self._leading and self._renewed_at is not None and \
                self._clock() - self._renewed_at < self._settings.renew_deadline

    def run(self, stop: threading.Event) -> None:
        """Try to acquire or renew every ``retry_period`` until ``stop`` or :meth:`release`; never raises."""
        while not stop.is_set() and not self._closed:
            try:
                self.try_acquire_or_renew()
            except Exception as err:
                self._on_error("lease", err)
                log.warning("lease update failed", extra={"fields": {"error": kubeclient.failure(err)}})
            self._publish()
            stop.wait(self._settings.retry_period)

    def _publish(self) -> None:
        leading = self.is_leader()
        with self._lock:
            changed = leading != self._published
            self._published = leading
        if changed:
            log.info("leadership changed", extra={"fields": {"leader": leading, "identity": self.identity}})
            self._on_change(leading)

    def try_acquire_or_renew(self) -> bool:
        """One round: read the lease, then create, renew or take it over if allowed."""
        with self._round:
            if self._closed:
                return self._lost()
            return self._acquire_or_renew()

    def _acquire_or_renew(self) -> bool:
        s = self._settings
        now_wall = micro_time(self._wall())
        try:
            lease = kubeclient.raw_json(self._api.read_namespaced_lease(s.name, s.namespace, _preload_content=False,
                                                                        _request_timeout=(5, 10)))
        except ApiException as err:
            if err.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": s.name, "namespace": s.namespace},
                    "spec": self._spec(now_wall, acquire=now_wall, transitions=0)}
            sent_at = self._clock()
            try:
                self._api.create_namespaced_lease(s.namespace, kubeclient.body(body), _preload_content=False,
                                                  _request_timeout=(5, 10))
            except ApiException as create_err:
                if create_err.status == 409:  # another replica created it first
                    return self._lost()
                raise
            return self._won(sent_at)
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"),
                  lease["metadata"].get("resourceVersion"))
        now = self._clock()
        if self._observed is None or self._observed.record != record:
            self._observed = Observation(record, now)
        if not may_acquire(spec, me=s.identity, observed=self._observed, now=now):
            return self._lost()
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == s.identity else 1)
        acquire = spec.get("acquireTime") if holder == s.identity else now_wall
        lease["spec"] = self._spec(now_wall, acquire=acquire, transitions=transitions)
        # The deadline counts from here: the API server may store this write (and a standby see
        # it) any time after it leaves, however late the answer comes back.
        sent_at = self._clock()
        try:
            self._api.replace_namespaced_lease(s.name, s.namespace, lease, _preload_content=False,
                                               _request_timeout=(5, 10))
        except ApiException as err:
            if err.status == 409:  # someone wrote in between: they hold it now
                return self._lost()
            raise
        return self._won(sent_at)

    def release(self) -> None:
        """Give the lease up if we hold it (SIGTERM), so a standby need not wait for expiry.

        Waits for a round in flight (a renewal that read the lease before our release would
        otherwise write it back, or one that reads it after would take the free lease again),
        and closes the elector: no round runs after this.
        """
        with self._round:
            self._closed = True
            with self._lock:
                was_leading = self._leading
                self._leading = False
            if not was_leading:
                self._publish()
                return
            self._release()

    def _release(self) -> None:
        s = self._settings
        try:
            lease = kubeclient.raw_json(self._api.read_namespaced_lease(s.name, s.namespace, _preload_content=False,
                                                                        _request_timeout=(5, 10)))
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != s.identity:
                return
            now_wall = micro_time(self._wall())
            lease["spec"] = dict(spec, holderIdentity=None, leaseDurationSeconds=1, renewTime=now_wall,
                                 acquireTime=now_wall)
            self._api.replace_namespaced_lease(s.name, s.namespace, lease, _preload_content=False,
                                               _request_timeout=(5, 10))
            log.info("lease released", extra={"fields": {"identity": s.identity}})
        except Exception as err:
            self._on_error("lease", err)
            log.warning("lease release failed", extra={"fields": {"error": kubeclient.failure(err)}})
        finally:
            self._publish()

    def _spec(self, now_wall: str, *, acquire: str | None, transitions: int) -> Obj:
        return {"holderIdentity": self._settings.identity,
                "leaseDurationSeconds": max(int(round(self._settings.duration)), 1),
                "acquireTime": acquire, "renewTime": now_wall, "leaseTransitions": transitions}

    def _won(self, sent_at: float) -> bool:
        with self._lock:
            self._leading = True
            self._renewed_at = sent_at
        return True

    def _lost(self) -> bool:
        with self._lock:
            self._leading = False
        return False
