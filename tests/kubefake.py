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
  ``resourceVersion`` (or, without one, synthetic ``ADDED`` events for what exists), honouring
  ``timeoutSeconds`` and selector transitions (an object leaving a selector is ``DELETED``);
  a too-old ``resourceVersion`` gets one ``ERROR`` event with a ``410`` Status, as the
  apiserver does;
- ``POST`` create (``generateName`` supported, ``409 AlreadyExists``), ``PUT`` replace
  (``409 Conflict`` on a stale ``metadata.resourceVersion``), ``PATCH`` with
  ``application/json-patch+json``, ``application/merge-patch+json`` and
  ``application/strategic-merge-patch+json`` (lists with a known merge key are merged by it,
  other lists replaced, ``$patch: delete`` honoured), ``DELETE``; ``dryRun`` persists nothing;
- discovery documents ``/api``, ``/apis``, ``/api/v1``, ``/apis/<group>/<version>``, ``/version``.

Test helpers beyond the shared interface: ``put_many`` (bulk load), ``list``, ``count`` (cheap
polling), ``fail_next`` (inject an HTTP error for matching requests), ``open_watches`` (wait until
a client is watching); every request is kept in ``requests`` with its ``.query``.

Speed: each stored object is serialized once when written, so a list of 150,000 pods or a
burst of watch events is bytes concatenation, not JSON encoding.
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
import pytest

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

    A 4-tuple so tests can unpack it; ``.query`` holds the parsed query string as well.
    """

    query: dict[str, str]

    def __new__(cls, method: str, path: str, content_type: str | None, body: Any,
                query: dict[str, str]) -> Request:
        self = super().__new__(cls, (method, path, content_type, body))
        self.query = query
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
    line: bytes


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
    return json.dumps(obj, separators=(",", ":")).encode()


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKube:
    """An in-process fake API server on 127.0.0.1; start it, point a client at ``.url``."""

    def __init__(self, *, max_events: int = 1_000_000, record_requests: bool = True) -> None:
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
        return json.loads(self._stores[(rtype.group, rtype.plural)].objects[_key(rtype, stored)].raw)

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
            return None if entry is None else json.loads(entry.raw)

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        rtype = self._rtype_for(api_version, kind)
        with self._lock:
            store = self._stores[(rtype.group, rtype.plural)]
            return [json.loads(e.raw) for k, e in sorted(store.objects.items())
                    if namespace is None or k[0] == namespace]

    def count(self, api_version: str, kind: str, predicate: Callable[[Obj], bool]) -> int:
        """How many stored objects of one kind satisfy ``predicate`` (given the stored dict: read only).

        Cheap enough to poll over thousands of objects, which :meth:`list` (decoding copies) is not.
        """
        rtype = self._rtype_for(api_version, kind)
        with self._lock:
            return sum(1 for entry in self._store(rtype).objects.values() if predicate(entry.obj))

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
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

    def fail_next(self, method: str, path_pattern: str, code: int = 500, count: int = 1) -> None:
        """Answer the next ``count`` requests matching ``method`` and the path regex with ``code``."""
        with self._lock:
            self._faults.append(_Fault(method.upper(), re.compile(path_pattern), code, count))

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
        if dry_run:
            meta["resourceVersion"] = old.obj["metadata"]["resourceVersion"] if old else "0"
            return obj
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
        line = b'{"type":"' + etype.encode() + b'","object":' + raw + b"}\n"
        store.events.append(_Event(self._rv, etype, obj, prev, line))
        if len(store.events) > self._max_events:
            drop = len(store.events) // 2
            store.compacted_rv = store.events[drop - 1].rv
            del store.events[:drop]
            store.events_base += drop

    def _take_fault(self, method: str, path: str) -> int | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.method == method and fault.path.search(path):
                    fault.remaining -= 1
                    return fault.code
        return None


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
        body: Any = None
        try:
            if raw_body:
                try:
                    body = json.loads(raw_body)
                except ValueError as err:
                    raise ApiError(400, "BadRequest", f"request body is not JSON: {err}") from None
            if fake._record:
                fake.requests.append(Request(method, path, content_type, body, query))
            code = fake._take_fault(method, path)
            if code is not None:
                raise ApiError(code, HTTPStatus(code).phrase.replace(" ", ""), f"injected fault {code}")
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
                with fake._lock:
                    gone = fake._remove(target.rtype, target.namespace or "", target.name, dry_run=dry_run)
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
            self._send(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0-kubefake"})
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
        return json.loads(self._read(target))

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

        def matches(obj: Obj | None) -> bool:
            if obj is None:
                return False
            if namespace is not None and obj["metadata"].get("namespace") != namespace:
                return False
            return not ((labels and not labels(obj)) or (fields and not fields(obj)))

        initial: list[bytes] = []
        gone: str | None = None
        with fake._lock:
            store = fake._store(rtype)
            generation = fake._expire_generation
            if rv_param in ("", "0"):
                for key in store.keys_in_order():
                    entry = store.objects[key]
                    if not filtered or matches(entry.obj):
                        initial.append(b'{"type":"ADDED","object":' + entry.raw + b"}\n")
                position = store.events_base + len(store.events)
            else:
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
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if gone:
                self._chunk(_dumps({"type": "ERROR", "object": ApiError(410, "Expired", gone).status()}) + b"\n")
                self._end_chunks()
                return
            if initial:
                self._chunk(b"".join(initial))
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
                        wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                        if wait <= 0:
                            break
                        fake._lock.wait(wait)
                    if not gone and not fake._stopped:
                        batch = store.events[position - store.events_base:]
                        position = store.events_base + len(store.events)
                        for event in batch:
                            if not filtered:
                                lines.append(event.line)
                                continue
                            new, old = matches(event.obj), matches(event.prev)
                            if event.type == "MODIFIED" and new != old:
                                etype = "ADDED" if new else "DELETED"
                                lines.append(b'{"type":"' + etype.encode() + b'","object":'
                                             + event.line[len(b'{"type":"MODIFIED","object":'):])
                            elif new:
                                lines.append(event.line)
                if lines:
                    self._chunk(b"".join(lines))
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
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")


def iter_objects(fk: FakeKube, api_version: str, kind: str) -> Iterator[Obj]:
    """Every stored object of one kind, decoded (a convenience for asserts)."""
    yield from fk.list(api_version, kind)


@pytest.fixture
def fake_kube() -> Iterator[FakeKube]:
    """A started :class:`FakeKube`, stopped after the test."""
    fk = FakeKube()
    fk.start()
    try:
        yield fk
    finally:
        fk.stop()
