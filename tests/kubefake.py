"""A small fake Kubernetes API server speaking the real paths and JSON, for tests and benchmarks.

Why a server and not a mock: the real ``kubernetes`` client must do the talking (its URL
building, content types, chunked watch parsing, error mapping), so only the far side of the
wire is faked (STYLE.md pattern 13).

What it serves, for every registered kind (core, apps, batch, rbac, coordination Lease,
admissionregistration webhook configurations, apiextensions CRDs, nvidia.com ClusterPolicy and
NVIDIADriver, argoproj Application, and anything added with :meth:`FakeKube.register`):

- ``GET`` list (``limit``/``continue`` paging, ``labelSelector``, basic ``fieldSelector``), the
  list's ``metadata.resourceVersion`` being the store's current revision;
- ``GET`` one object (and its ``/status`` or other subresource, served as the object);
- ``?watch=true`` chunked streams of ``{"type": ..., "object": ...}`` lines from a
  ``resourceVersion`` (or, without one, synthetic ``ADDED`` events for what exists; with
  ``sendInitialEvents=true`` a streaming list closed by the ``k8s.io/initial-events-end`` bookmark), honouring
  ``timeoutSeconds`` and selector transitions (an object leaving a selector is ``DELETED``);
  a too-old ``resourceVersion`` gets one ``ERROR`` event with a ``410`` Status, as the
  apiserver does;
- ``POST`` create (``generateName`` supported, ``409 AlreadyExists``), ``PUT`` replace
  (``409 Conflict`` on a stale ``metadata.resourceVersion``), ``PATCH`` with
  ``application/json-patch+json``, ``application/merge-patch+json`` and
  ``application/strategic-merge-patch+json`` (lists with a known merge key are merged by it,
  other lists replaced, ``$patch: delete`` honoured), ``DELETE``; ``dryRun`` persists nothing;
- discovery documents ``/api``, ``/apis``, ``/api/v1``, ``/apis/<group>/<version>``, ``/version``;
- what the balancer's tests lean on, as the apiserver does it: ``BOOKMARK`` events (every
  ``bookmark_interval`` seconds and just before a watch times out) for a watch that allows them;
  a patch or update that changes nothing is not a write (same resourceVersion, no event);
  graceful deletion (a bound pod gets ``deletionTimestamp`` and stays until deleted with grace 0,
  an object with finalizers stays until they are removed); ``429`` with ``Retry-After``.

Test helpers beyond the shared interface: ``put_many`` (bulk load), ``list``, ``count`` (cheap
polling), ``fail_next`` (inject an HTTP error, e.g. a 429 with ``Retry-After`` or a watch's 410, for
matching requests), ``delay`` (a slow API server for matching requests), ``open_watches`` (wait until
a client is watching); every request is kept in ``requests`` with its ``.query``, ``.user_agent``,
``.at`` (monotonic time it was handled, after any delay), ``.status`` (the code answered) and
``.headers`` (lower-case names).

Speed: each stored object is serialized once when written, so a list of 150,000 pods or a
burst of watch events is bytes concatenation, not JSON encoding; an event keeps that one copy
(its watch line is framed when sent), so 150,000 realistic pods cost their bytes once.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import jsonpatch
import orjson

from tests.kubeversion import KUBERNETES_MINOR

try:
    import pytest
except ImportError:  # benchmarks/balancer_scale.py runs the fake without the test extra
    pytest = None  # type: ignore[assignment]

Obj = dict[str, Any]

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"

# Strategic merge patch: list fields merged element by element on this key (from the Kubernetes
# types' patchMergeKey tags). A list not named here is replaced as a whole, as for node taints.
STRATEGIC_MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "env": "name",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "webhooks": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
}


@dataclass(frozen=True)
class ResourceType:
    """One registered kind: where it is served and whether it lives in a namespace."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


class Request(tuple):
    """One request the server received: ``(method, path, content_type, parsed_body)``.

    A 4-tuple so tests can unpack it; ``.query`` holds the parsed query string as well,
    ``.user_agent`` the client's User-Agent, ``.at`` the monotonic time the request was handled
    (after any injected delay: the moment it took effect) and ``.status`` the code answered
    (0 until the answer is sent; a watch is 200 once its stream starts).
    """

    query: dict[str, str]
    user_agent: str
    at: float
    status: int
    headers: dict[str, str]

    def __new__(cls, method: str, path: str, content_type: str | None, body: Any,
                query: dict[str, str], user_agent: str = "", at: float = 0.0) -> Request:
        self = super().__new__(cls, (method, path, content_type, body))
        self.query = query
        self.user_agent = user_agent
        self.at = at
        self.status = 0
        self.headers = {}
        return self

    method = property(lambda self: self[0])
    path = property(lambda self: self[1])
    content_type = property(lambda self: self[2])
    body = property(lambda self: self[3])


@dataclass
class _Entry:
    obj: Obj
    raw: bytes


@dataclass
class _Event:
    rv: int
    type: str
    obj: Obj
    prev: Obj | None
    raw: bytes  # the object's JSON, shared with the store's entry (framed into a line when sent)

    def line(self, etype: str | None = None) -> bytes:
        return b'{"type":"' + (etype or self.type).encode() + b'","object":' + self.raw + b"}\n"


