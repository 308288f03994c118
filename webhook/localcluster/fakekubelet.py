"""A fake kubelet for many fake GPU nodes: what a real kubelet tells the API server, minus containers.

Why: the scheduler, the node-lifecycle controller, the Job controller and our balancer only see
what kubelets write to the API server. This module writes the same things, with the real
``kubernetes`` client against the real API server (no mocks):

- a Node per :class:`NodeSpec`, with realistic capacity/allocatable (cpu, memory, pods,
  ephemeral-storage, ``nvidia.com/gpu`` and, if asked, ``nvidia.com/gpu.shared`` and MIG
  resources) and the labels GPU Feature Discovery would put on it; kept Ready through
  ``nodes/status`` and a Lease in ``kube-node-lease`` renewed every 10 s, as kubelets do;
- pods bound to one of our nodes become Running and Ready through ``pods/status``; with a
  :class:`PodLifecycle` they go the way a kubelet takes them: Pending (``ContainerCreating``) for a
  while, Running but not Ready until a readiness delay has passed, or, for a container whose image
  is configured as bad, Running and never Ready, its ``restartCount`` rising in
  ``CrashLoopBackOff`` (what k8s-operator-libs reads to fail a driver upgrade);
- pods labelled ``e2e.gpugate.io/complete-after: "<seconds>"`` become Succeeded (exit code 0)
  that long after they started, which is how a test makes a Job complete; a pod with
  ``restartPolicy: Never`` whose image is one of ``PodLifecycle.crash_images`` becomes Failed
  (exit code 1) instead, which is how a test fails a GPU's validation pod;
- pods that are Terminating (deletionTimestamp set) on our nodes are force-deleted (grace 0),
  or they would stay Terminating forever and block, for example, a Job's completion; with
  ``PodLifecycle.honour_grace`` only once their ``deletionGracePeriodSeconds`` (the pod's
  ``terminationGracePeriodSeconds`` unless the delete asked for another) have passed, as a kubelet
  waits for containers to stop.

Pods are followed with one list+watch, not polling, so a test sees Running within milliseconds
of the scheduler's binding. Only nodes this object created are touched, so it can also run
against an existing cluster (``GPUGATE_E2E_KUBECONFIG``) next to real nodes.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.localcluster.kubeletobjects import (
    COMPLETE_AFTER,
    FAKE_NODE,
    LEASE_DURATION_SECONDS,
    LEASE_RENEW_SECONDS,
    NODE_LEASE_NAMESPACE,
    STRATEGIC,
    WATCH_TIMEOUT_SECONDS,
    FakeNode,
    NodeSpec,
    Obj,
    PodLifecycle,
    crashloop_status,
    creating_status,
    exited_status,
    lease_manifest,
    micro_time,
    node_manifest,
    node_status,
    ready_status,
    rfc3339,
    running_status,
    succeeded_status,
)

__all__ = [  # the vocabulary of kubeletobjects too: tests and the demo import it from here
    "FakeKubelet", "FakeNode", "json_lines", "COMPLETE_AFTER", "FAKE_NODE", "NODE_LEASE_NAMESPACE",
    "LEASE_DURATION_SECONDS", "LEASE_RENEW_SECONDS", "WATCH_TIMEOUT_SECONDS", "STRATEGIC", "NodeSpec",
    "PodLifecycle", "rfc3339", "micro_time", "node_manifest", "node_status", "lease_manifest",
    "creating_status", "ready_status", "crashloop_status", "running_status", "succeeded_status",
    "exited_status"]


# -- the loops ------------------------------------------------------------------------------


class FakeKubelet:
    """Serves every node added with :meth:`add_node` until :meth:`stop`.

    Three daemon threads: the heartbeat (Leases), the pod list+watch, and a timer for
    ``complete-after``. Errors in them are kept in :attr:`errors` (and shown by ``describe``)
    rather than lost, so a stuck test can say why.
    """

    def __init__(self, api: client.ApiClient, *, lease_renew_seconds: float = LEASE_RENEW_SECONDS,
                 lifecycle: PodLifecycle | None = None) -> None:
        self.api = api
        self.lifecycle = lifecycle or PodLifecycle()
        """Read at each pod's start and deletion: a test may replace it while the kubelet runs."""
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.lease_renew_seconds = lease_renew_seconds
        self.errors: list[str] = []
        self._nodes: dict[str, FakeNode] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._indexes = itertools.count()
        self._pod_serial = itertools.count()
        self._timer_serial = itertools.count()
        self._started: set[str] = set()  # pod uids we made Running
        self._terminating: set[str] = set()  # pod uids whose grace period is being waited out
        self._timers: list[tuple[float, int, Callable[[], object]]] = []
        self._timer_wakeup = threading.Condition(self._lock)
        self._watch_response: Any = None
        self._kubelet_version = ""

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeKubelet:
        self._kubelet_version = client.VersionApi(self.api).get_code().git_version
        for target, name in ((self._heartbeat_loop, "heartbeat"), (self._pod_loop, "pods"),
                             (self._timer_loop, "timers")):
            thread = threading.Thread(target=target, name=f"fake-kubelet-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop the loops; nodes stay (the control plane goes away anyway, or a test removes them)."""
        self._stopping.set()
        with self._timer_wakeup:
            self._timer_wakeup.notify_all()
        response = self._watch_response
        if response is not None:
            try:
                response.shutdown()  # unblocks the watch thread's read at once
            except Exception:
                pass
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    # -- nodes -----------------------------------------------------------------------------

    def add_node(self, spec: NodeSpec, *, wait_schedulable: bool = True, timeout: float = 60.0) -> Obj:
        """Create the Node and its Lease, post a Ready status, and (by default) wait until the
        node-lifecycle controller has removed the ``not-ready`` taint, so pods can land on it."""
        created = _raw(self.core.create_node, node_manifest(spec))
        node = FakeNode(spec=spec, uid=created["metadata"]["uid"], index=next(self._indexes))
        with self._lock:
            self._nodes[spec.name] = node
        self._post_status(node)
        self._renew_lease(node)
        if wait_schedulable:
            self.wait_schedulable(spec.name, timeout=timeout)
        return _raw(self.core.read_node, spec.name)

    def wait_schedulable(self, name: str, *, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            node = _raw(self.core.read_node, name)
            taints = {t["key"] for t in node["spec"].get("taints") or []}
            if not taints & {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {name} still has taints {sorted(taints)} after {timeout:.0f}s "
                                   f"(is kube-controller-manager running?)")
            time.sleep(0.1)

    def remove_node(self, name: str) -> None:
        """Delete the node; its pods are force-deleted first, as a drained node's would be gone."""
        with self._lock:
            self._nodes.pop(name, None)
        pods = _raw(self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={name}")["items"]
        for pod in pods:
            meta = pod["metadata"]
            self._force_delete(meta["namespace"], meta["name"], meta["uid"])
        _ignore_missing(lambda: self.core.delete_node(name))

    @property
    def node_names(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._nodes)

    def describe(self) -> str:
        """One paragraph for a failure message: nodes served and the last errors seen."""
        errors = "\n".join(self.errors[-10:]) or "none"
        return f"fake kubelet serving {sorted(self.node_names)}; last errors:\n{errors}"

    def _post_status(self, node: FakeNode) -> None:
        body = node_status(node.spec, address=node.address, kubelet_version=self._kubelet_version, now=time.time())
        self.core.patch_node_status(node.spec.name, body, _content_type=STRATEGIC)

    def _renew_lease(self, node: FakeNode) -> None:
        now = time.time()
        body = {"spec": {"holderIdentity": node.spec.name, "renewTime": micro_time(now)}}
        try:
            self.coordination.patch_namespaced_lease(node.spec.name, NODE_LEASE_NAMESPACE, body,
                                                     _content_type="application/merge-patch+json")
        except ApiException as error:
            if error.status != 404:
                raise
            manifest = lease_manifest({"metadata": {"name": node.spec.name, "uid": node.uid}}, now=now)
            try:
                _raw(self.coordination.create_namespaced_lease, NODE_LEASE_NAMESPACE, manifest)
            except ApiException as conflict:
                # add_node and the heartbeat thread can both find the Lease missing for a new node;
                # whichever creates it second has nothing left to do (it was just renewed).
                if conflict.status != 409:
                    raise

    def _heartbeat_loop(self) -> None:
        while not self._stopping.wait(self.lease_renew_seconds):
            with self._lock:
                nodes = list(self._nodes.values())
            for node in nodes:
                self._guard(f"renewing the lease of {node.spec.name}", functools.partial(self._renew_lease, node))

    # -- pods ------------------------------------------------------------------------------

    def _pod_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                version: str | None = self._list_pods()
                while version and not self._stopping.is_set():
                    version = self._watch_pods(version)
            except Exception as error:
                if not self._stopping.is_set():
                    self._note(f"pod watch: {error!r}")
                    self._stopping.wait(0.5)

    def _list_pods(self) -> str:
        listing = _raw(self.core.list_pod_for_all_namespaces, field_selector="spec.nodeName!=")
        for pod in listing["items"]:
            self._on_pod(pod)
        return str(listing["metadata"]["resourceVersion"])

    def _watch_pods(self, version: str) -> str | None:
        """Follow pod events from ``version``; the version to resume from, or None to relist."""
        response: Any = self.core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=", watch=True, resource_version=version,
            allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT_SECONDS, _preload_content=False)
        self._watch_response = response
        try:
            for event in json_lines(response):
                kind, pod = event["type"], event["object"]
                if kind == "ERROR":
                    if pod.get("code") == 410:  # too old: list again
                        return None
                    raise RuntimeError(f"watch error: {pod}")
                version = pod["metadata"]["resourceVersion"]
                if kind in ("ADDED", "MODIFIED"):
                    self._on_pod(pod)
                elif kind == "DELETED":
                    with self._lock:
                        self._started.discard(pod["metadata"]["uid"])
                        self._terminating.discard(pod["metadata"]["uid"])
        finally:
            self._watch_response = None
            response.release_conn()
        return version

    def _on_pod(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        with self._lock:
            node = self._nodes.get(spec.get("nodeName", ""))
            started = meta["uid"] in self._started
        if node is None:
            return
        if meta.get("deletionTimestamp"):
            done = self._guard(f"force-deleting {meta['namespace']}/{meta['name']}", lambda: self._terminate(pod))
        elif not started and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
            done = self._guard(f"starting {meta['namespace']}/{meta['name']}", lambda: self._start_pod(node, pod))
        else:
            done = True
        if not done:  # no new event may come for this pod: look again in a second
            self._later(1.0, lambda: self._guard("re-reading a pod", lambda: self._revisit(meta)))

    def _revisit(self, meta: Obj) -> None:
        try:
            pod = _raw(self.core.read_namespaced_pod, meta["name"], meta["namespace"])
        except ApiException as error:
            if error.status == 404:
                return
            raise
        if pod["metadata"]["uid"] == meta["uid"]:
            self._on_pod(pod)

    def _terminate(self, pod: Obj) -> None:
        """A Terminating pod: gone at once, or once its grace period has passed (PodLifecycle)."""
        meta = pod["metadata"]
        lifecycle = self.lifecycle
        grace = min(float(meta.get("deletionGracePeriodSeconds") or 0), lifecycle.max_grace_seconds)
        if not lifecycle.honour_grace or grace <= 0:
            self._force_delete(meta["namespace"], meta["name"], meta["uid"])
            return
        with self._lock:
            if meta["uid"] in self._terminating:
                return
            self._terminating.add(meta["uid"])
        self._later(grace, lambda: self._guard(
            f"deleting {meta['namespace']}/{meta['name']} after its grace period",
            lambda: self._force_delete(meta["namespace"], meta["name"], meta["uid"])))

    def _patch_if_current(self, meta: Obj, status: Obj) -> Obj | None:
        """Patch the status of this very pod (same uid, not Terminating); None when it is gone."""
        try:
            current = _raw(self.core.read_namespaced_pod, meta["name"], meta["namespace"])
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        if current["metadata"]["uid"] != meta["uid"] or current["metadata"].get("deletionTimestamp"):
            return None
        return _raw(self.core.patch_namespaced_pod_status, meta["name"], meta["namespace"], status,
                    _content_type=STRATEGIC)

    def _start_pod(self, node: FakeNode, pod: Obj) -> None:
        meta = pod["metadata"]
        lifecycle = self.lifecycle
        if lifecycle.creating_seconds > 0:
            _raw(self.core.patch_namespaced_pod_status, meta["name"], meta["namespace"],
                 creating_status(pod, host_ip=node.address, now=time.time()), _content_type=STRATEGIC)
            with self._lock:
                self._started.add(meta["uid"])
            self._later(lifecycle.creating_seconds, lambda: self._guard(
                f"running {meta['namespace']}/{meta['name']}", lambda: self._run_pod(node, pod, lifecycle)))
            return
        self._run_pod(node, pod, lifecycle, fresh=True)

    def _run_pod(self, node: FakeNode, pod: Obj, lifecycle: PodLifecycle, *, fresh: bool = False) -> None:
        """Containers started; ``fresh`` when ``pod`` was just read (no need to check it is still there)."""
        meta = pod["metadata"]
        crashes = lifecycle.crashes(pod)
        ready = lifecycle.ready_seconds <= 0 and not crashes and not lifecycle.never_ready(pod)
        status = running_status(pod, host_ip=node.address, pod_ip=node.pod_ip(next(self._pod_serial)),
                                now=time.time(), ready=ready)
        if fresh:
            running: Obj | None = _raw(self.core.patch_namespaced_pod_status, meta["name"], meta["namespace"],
                                       status, _content_type=STRATEGIC)
            with self._lock:
                self._started.add(meta["uid"])
        else:
            running = self._patch_if_current(meta, status)
        if running is None:
            return
        current = running
        if crashes and pod["spec"].get("restartPolicy") == "Never":
            # No restart: the container's exit 1 ends the pod, Failed (how a check pod reports its failure).
            self._later(lifecycle.restart_seconds, lambda: self._guard(
                f"failing {meta['namespace']}/{meta['name']}", lambda: self._patch_if_current(
                    meta, exited_status(current, now=time.time(), exit_code=1))))
            return
        if crashes:
            self._later(lifecycle.restart_seconds, lambda: self._guard(
                f"crash-looping {meta['namespace']}/{meta['name']}", lambda: self._crash(pod, 1, lifecycle)))
            return
        if not ready and not lifecycle.never_ready(pod):
            self._later(lifecycle.ready_seconds, lambda: self._guard(
                f"readying {meta['namespace']}/{meta['name']}",
                lambda: self._patch_if_current(meta, ready_status(current, now=time.time()))))
        after = (meta.get("labels") or {}).get(COMPLETE_AFTER)
        if (exits := (float(after), 0) if after is not None else lifecycle.exits(pod)) is not None:
            seconds, code = exits
            self._later(seconds, lambda: self._guard(
                f"completing {meta['namespace']}/{meta['name']}", lambda: self._complete_pod(current, code)))

    def _crash(self, pod: Obj, restarts: int, lifecycle: PodLifecycle) -> None:
        """One more exit 1 and restart; again after ``restart_seconds`` up to ``max_restarts``."""
        if self._patch_if_current(pod["metadata"], crashloop_status(pod, restarts=restarts, now=time.time())) is None:
            return
        if restarts < lifecycle.max_restarts:
            self._later(lifecycle.restart_seconds, lambda: self._guard(
                f"crash-looping {pod['metadata']['name']}", lambda: self._crash(pod, restarts + 1, lifecycle)))

    def _complete_pod(self, pod: Obj, exit_code: int = 0) -> None:
        meta = pod["metadata"]
        current = _raw(self.core.read_namespaced_pod, meta["name"], meta["namespace"])["metadata"]
        if current["uid"] != meta["uid"] or current.get("deletionTimestamp"):
            return
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"],
                                              exited_status(pod, now=time.time(), exit_code=exit_code),
                                              _content_type=STRATEGIC)

    def _force_delete(self, namespace: str, name: str, uid: str) -> None:
        """What a kubelet does once containers are gone: delete with grace 0, only this very pod."""
        options = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid))
        _ignore_missing(lambda: self.core.delete_namespaced_pod(name, namespace, body=options,
                                                                grace_period_seconds=0))

    # -- timers ----------------------------------------------------------------------------

    def _later(self, seconds: float, action: Callable[[], object]) -> None:
        with self._timer_wakeup:
            heapq.heappush(self._timers, (time.monotonic() + seconds, next(self._timer_serial), action))
            self._timer_wakeup.notify()

    def _timer_loop(self) -> None:
        while not self._stopping.is_set():
            with self._timer_wakeup:
                due: list[Callable[[], object]] = []
                while self._timers and self._timers[0][0] <= time.monotonic():
                    due.append(heapq.heappop(self._timers)[2])
                if not due:
                    wait = self._timers[0][0] - time.monotonic() if self._timers else None
                    self._timer_wakeup.wait(wait)
                    continue
            for action in due:
                action()

    # -- errors ----------------------------------------------------------------------------

    def _guard(self, what: str, action: Callable[[], object]) -> bool:
        """Run ``action``; on an error keep it for :meth:`describe` and return False."""
        try:
            action()
            return True
        except Exception as error:
            if not self._stopping.is_set():
                self._note(f"{what}: {error!r}"[:2000])
            return False

    def _note(self, message: str) -> None:
        self.errors.append(f"{time.strftime('%H:%M:%S')} {message}")


def _raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
    """Call an API method for the JSON the server sent: every field kept, camelCase as on the wire."""
    response = call(*args, _preload_content=False, **kwargs)
    try:
        return dict(json.loads(response.data))
    finally:
        response.release_conn()


def json_lines(response: Any) -> Iterator[Obj]:
    """JSON objects from a chunked watch response, one per line, across chunk boundaries."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)


def _ignore_missing(action: Callable[[], object]) -> None:
    """Deleting what is already gone (404) or was replaced (409 on a uid precondition) is fine."""
    try:
        action()
    except ApiException as error:
        if error.status not in (404, 409):
            raise