@dataclass
class _Store:
    """Objects and the event history of one resource type."""

    rtype: ResourceType
    objects: dict[tuple[str, str], _Entry] = field(default_factory=dict)
    sorted_keys: list[tuple[str, str]] | None = None
    events: list[_Event] = field(default_factory=list)
    events_base: int = 0  # absolute index of events[0]
    compacted_rv: int = 0  # watches from a revision below this get 410

    def keys_in_order(self) -> list[tuple[str, str]]:
        if self.sorted_keys is None:
            self.sorted_keys = sorted(self.objects)
        return self.sorted_keys


class ApiError(Exception):
    """An answer other than success, rendered as a Kubernetes Status object."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> Obj:
        return {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "details": self.details, "code": self.code,
        }


@dataclass
class _Fault:
    method: str
    path: re.Pattern[str]
    code: int
    remaining: int
    query: dict[str, str] = field(default_factory=dict)
    user_agent: str | None = None
    retry_after: int | None = None
    reason: str | None = None
    message: str | None = None
    details: Obj | None = None
    delay: float = 0.0  # a delay rule (no error) when code is 0

    def matches(self, method: str, path: str, query: dict[str, str], user_agent: str) -> bool:
        return (self.remaining > 0 and self.method == method and self.path.search(path) is not None
                and all(query.get(k) == v or (v == "*" and k in query) for k, v in self.query.items())
                and (self.user_agent is None or self.user_agent in user_agent))


DRA_TYPES: tuple[tuple[str, str, str, str, bool], ...] = (
    ("resource.k8s.io", "v1", "ResourceSlice", "resourceslices", False),
    ("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", True),
    ("resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates", True),
    ("resource.k8s.io", "v1", "DeviceClass", "deviceclasses", False),
)
"""Dynamic Resource Allocation, GA since Kubernetes 1.34: not served unless a test registers them
(``for spec in DRA_TYPES: fk.register(*spec)``), so every other test sees a cluster without the API."""

DEFAULT_TYPES: tuple[tuple[str, str, str, str, bool], ...] = (
    ("", "v1", "Pod", "pods", True),
    ("", "v1", "Node", "nodes", False),
    ("", "v1", "Namespace", "namespaces", False),
    ("", "v1", "ConfigMap", "configmaps", True),
    ("", "v1", "Secret", "secrets", True),
    ("", "v1", "Service", "services", True),
    ("", "v1", "ServiceAccount", "serviceaccounts", True),
    ("", "v1", "Endpoints", "endpoints", True),
    ("", "v1", "Event", "events", True),
    ("", "v1", "PersistentVolume", "persistentvolumes", False),
    ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True),
    ("apps", "v1", "Deployment", "deployments", True),
    ("apps", "v1", "DaemonSet", "daemonsets", True),
    ("apps", "v1", "StatefulSet", "statefulsets", True),
    ("apps", "v1", "ReplicaSet", "replicasets", True),
    ("batch", "v1", "Job", "jobs", True),
    ("coordination.k8s.io", "v1", "Lease", "leases", True),
    ("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False),
    ("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration",
     "mutatingwebhookconfigurations", False),
    ("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration",
     "validatingwebhookconfigurations", False),
    ("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    ("nvidia.com", "v1", "ClusterPolicy", "clusterpolicies", False),
    ("nvidia.com", "v1alpha1", "NVIDIADriver", "nvidiadrivers", False),
    ("argoproj.io", "v1alpha1", "Application", "applications", True),
    ("argoproj.io", "v1alpha1", "AppProject", "appprojects", True),
)


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)  # compact, keys in insertion order: what json.dumps(separators=(",", ":")) gave


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKube:
    """An in-process fake API server on 127.0.0.1; start it, point a client at ``.url``."""

    def __init__(self, *, max_events: int = 1_000_000, record_requests: bool = True,
                 bookmark_interval: float = 1.0, watch_list: bool = True, require_namespaces: bool = False) -> None:
        self._lock = threading.Condition(threading.RLock())
        self._types: dict[tuple[str, str], ResourceType] = {}  # (group/version, plural)
        self._by_kind: dict[tuple[str, str], ResourceType] = {}  # (apiVersion, kind)
        self._stores: dict[tuple[str, str], _Store] = {}  # (group, plural) -> store
        self._rv = 1  # never "0": a watch from "0" means "from any point" to the apiserver
        self._expired_before = 0
        self._expire_generation = 0
        self._max_events = max_events
        self._record = record_requests
        self._faults: list[_Fault] = []
        self._delays: list[_Fault] = []
        self.bookmark_interval = bookmark_interval
        """Seconds between BOOKMARK events on a watch that allows them (the apiserver: about a minute)."""
        self.watch_list = watch_list
        """Serve streaming lists (``sendInitialEvents``); False answers 422, as an apiserver without
        the WatchList feature does."""
        self.require_namespaces = require_namespaces
        """Refuse a create in a namespace with no Namespace object, as the apiserver's NamespaceLifecycle
        admission plugin does (kubernetes/kubernetes plugin/pkg/admission/namespace/lifecycle/admission.go:
        404 NotFound, ``namespaces "NAME" not found``, details kind ``namespaces``). Off by default: most
        tests store objects in namespaces they never create."""
        self._open_watches: dict[str, int] = {}
        self._stopped = False
        self.requests: list[Request] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        for spec in DEFAULT_TYPES:
            self.register(*spec)

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> FakeKube:
        handler = type("_BoundHandler", (_Handler,), {"fake": self})
        server = _QuietServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="kubefake", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeKube is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # ---- registry --------------------------------------------------------------------------
    def register(self, group: str, version: str, kind: str, plural: str, namespaced: bool) -> None:
        """Serve ``kind`` at its real path (``/api/v1`` for the core group, else ``/apis/g/v``)."""
        rtype = ResourceType(group, version, kind, plural, namespaced)
        with self._lock:
            self._types[(rtype.api_version, plural)] = rtype
            self._by_kind[(rtype.api_version, kind)] = rtype
            self._stores.setdefault((group, plural), _Store(rtype))

    def _rtype_for(self, api_version: str, kind: str) -> ResourceType:
        try:
            return self._by_kind[(api_version, kind)]
        except KeyError:
            raise KeyError(f"kind {kind} in {api_version} is not registered; call register() first") from None

    # ---- direct access for tests -----------------------------------------------------------
    def put(self, obj: Obj) -> Obj:
        """Create or replace ``obj`` (by apiVersion, kind, namespace, name); return the stored copy."""
        rtype = self._rtype_for(obj["apiVersion"], obj["kind"])
        with self._lock:
            stored = self._write(rtype, copy.deepcopy(obj), create_only=False)
        return orjson.loads(self._stores[(rtype.group, rtype.plural)].objects[_key(rtype, stored)].raw)

    def put_many(self, objs: Iterable[Obj]) -> int:
        """Like :meth:`put` for many objects under one lock (objects are stored as given)."""
        count = 0
        with self._lock:
            for obj in objs:
                self._write(self._rtype_for(obj["apiVersion"], obj["kind"]), obj, create_only=False,
                            notify=False)
                count += 1
            self._lock.notify_all()
        return count

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        rtype = self._rtype_for(api_version, kind)
        with self._lock:
            entry = self._stores[(rtype.group, rtype.plural)].objects.get((namespace or "", name))
            return None if entry is None else orjson.loads(entry.raw)

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        rtype = self._rtype_for(api_version, kind)
        with self._lock:
            store = self._stores[(rtype.group, rtype.plural)]
            return [orjson.loads(e.raw) for k, e in sorted(store.objects.items())
                    if namespace is None or k[0] == namespace]

    def count(self, api_version: str, kind: str, predicate: Callable[[Obj], bool]) -> int:
        """How many stored objects of one kind satisfy ``predicate`` (given the stored dict: read only).

        Cheap enough to poll over thousands of objects, which :meth:`list` (decoding copies) is not.
        """
        rtype = self._rtype_for(api_version, kind)
        with self._lock:
            return sum(1 for entry in self._store(rtype).objects.values() if predicate(entry.obj))

    def stored_bytes(self, api_version: str, kind: str) -> int:
        """Total size of the stored JSON of one kind (what a full list would send)."""
        rtype = self._rtype_for(api_version, kind)
        with self._lock:
            return sum(len(entry.raw) for entry in self._store(rtype).objects.values())

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        """Remove the object at once, whatever its finalizers or grace period (a force delete)."""
        rtype = self._rtype_for(api_version, kind)
        with self._lock:
            self._remove(rtype, namespace or "", name)

    def expire_watches(self) -> None:
        """Make open watches, and new watches from any earlier revision, end with 410 Gone."""
        with self._lock:
            self._rv += 1
            self._expired_before = self._rv
            self._expire_generation += 1
            self._lock.notify_all()

    def fail_next(self, method: str, path_pattern: str, code: int = 500, count: int = 1, *,
                  query: dict[str, str] | None = None, user_agent: str | None = None,
                  retry_after: int | None = None, reason: str | None = None, message: str | None = None,
                  details: Obj | None = None) -> None:
        """Answer the next ``count`` requests matching ``method``, the path regex, every ``query``
        parameter given (``{"watch": "true"}``; ``"*"``: present with any value) and a User-Agent
        containing ``user_agent``, with
        ``code``. ``retry_after`` adds the ``Retry-After`` header and ``details.retryAfterSeconds``
        (as the apiserver's 429 does); ``reason``, ``message`` and ``details`` shape the Status."""
        with self._lock:
            self._faults.append(_Fault(method.upper(), re.compile(path_pattern), code, count, dict(query or {}),
                                       user_agent, retry_after, reason, message, details))

    def delay(self, method: str, path_pattern: str, seconds: float, count: int = 1_000_000, *,
              query: dict[str, str] | None = None, user_agent: str | None = None) -> None:
        """Hold matching requests ``seconds`` before handling them (a slow or far API server).

        The request takes effect (is stored, is answered) after the delay, as a write queued behind
        a slow etcd would. ``clear_delays`` removes every delay rule.
        """
        with self._lock:
            self._delays.append(_Fault(method.upper(), re.compile(path_pattern), 0, count, dict(query or {}),
                                       user_agent, delay=seconds))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def clear_delays(self) -> None:
        with self._lock:
            self._delays.clear()

    def open_watches(self, plural: str) -> int:
        """How many watch streams on ``plural`` are open now (to wait for a client to be watching)."""
        with self._lock:
            return self._open_watches.get(plural, 0)

    @property
    def resource_version(self) -> int:
        return self._rv

    # ---- store internals (call with the lock held) -----------------------------------------
    def _store(self, rtype: ResourceType) -> _Store:
        return self._stores[(rtype.group, rtype.plural)]

    def _write(self, rtype: ResourceType, obj: Obj, *, create_only: bool, expect_rv: str | None = None,
               dry_run: bool = False, notify: bool = True) -> Obj:
        meta = obj.setdefault("metadata", {})
        obj.setdefault("apiVersion", rtype.api_version)
        obj.setdefault("kind", rtype.kind)
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
            else:
                raise ApiError(422, "Invalid", f"{rtype.kind}: metadata.name: Required value")
        if rtype.namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        store = self._store(rtype)
        key = _key(rtype, obj)
        old = store.objects.get(key)
        if create_only and old is None and rtype.namespaced and self.require_namespaces:
            namespaces = self._store(self._rtype_for("v1", "Namespace"))
            if ("", meta["namespace"]) not in namespaces.objects:
                raise ApiError(404, "NotFound", f'namespaces "{meta["namespace"]}" not found',
                               {"name": meta["namespace"], "kind": "namespaces"})
        if old is not None and create_only:
            raise ApiError(409, "AlreadyExists", f'{rtype.plural} "{key[1]}" already exists',
                           {"name": key[1], "kind": rtype.plural})
        if old is not None and expect_rv and expect_rv != old.obj["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict",
                           f'Operation cannot be fulfilled on {rtype.plural} "{key[1]}": the object has been '
                           "modified; please apply your changes to the latest version and try again",
                           {"name": key[1], "kind": rtype.plural})
        if old is None:
            meta["uid"] = meta.get("uid") or str(uuid.uuid4())
            meta["creationTimestamp"] = meta.get("creationTimestamp") or _now_rfc3339()
        else:
            meta["uid"] = old.obj["metadata"]["uid"]
            meta["creationTimestamp"] = old.obj["metadata"].get("creationTimestamp")
        if old is not None:
            for kept in ("deletionTimestamp", "deletionGracePeriodSeconds"):  # only DELETE sets these
                if kept in old.obj["metadata"]:
                    meta[kept] = old.obj["metadata"][kept]
                else:
                    meta.pop(kept, None)
            # The apiserver does not write an object that did not change: same resourceVersion,
            # no watch event (a no-op patch from a controller costs no MODIFIED for every watcher).
            meta["resourceVersion"] = old.obj["metadata"]["resourceVersion"]
            if obj == old.obj:
                return old.obj
        if dry_run:
            meta["resourceVersion"] = old.obj["metadata"]["resourceVersion"] if old else "0"
            return obj
        if old is not None and meta.get("deletionTimestamp") and not meta.get("finalizers") \
                and not meta.get("deletionGracePeriodSeconds"):
            # The last finalizer went away from an object being deleted: now it is gone.
            return self._remove(rtype, key[0], key[1])
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        raw = _dumps(obj)
        if old is None:
            store.sorted_keys = None
        store.objects[key] = _Entry(obj, raw)
        self._emit(store, "MODIFIED" if old else "ADDED", obj, old.obj if old else None, raw)
        if notify:
            self._lock.notify_all()
        return obj

    def _remove(self, rtype: ResourceType, namespace: str, name: str, *, dry_run: bool = False) -> Obj:
        store = self._store(rtype)
        key = (namespace if rtype.namespaced else "", name)
        entry = store.objects.get(key)
        if entry is None:
            raise ApiError(404, "NotFound", f'{rtype.plural} "{name}" not found',
                           {"name": name, "kind": rtype.plural})
        if dry_run:
            return entry.obj
        del store.objects[key]
        store.sorted_keys = None
        self._rv += 1
        gone = copy.deepcopy(entry.obj)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._emit(store, "DELETED", gone, None, _dumps(gone))
        self._lock.notify_all()
        return gone

    def _emit(self, store: _Store, etype: str, obj: Obj, prev: Obj | None, raw: bytes) -> None:
        store.events.append(_Event(self._rv, etype, obj, prev, raw))
        if len(store.events) > self._max_events:
            drop = len(store.events) // 2
            store.compacted_rv = store.events[drop - 1].rv
            del store.events[:drop]
            store.events_base += drop

    def _take_fault(self, method: str, path: str, query: dict[str, str], user_agent: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path, query, user_agent):
                    fault.remaining -= 1
                    return fault
        return None

    def _delay_for(self, method: str, path: str, query: dict[str, str], user_agent: str) -> float:
        with self._lock:
            for rule in self._delays:
                if rule.matches(method, path, query, user_agent):
                    rule.remaining -= 1
                    return rule.delay
        return 0.0

    def _delete(self, rtype: ResourceType, namespace: str, name: str, *, grace: int | None,
                dry_run: bool) -> Obj:
        """DELETE as the apiserver does it: graceful for bound pods, deferred by finalizers.

        A pod bound to a node that has not finished gets ``deletionTimestamp`` (now + grace) and
        ``deletionGracePeriodSeconds`` and stays, still holding its node's resources, until its
        kubelet deletes it with grace 0 (``spec.terminationGracePeriodSeconds``, 30, unless the
        request says otherwise). An object with finalizers stays until they are removed.
        """
        store = self._store(rtype)
        entry = store.objects.get((namespace if rtype.namespaced else "", name))
        if entry is None:
            return self._remove(rtype, namespace, name, dry_run=dry_run)
        obj = entry.obj
        meta = obj["metadata"]
        if rtype.kind == "Pod":
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            if grace is None:
                grace = int(spec.get("terminationGracePeriodSeconds", 30))
            if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
                grace = 0  # nothing runs it: no kubelet would ever confirm
        else:
            grace = 0
        finalizers = meta.get("finalizers") or []
        if grace <= 0 and not finalizers:
            return self._remove(rtype, namespace, name, dry_run=dry_run)
        current = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and (current is None or current <= grace) and \
                (grace > 0 or not current):
            return obj  # already terminating, and this request does not shorten it
        updated = copy.deepcopy(obj)
        umeta = updated["metadata"]
        when = datetime.now(UTC).timestamp() + max(grace, 0)
        umeta["deletionTimestamp"] = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        umeta["deletionGracePeriodSeconds"] = max(grace, 0)
        if dry_run:
            return updated
        self._rv += 1
        umeta["resourceVersion"] = str(self._rv)
        raw = _dumps(updated)
        store.objects[_key(rtype, updated)] = _Entry(updated, raw)
        self._emit(store, "MODIFIED", updated, obj, raw)
        self._lock.notify_all()
        return updated


class _QuietServer(ThreadingHTTPServer):
    """A client going away mid-request (a stopped balancer) is normal here, not a traceback."""

    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def _key(rtype: ResourceType, obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace", "") if rtype.namespaced else "", meta["name"])


# Query booleans are parsed like Go's strconv.ParseBool: older kubernetes clients send "True".
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})


# ---- selectors -------------------------------------------------------------------------------
_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def label_matcher(selector: str | None):
    """Compile a label selector string (=, ==, !=, in, notin, exists, !exists) to a predicate."""
    if not selector:
        return None
    tests = []
    for part in _split_selector(selector):
        part = part.strip()
        if m := _SET_RE.match(part):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif "!=" in part:
            key, value = (s.strip() for s in part.split("!=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in part:
            key, value = (s.strip() for s in part.replace("==", "=").split("=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif part.startswith("!"):
            tests.append(lambda labels, k=part[1:].strip(): k not in labels)
        else:
            tests.append(lambda labels, k=part: k in labels)
    return lambda obj: all(t(obj.get("metadata", {}).get("labels") or {}) for t in tests)


def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def field_matcher(selector: str | None):
    """Compile a field selector (``a.b=v``, ``a.b==v``, ``a.b!=v``, comma-joined) to a predicate."""
    if not selector:
        return None
    tests = []
    for part in selector.split(","):
        part = part.strip()
        if not part:
            continue
        if "!=" in part:
            path, value = part.split("!=", 1)
            tests.append(lambda o, p=path.strip(), v=value.strip(): _field_value(o, p) != v)
        else:
            path, value = part.replace("==", "=").split("=", 1)
            tests.append(lambda o, p=path.strip(), v=value.strip(): _field_value(o, p) == v)
    return lambda obj: all(t(obj) for t in tests)


# ---- patches ---------------------------------------------------------------------------------
def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, field_name: str = "") -> Any:
    """A strategic merge patch covering what clients send: merge keys for known lists, else replace."""
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        result = dict(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith("$"):
                continue
            if value is None:
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value, key)
        return result
    if isinstance(patch, list) and field_name in STRATEGIC_MERGE_KEYS and isinstance(target, list):
        merge_key = STRATEGIC_MERGE_KEYS[field_name]
        result = [copy.deepcopy(item) for item in target]
        for item in patch:
            if not isinstance(item, dict) or merge_key not in item:
                return copy.deepcopy(patch)
            index = next((i for i, cur in enumerate(result)
                          if isinstance(cur, dict) and cur.get(merge_key) == item[merge_key]), None)
            if item.get("$patch") == "delete":
                if index is not None:
                    result.pop(index)
            elif index is None:
                result.append(strategic_merge_patch({}, item, ""))
            else:
                result[index] = strategic_merge_patch(result[index], item, "")
        return result
    if isinstance(patch, list):
        return [strategic_merge_patch({}, x, "") if isinstance(x, dict) else copy.deepcopy(x) for x in patch]
    return copy.deepcopy(patch)


# ---- HTTP ------------------------------------------------------------------------------------
@dataclass
class _Target:
    rtype: ResourceType
    namespace: str | None  # None: all namespaces (or cluster-scoped)
    name: str | None
    subresource: str | None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeKube  # set on the bound subclass
    _request_record: Request | None = None
    _retry_after: int | None = None

    def setup(self) -> None:
        super().setup()
        # Small watch chunks must not wait for Nagle + delayed ACK (40 ms each on Linux).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # Every verb goes through one dispatcher so errors are rendered the same way.
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        fake = self.fake
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip() or None
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length else b""
        user_agent = self.headers.get("User-Agent") or ""
        body: Any = None
        self._request_record = None
        self._retry_after = None
        try:
            pause = fake._delay_for(method, path, query, user_agent)
            if pause > 0:
                time.sleep(pause)
            if raw_body:
                try:
                    body = json.loads(raw_body)
                except ValueError as err:
                    raise ApiError(400, "BadRequest", f"request body is not JSON: {err}") from None
            if fake._record:
                self._request_record = Request(method, path, content_type, body, query, user_agent, time.monotonic())
                self._request_record.headers = {k.lower(): v for k, v in self.headers.items()}
                fake.requests.append(self._request_record)
            fault = fake._take_fault(method, path, query, user_agent)
            if fault is not None:
                code = fault.code
                details = dict(fault.details or {})
                if fault.retry_after is not None:
                    details["retryAfterSeconds"] = fault.retry_after
                    self._retry_after = fault.retry_after
                raise ApiError(code, fault.reason or HTTPStatus(code).phrase.replace(" ", ""),
                               fault.message or f"injected fault {code}", details)
            if method == "GET" and self._discovery(path):
                return
            target = self._resolve(path)
            dry_run = "dryRun" in query
            if method == "GET" and target.name is None:
                if query.get("watch") in _GO_TRUE:
                    self._watch(target, query)
                else:
                    self._list(target, query)
            elif method == "GET":
                self._send(200, self._read(target))
            elif method == "POST" and target.name is None:
                self._send(201, self._create(target, body, dry_run))
            elif method == "PUT" and target.name is not None:
                self._send(200, self._replace(target, body, dry_run))
            elif method == "PATCH" and target.name is not None:
                self._send(200, self._patch(target, body, content_type, dry_run))
            elif method == "DELETE" and target.name is not None:
                grace_text = query.get("gracePeriodSeconds")
                if grace_text is None and isinstance(body, dict):
                    grace_text = body.get("gracePeriodSeconds")
                grace = None if grace_text is None else int(grace_text)
                with fake._lock:
                    gone = fake._delete(target.rtype, target.namespace or "", target.name, grace=grace,
                                        dry_run=dry_run)
                self._send(200, gone)
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")
        except ApiError as err:
            self._send(err.code, err.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # ---- routing -------------------------------------------------------------------------
    def _resolve(self, path: str) -> _Target:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            api_version, rest = "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            api_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        types = self.fake._types

        def rtype(plural: str) -> ResourceType:
            found = types.get((api_version, plural))
            if found is None:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            return found

        if len(rest) >= 3 and rest[0] == "namespaces" and (api_version, rest[2]) in types \
                and types[(api_version, rest[2])].namespaced:
            ns, plural, tail = rest[1], rest[2], rest[3:]
            if len(tail) > 2:
                raise ApiError(404, "NotFound", f"unknown path {path}")
            return _Target(rtype(plural), ns, tail[0] if tail else None, tail[1] if len(tail) > 1 else None)
        if 1 <= len(rest) <= 3:
            found = rtype(rest[0])
            name = rest[1] if len(rest) > 1 else None
            if name is not None and found.namespaced:
                raise ApiError(404, "NotFound", f"{found.plural} are namespaced: use /namespaces/NS/{found.plural}")
            return _Target(found, None, name, rest[2] if len(rest) > 2 else None)
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")

    def _discovery(self, path: str) -> bool:
        fake = self.fake
        parts = [p for p in path.split("/") if p]
        if parts == ["version"]:
            # The cluster gpugate targets (stack.yaml cluster.kubernetesVersion).
            self._send(200, {"major": "1", "minor": str(KUBERNETES_MINOR),
                             "gitVersion": f"v1.{KUBERNETES_MINOR}.0-kubefake"})
        elif parts == ["api"]:
            self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        elif parts == ["apis"]:
            groups: dict[str, list[str]] = {}
            for rt in fake._types.values():
                if rt.group:
                    groups.setdefault(rt.group, [])
                    if rt.version not in groups[rt.group]:
                        groups[rt.group].append(rt.version)
            self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in sorted(groups.items())]})
        elif parts == ["api", "v1"] or (len(parts) == 3 and parts[0] == "apis"):
            gv = "v1" if parts[0] == "api" else f"{parts[1]}/{parts[2]}"
            resources = [
                {"name": rt.plural, "singularName": rt.kind.lower(), "namespaced": rt.namespaced,
                 "kind": rt.kind, "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                for (v, _), rt in sorted(fake._types.items()) if v == gv
            ]
            if not resources:
                raise ApiError(404, "NotFound", f"no resources in {gv}")
            self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                             "resources": resources})
        else:
            return False
        return True

    # ---- verbs ---------------------------------------------------------------------------
    def _read(self, target: _Target) -> bytes:
        fake = self.fake
        with fake._lock:
            entry = fake._store(target.rtype).objects.get((target.namespace or "", target.name or ""))
            if entry is None:
                raise ApiError(404, "NotFound", f'{target.rtype.plural} "{target.name}" not found',
                               {"name": target.name, "kind": target.rtype.plural})
            return entry.raw

    def _current(self, target: _Target) -> Obj:
        return orjson.loads(self._read(target))

    def _create(self, target: _Target, body: Any, dry_run: bool) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "create needs a JSON object body")
        self._check_identity(target, body)
        if target.namespace is not None:
            body.setdefault("metadata", {})["namespace"] = target.namespace
        with self.fake._lock:
            return self.fake._write(target.rtype, body, create_only=True, dry_run=dry_run)

    def _replace(self, target: _Target, body: Any, dry_run: bool) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "replace needs a JSON object body")
        self._check_identity(target, body)
        meta = body.setdefault("metadata", {})
        if meta.get("name", target.name) != target.name:
            raise ApiError(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match "
                                              f"the name on the URL ({target.name})")
        meta["name"] = target.name
        if target.namespace is not None:
            meta["namespace"] = target.namespace
        with self.fake._lock:
            self._current(target)  # 404 when absent: PUT does not create here
            return self.fake._write(target.rtype, body, create_only=False,
                                    expect_rv=meta.get("resourceVersion") or None, dry_run=dry_run)

    def _patch(self, target: _Target, body: Any, content_type: str | None, dry_run: bool) -> Obj:
        with self.fake._lock:
            current = self._current(target)
            if content_type == JSON_PATCH:
                if not isinstance(body, list):
                    raise ApiError(400, "BadRequest", "a json patch must be a list of operations")
                try:
                    patched = jsonpatch.apply_patch(current, body)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
                    raise ApiError(422, "Invalid", f"json patch failed: {err}") from None
                expect = None
            elif content_type in (MERGE_PATCH, STRATEGIC_PATCH):
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", f"a {content_type} body must be a JSON object")
                patcher = merge_patch if content_type == MERGE_PATCH else strategic_merge_patch
                patched = patcher(current, body)
                expect = (body.get("metadata") or {}).get("resourceVersion")
            else:
                raise ApiError(415, "UnsupportedMediaType",
                               f"the body of the request was in an unknown format - accepted media types "
                               f"include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}")
            if expect and expect != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {target.rtype.plural} '
                                                f'"{target.name}": the object has been modified')
            patched.setdefault("metadata", {})
            patched["metadata"]["name"] = current["metadata"]["name"]
            if target.namespace is not None:
                patched["metadata"]["namespace"] = target.namespace
            patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            return self.fake._write(target.rtype, patched, create_only=False, dry_run=dry_run)

    def _check_identity(self, target: _Target, body: Obj) -> None:
        rtype = target.rtype
        if body.get("kind", rtype.kind) != rtype.kind or body.get("apiVersion", rtype.api_version) != rtype.api_version:
            raise ApiError(400, "BadRequest", f"the body is a {body.get('apiVersion')}/{body.get('kind')}, "
                                              f"the URL serves {rtype.api_version}/{rtype.kind}")
        ns = (body.get("metadata") or {}).get("namespace")
        if target.namespace is not None and ns and ns != target.namespace:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                                              "namespace sent on the request")

    def _list(self, target: _Target, query: dict[str, str]) -> None:
        fake = self.fake
        rtype = target.rtype
        labels, fields = label_matcher(query.get("labelSelector")), field_matcher(query.get("fieldSelector"))
        limit = int(query.get("limit") or 0)
        token = query.get("continue") or ""
        chunks: list[bytes] = []
        with fake._lock:
            store = fake._store(rtype)
            keys = store.keys_in_order()
            if token:
                try:
                    rv_text, after_ns, after_name = json.loads(bytes.fromhex(token))
                except (ValueError, TypeError):
                    raise ApiError(400, "BadRequest", "invalid continue token") from None
                list_rv = int(rv_text)
                if list_rv < fake._expired_before:
                    raise ApiError(410, "Expired", "The provided continue parameter is too old")
                start = bisect.bisect_right(keys, (after_ns, after_name))
            else:
                list_rv, start = fake._rv, 0
            last_key = None
            index = start
            while index < len(keys):
                key = keys[index]
                index += 1
                if target.namespace is not None and key[0] != target.namespace:
                    continue
                entry = store.objects[key]
                if (labels and not labels(entry.obj)) or (fields and not fields(entry.obj)):
                    continue
                chunks.append(entry.raw)
                last_key = key
                if limit and len(chunks) >= limit:
                    break
            more = limit and last_key is not None and index < len(keys)
            remaining = len(keys) - index if more else 0
        meta: Obj = {"resourceVersion": str(list_rv)}
        if more:
            meta["continue"] = json.dumps([str(list_rv), last_key[0], last_key[1]]).encode().hex()
            meta["remainingItemCount"] = remaining
        head = _dumps({"kind": f"{rtype.kind}List", "apiVersion": rtype.api_version, "metadata": meta})
        payload = head[:-1] + b',"items":[' + b",".join(chunks) + b"]}"
        self._send(200, payload)

    def _watch(self, target: _Target, query: dict[str, str]) -> None:
        fake = self.fake
        rtype = target.rtype
        labels, fields = label_matcher(query.get("labelSelector")), field_matcher(query.get("fieldSelector"))
        namespace = target.namespace
        timeout = float(query.get("timeoutSeconds") or 0) or None
        deadline = time.monotonic() + timeout if timeout else None
        rv_param = query.get("resourceVersion") or ""
        filtered = bool(labels or fields or namespace is not None)
        bookmarks = query.get("allowWatchBookmarks") in _GO_TRUE
        next_bookmark = time.monotonic() + fake.bookmark_interval

        def bookmark() -> bytes:
            # Every event of this resource up to the store's revision has been sent by now.
            return _dumps({"type": "BOOKMARK", "object": {
                "kind": rtype.kind, "apiVersion": rtype.api_version,
                "metadata": {"resourceVersion": str(fake._rv)}}}) + b"\n"

        def matches(obj: Obj | None) -> bool:
            if obj is None:
                return False
            if namespace is not None and obj["metadata"].get("namespace") != namespace:
                return False
            return not ((labels and not labels(obj)) or (fields and not fields(obj)))

        initial: list[bytes] = []  # raw objects (shared with the store), framed per chunk when sent
        gone: str | None = None
        streaming = query.get("sendInitialEvents") in _GO_TRUE
        if streaming:
            # A streaming list (KEP-3157), as the apiserver validates it.
            if not fake.watch_list:
                raise ApiError(422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: "
                                               "Forbidden: sendInitialEvents is forbidden for watch unless the "
                                               "WatchList feature gate is enabled")
            if query.get("resourceVersionMatch") != "NotOlderThan" or not bookmarks:
                raise ApiError(422, "Invalid", "sendInitialEvents needs resourceVersionMatch=NotOlderThan and "
                                               "allowWatchBookmarks=true")
            if rv_param not in ("", "0"):
                raise ApiError(422, "Invalid", "this fake streams lists from a consistent read only")
        with fake._lock:
            store = fake._store(rtype)
            generation = fake._expire_generation
            if rv_param in ("", "0"):
                for key in store.keys_in_order():
                    entry = store.objects[key]
                    if not filtered or matches(entry.obj):
                        initial.append(entry.raw)
                position = store.events_base + len(store.events)
                list_rv = fake._rv
            else:
                list_rv = 0
                try:
                    since = int(rv_param)
                except ValueError:
                    raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_param!r}") from None
                floor = max(store.compacted_rv, fake._expired_before)
                if since < floor:
                    gone = f"too old resource version: {since} ({floor})"
                    position = 0
                else:
                    rvs_from = bisect.bisect_right([e.rv for e in store.events], since) \
                        if store.events and store.events[0].rv <= since else 0
                    position = store.events_base + rvs_from
            fake._open_watches[rtype.plural] = fake._open_watches.get(rtype.plural, 0) + 1
        try:
            if self._request_record is not None:
                self._request_record.status = 200
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if gone:
                self._chunk(_dumps({"type": "ERROR", "object": ApiError(410, "Expired", gone).status()}) + b"\n")
                self._end_chunks()
                return
            for start in range(0, len(initial), 200):  # one chunk per 200 objects, not one of gigabytes
                self._chunk(b"".join(b'{"type":"ADDED","object":' + raw + b"}\n"
                                     for raw in initial[start:start + 200]))
            if streaming:
                self._chunk(_dumps({"type": "BOOKMARK", "object": {
                    "kind": rtype.kind, "apiVersion": rtype.api_version,
                    "metadata": {"resourceVersion": str(list_rv),
                                 "annotations": {"k8s.io/initial-events-end": "true"}}}}) + b"\n")
            while True:
                lines: list[bytes] = []
                with fake._lock:
                    while True:
                        store = fake._store(rtype)
                        if fake._stopped:
                            break
                        if fake._expire_generation != generation or position < store.events_base:
                            gone = "too old resource version: watch expired"
                            break
                        if position < store.events_base + len(store.events):
                            break
                        now = time.monotonic()
                        if bookmarks and now >= next_bookmark:
                            break
                        wait = 1.0 if deadline is None else min(1.0, deadline - now)
                        if bookmarks:
                            wait = min(wait, next_bookmark - now)
                        if wait <= 0:
                            break
                        fake._lock.wait(wait)
                    if not gone and not fake._stopped:
                        batch = store.events[position - store.events_base:]
                        position = store.events_base + len(store.events)
                        for event in batch:
                            if not filtered:
                                lines.append(event.line())
                                continue
                            new, old = matches(event.obj), matches(event.prev)
                            if event.type == "MODIFIED" and new != old:
                                lines.append(event.line("ADDED" if new else "DELETED"))
                            elif new:
                                lines.append(event.line())
                        now = time.monotonic()
                        ending = deadline is not None and now >= deadline
                        # A bookmark every interval, and one as the watch ends (as the apiserver
                        # sends one just before the timeout), so a client resumes from a fresh
                        # revision even when nothing it watches has changed for a long time.
                        if bookmarks and (now >= next_bookmark or ending):
                            lines.append(bookmark())
                            next_bookmark = now + fake.bookmark_interval
                for start in range(0, len(lines), 200):  # a burst goes out as many chunks, as events do
                    self._chunk(b"".join(lines[start:start + 200]))
                if gone:
                    self._chunk(_dumps({"type": "ERROR", "object": ApiError(410, "Expired", gone).status()})
                                + b"\n")
                    break
                if fake._stopped or (deadline is not None and time.monotonic() >= deadline):
                    break
            self._end_chunks()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            with fake._lock:
                fake._open_watches[rtype.plural] -= 1

    # ---- writing -------------------------------------------------------------------------
    def _send(self, code: int, payload: Obj | bytes) -> None:
        data = payload if isinstance(payload, bytes) else _dumps(payload)
        if self._request_record is not None:
            self._request_record.status = code
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self._retry_after is not None:
            self.send_header("Retry-After", str(self._retry_after))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")


def iter_objects(fk: FakeKube, api_version: str, kind: str) -> Iterator[Obj]:
    """Every stored object of one kind, decoded (a convenience for asserts)."""
    yield from fk.list(api_version, kind)


if pytest is not None:
    @pytest.fixture
    def fake_kube() -> Iterator[FakeKube]:
        """A started :class:`FakeKube`, stopped after the test."""
        fk = FakeKube()
        fk.start()
        try:
            yield fk
        finally:
            fk.stop()
