"""The balancer against the real API server at scale: GPU nodes and bound pods of realistic size on
the e2e control plane (etcd, kube-apiserver v1.36.3, kube-controller-manager, kube-scheduler), and
``gpugate balance`` as its own process, as the ``gpugate-balancer`` ServiceAccount with exactly
manifests/balancer's RBAC (so priority and fairness files it under ``service-accounts`` like the
Deployment, not under the admin's exempt level).

Prints, from one run:

- wall time from the balancer's start to every GPU node labelled (goal < 60 s), as a Node watcher
  sees it, with the Deployment's settings; its caches' sync time (/readyz); the balancer's CPU
  seconds and resident memory;
- API requests per second the API server served (all clients, and the balancer's own), and 429s
  (priority and fairness rejections; goal: none), from the API server's own metrics;
- for a burst of GPU pods bound (created with ``spec.nodeName``, as the scheduler's binding leaves
  them) and then finished (``status.phase: Succeeded``, as a kubelet reports it), once with the
  Deployment's ``write_interval`` and once with ``--write-interval 0`` (every change written: the
  label churn before coalescing), side by side: Node writes per pod bound and finished, the Node
  update events a watcher of all nodes sees per GPU pod bound, and the most writes one node got
  within any window of the default interval (goal: at most one);
- peak resident memory of etcd, kube-apiserver, kube-controller-manager and kube-scheduler.

The objects come from benchmarks/balancer_scale.py's generators, as ``kubectl get -o json`` shows
them: nodes of 19-37 KB (GFD and NFD labels, managedFields, images), Running Job pods of 4-15 KB
(managedFields, env, volumes, tolerations, status). They are written straight into etcd, the API
server's storage, in batches (``EtcdBulk``: a pod created through the API server cost it ~7 ms of
CPU here, 41 pods/s on this loaded machine, an hour for 150,000); the API server reads them from
its etcd watch as it reads its own writes, and the run waits until its watch cache holds them
all. Everything measured afterwards goes through the API server: the bursts' pods are created and
finished through it. No kubelet runs, so kube-controller-manager runs without its node-lifecycle
controller, which would otherwise mark 5,000 silent nodes unreachable mid-run and taint them, nor
its TTL controller, which annotates every node once the cluster grows past 100, 500, 1,000 and
2,000 nodes (Node writes that are not the balancer's). The run stops if this machine's available memory falls under
``--memory-floor-gb``.

    python benchmarks/balancer_cluster.py [--nodes 5000] [--pods 150000] [--burst 2000]
    python benchmarks/balancer_cluster.py --nodes 5000 --pods 20000 --labelling-only --patch-cost 100 \
        --code-before main     # the first labelling by main's balancer and this checkout's, one run, and
                               # benchmarks/patchcost.py's arms: what a label patch costs the API server
    python benchmarks/balancer_cluster.py --nodes 20 --pods 100 --burst 20 --placements pack \
        --code-before HEAD --patch-cost 8 --patch-rounds 1     # shortest
"""

from __future__ import annotations

import argparse
import base64
import http.client
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import orjson  # noqa: E402
import yaml  # noqa: E402
from kubernetes import client, config  # noqa: E402

from benchmarks import patchcost  # noqa: E402
from benchmarks.balancer_scale import (  # noqa: E402
    cpu_seconds,
    metric,
    node_pods,
    realistic_node,
    realistic_pod,
    rss_mb,
)
from webhook.balancer.cluster import iter_lines  # noqa: E402
from webhook.balancer.settings import BalancerSettings  # noqa: E402
from webhook.localcluster import (  # noqa: E402
    binaries,
    controlplane,
    processes,
)
from webhook.localcluster.binaries import Binaries  # noqa: E402
from webhook.names import GPU_FREE_LABEL, GPU_LOAD_LABEL  # noqa: E402

NAMESPACE = "bench"
SYSTEM = "gpugate-system"
ACCOUNT = LEASE = "gpugate-balancer"  # the names manifests/balancer's Role grants
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
DEFAULT_INTERVAL = BalancerSettings().write_interval
NO_NODE_LIFECYCLE = ("--controllers=*,-node-lifecycle-controller,-ttl-controller",)
PLACEMENTS = ("pack", "spread")
ENV_COUNTS = (0, 5, 10, 15, 20, 30, 40, 50)  # balancer_scale.py's spread: pods of 4 to 15 KB
Obj = dict[str, Any]
SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "selfLink")


def creatable(obj: Obj) -> Obj:
    """The object as a client sends it: without what the API server sets (managedFields are kept:
    the API server stores those a create carries, so the stored objects have their real size)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in SERVER_SET or k == "managedFields"}
    meta.pop("namespace", None)
    meta.pop("ownerReferences", None)  # the Jobs they name do not exist here
    meta.pop("finalizers", None)  # no Job controller owns them here to remove it
    return {**obj, "metadata": meta}


def stored(obj: Obj, namespace: str | None = None) -> Obj:
    """The object as the API server keeps it in etcd (uid, creationTimestamp and managedFields
    included: an update of an object without a uid is answered 404), without the owners and
    finalizers of Jobs that do not exist here (kube-controller-manager's garbage collector would
    delete pods whose owner is missing)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("ownerReferences", "finalizers", "resourceVersion")}
    if namespace is not None:
        meta["namespace"] = namespace
    return {**obj, "metadata": meta}


# ---- watching the machine's memory ------------------------------------------------------------------
@dataclass
class MemoryGuard:
    """Samples the control plane's resident memory every 2 s, keeps the peaks, and says stop when
    the machine's MemAvailable falls under ``floor_mb`` (other people share this machine)."""

    pids: dict[str, int]
    floor_mb: float
    peaks: dict[str, float] = field(default_factory=dict)
    tripped: str = ""
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> MemoryGuard:
        threading.Thread(target=self._run, name="memory-guard", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(2.0):
            self.sample()

    def sample(self) -> None:
        for name, pid in list(self.pids.items()):
            try:
                rss, _ = rss_mb(pid)
            except (OSError, AttributeError):
                continue
            self.peaks[name] = max(self.peaks.get(name, 0.0), rss)
        available = available_mb()
        if available < self.floor_mb and not self.tripped:
            self.tripped = f"MemAvailable {available:.0f} MB < floor {self.floor_mb:.0f} MB"


def available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


# ---- writing many objects fast ------------------------------------------------------------------------
Request = tuple[str, str, bytes, str]  # method, path, body, content type


class Bulk:
    """Sends many requests over ``connections`` kept-alive HTTPS connections, one thread each.

    Bodies are made by the caller's function from an index, in the sending thread, and sent as
    bytes (orjson): the kubernetes client's model plumbing would cost more than the API server's
    work. The admin (system:masters) is exempt from priority and fairness, so the load is paced by
    the API server and etcd alone. A 429 or 5xx is retried; a 409 on a retried create means the
    first attempt got through.
    """

    def __init__(self, plane: controlplane.ControlPlane | None, connections: int, guard: MemoryGuard | None, *,
                 port: int = 0, tls: bool = True) -> None:
        self._port = int(plane.server.rsplit(":", 1)[1]) if plane is not None else port
        self._context = plane.admin_ssl_context() if plane is not None else None
        self._tls = tls
        self._connections = connections
        self._guard = guard

    def send(self, count: int, request: Callable[[int], Request], what: str = "") -> float:
        """Send ``request(i)`` for i in range(count); returns the seconds it took. Raises on the
        first answer that is not a success (after retries), or when the memory guard trips."""
        counter = itertools.count()
        lock = threading.Lock()
        done = [0]
        began = time.monotonic()

        def work(failed: Callable[[], bool]) -> None:
            connection = self._connect()
            try:
                while not failed():
                    with lock:
                        i = next(counter)
                    if i >= count:
                        return
                    if self._guard is not None and self._guard.tripped:
                        raise RuntimeError(f"stopped for memory: {self._guard.tripped}")
                    connection = self._one(connection, *request(i))
                    with lock:
                        done[0] += 1
                        if what and done[0] % 10_000 == 0:
                            rate = done[0] / (time.monotonic() - began)
                            print(f"  {done[0]} {what} ({rate:.0f}/s)", flush=True)
            finally:
                connection.close()

        patchcost.in_threads(min(self._connections, max(count, 1)), work)
        return time.monotonic() - began

    def _connect(self) -> http.client.HTTPConnection:
        if not self._tls:
            return http.client.HTTPConnection("127.0.0.1", self._port, timeout=120)
        return http.client.HTTPSConnection("127.0.0.1", self._port, context=self._context, timeout=120)

    def _one(self, connection: http.client.HTTPConnection, method: str, path: str, body: bytes,
             content_type: str) -> http.client.HTTPConnection:
        for attempt in range(10):
            try:
                connection.request(method, path, body, {"Content-Type": content_type, "Accept": "application/json"})
                response = connection.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = self._connect()
                time.sleep(0.2 * (attempt + 1))
                continue
            if 200 <= response.status < 300 or (response.status == 409 and method == "POST" and attempt):
                return connection
            if response.status in (429, 500, 503, 504):
                time.sleep(0.5 * (attempt + 1))
                continue
            raise RuntimeError(f"{method} {path}: {response.status} {data[:500]!r}")
        raise RuntimeError(f"{method} {path}: no success after 10 attempts")


class EtcdBulk:
    """Writes objects straight into etcd, the API server's storage, as the JSON ``kubectl get -o
    json`` shows (the API server reads JSON there as it reads its own protobuf, and its watch cache
    takes them in from its etcd watch, as it does every write). Why: a pod created through the API
    server cost it ~7 ms of CPU here (admission, defaulting, managedFields), 41 pods/s on this
    loaded machine, an hour for 150,000; etcd takes them in batches (a transaction of puts over its
    JSON gateway) in minutes. What is measured afterwards all goes through the API server."""

    def __init__(self, plane: controlplane.ControlPlane, connections: int, guard: MemoryGuard | None,
                 batch: int = 40) -> None:
        etcd = next(p for p in plane.processes if p.name == "etcd")
        self._port = etcd.ports[0]
        self._connections = connections
        self._guard = guard
        self._batch = batch

    def put(self, count: int, item: Callable[[int], tuple[str, Obj]], what: str = "") -> float:
        """Store ``item(i)`` (an etcd key and the object) for i in range(count); returns the seconds."""
        batches = [range(start, min(start + self._batch, count)) for start in range(0, count, self._batch)]

        def txn(b: int) -> Request:
            ops = []
            for i in batches[b]:
                key, obj = item(i)
                ops.append({"requestPut": {"key": base64.b64encode(key.encode()).decode(),
                                           "value": base64.b64encode(orjson.dumps(obj)).decode()}})
            return "POST", "/v3/kv/txn", orjson.dumps({"success": ops}), "application/json"

        sender = Bulk(None, self._connections, self._guard, port=self._port, tls=False)
        return sender.send(len(batches), txn, f"batches of {self._batch} {what}" if what else "")


def create(path: str, obj: Obj) -> Request:
    return "POST", path, orjson.dumps(obj), "application/json"


# ---- a watcher of every node ----------------------------------------------------------------------------
@dataclass
class NodeWatch:
    """Every Node update event a watcher of all nodes sees, and which ones changed gpugate's labels.

    Decodes each event as any watcher must (orjson); ``changes`` holds (time, node, tier changed).
    """

    events: list[float] = field(default_factory=list)
    changes: list[tuple[float, str, bool]] = field(default_factory=list)
    marks: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    error: str = ""

    def labelled(self) -> int:
        marks = list(self.marks.values())  # the watch thread adds to it meanwhile
        return sum(1 for free, load in marks if free is not None and load is not None)

    def run(self, api: client.ApiClient, version: str) -> None:
        core = client.CoreV1Api(api)
        while not self.stop.is_set():
            try:
                response = core.list_node(watch=True, resource_version=version, allow_watch_bookmarks=True,
                                          timeout_seconds=300, _preload_content=False, _request_timeout=(10, 330))
                for line in iter_lines(response):
                    event = orjson.loads(line)
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion") or version
                    if event.get("type") == "ERROR":
                        if obj.get("code") == 410:  # fell behind the watch cache (a burst of re-puts): relist
                            version = self.relist(core)
                            break
                        raise RuntimeError(f"watch error: {obj}")
                    if event.get("type") != "MODIFIED":
                        continue
                    now = time.monotonic()
                    self.events.append(now)
                    labels = meta.get("labels") or {}
                    mark = (labels.get(GPU_FREE_LABEL), labels.get(GPU_LOAD_LABEL))
                    old = self.marks.get(meta["name"], (None, None))
                    if mark != old:
                        self.changes.append((now, meta["name"], mark[1] != old[1]))
                        self.marks[meta["name"]] = mark
                    if self.stop.is_set():
                        break
                response.close()
            except Exception as err:  # the control plane going away at the end ends the stream
                if not self.stop.is_set():
                    self.error = repr(err)
                    time.sleep(1)


    def relist(self, core: client.CoreV1Api) -> str:
        """Every node's marks as listed now (no change is counted: the events in between are lost);
        returns the list's resourceVersion to watch from."""
        token = None
        while True:
            page = orjson.loads(core.list_node(limit=500, _continue=token, _preload_content=False).data)
            for obj in page.get("items") or ():
                labels = obj["metadata"].get("labels") or {}
                self.marks[obj["metadata"]["name"]] = (labels.get(GPU_FREE_LABEL), labels.get(GPU_LOAD_LABEL))
            token = page["metadata"].get("continue")
            if not token:
                return str(page["metadata"]["resourceVersion"])


def too_close(changes: list[tuple[float, str, bool]], interval: float) -> tuple[int, float]:
    """(writes that came less than 0.9 ``interval`` after the previous write to the same node,
    the shortest such gap in seconds; inf when no node was written twice). The 0.9 forgives the
    watcher's own delivery jitter, as the e2e test of coalescing does."""
    last: dict[str, float] = {}
    close, shortest = 0, float("inf")
    for at, name, _ in changes:
        if name in last:
            gap = at - last[name]
            shortest = min(shortest, gap)
            close += gap < 0.9 * interval
        last[name] = at
    return close, shortest


def targets_for(free: dict[str, int], count: int, placement: str, rng: random.Random) -> list[str]:
    """Where ``count`` one-GPU pods go. ``spread``: any node with room. ``pack`` (gpugate's default
    strategy prefers the fullest node): the same node until it is full, then the fullest of 50
    nodes with room (a scheduler scores a sample of a large cluster's nodes, not all of them)."""
    roomy = [n for n, left in free.items() if left]
    targets: list[str] = []
    current: str | None = None
    for _ in range(count):
        if placement == "spread":
            node = rng.choice(roomy)
            while not free[node]:
                node = rng.choice(roomy)
        else:
            if current is None or not free[current]:
                sample = [n for n in rng.sample(roomy, min(len(roomy), 200)) if free[n]][:50]
                current = min(sample, key=lambda n: (free[n], rng.random()))
            node = current
        free[node] -= 1
        targets.append(node)
    return targets


# ---- the API server's own counts ------------------------------------------------------------------------
def apiserver_counts(plane: controlplane.ControlPlane) -> dict[str, float]:
    """Requests the API server counted so far (all, 429s), the ones priority and fairness
    dispatched for ServiceAccounts (the balancer is the only one here), and its rejections."""
    status, body = plane.get("/metrics")
    assert status == 200, status
    counts = Counter[str]()
    for line in body.decode().splitlines():
        if line.startswith("#"):
            continue
        value = float(line.rsplit(" ", 1)[1]) if " " in line else 0.0
        if line.startswith("apiserver_request_total{"):
            counts["requests"] += value
            if 'code="429"' in line:
                counts["429"] += value
        elif line.startswith("apiserver_flowcontrol_dispatched_requests_total{") and \
                'flow_schema="service-accounts"' in line:
            counts["balancer"] += value
        elif line.startswith("apiserver_flowcontrol_rejected_requests_total{"):
            counts["rejected"] += value
    return dict(counts)


def cached(plane: controlplane.ControlPlane, resource: str) -> float:
    """Events the API server's watch cache of ``resource`` took in from etcd so far."""
    status, body = plane.get("/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("apiserver_watch_cache_events_received_total{") and f'resource="{resource}"' in line)


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(after) | set(before)}


# ---- the balancer as its ServiceAccount ------------------------------------------------------------------
def apply_rbac(kubeconfig: Path) -> None:
    """manifests/balancer's ServiceAccount and RBAC, rendered by kustomize and applied as they are."""
    rendered = subprocess.run(["kubectl", "kustomize", str(REPO / "manifests/balancer")], capture_output=True,
                              text=True, check=True, timeout=120).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in RBAC_KINDS]
    subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "apply", "-f", "-"], input=yaml.safe_dump_all(docs),
                   text=True, check=True, capture_output=True, timeout=120)


STARTED: list[Balancer] = []
"""Every balancer process this run started: stopped at the end, whatever happened."""


@dataclass
class Balancer:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    started: float

    def ready(self) -> bool:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            return bool(opener.open(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status == 200)
        except OSError:
            return False

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the balancer exited {self.proc.returncode}:\n{processes.tail(self.log)}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def account_token(core: client.CoreV1Api) -> str:
    """A token of the balancer's ServiceAccount, as the Deployment's pod gets one."""
    return str(core.create_namespaced_service_account_token(ACCOUNT, SYSTEM, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200))).status.token)


def start_balancer(plane: controlplane.ControlPlane, core: client.CoreV1Api, tmp: Path, interval: float,
                   tag: str, code: Path = REPO) -> Balancer:
    (tmp / f"{tag}.token").write_text(account_token(core))
    (tmp / f"{tag}.yaml").write_text("resync_interval: 3600\nwatch_timeout: 600\n")
    port = processes.free_port()
    log = tmp / f"balancer-{tag}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "webhook.cli", "balance", "--server", plane.server,
             "--token-file", str(tmp / f"{tag}.token"), "--certificate-authority", str(plane.ca.files.cert),
             "--config", str(tmp / f"{tag}.yaml"), "--identity", f"bench-{tag}", "--lease-name", LEASE,
             "--lease-namespace", SYSTEM, "--write-interval", str(interval),
             "--health-bind", f"127.0.0.1:{port}", "--log-level", "WARNING"],
            cwd=code, env={**os.environ, "PYTHONPATH": str(code)}, stdout=out, stderr=subprocess.STDOUT)
    STARTED.append(Balancer(proc, port, log, time.monotonic()))
    return STARTED[-1]


def leading(balancer: Balancer) -> bool:
    """The balancer holds the lease and has made its first full pass: its writes are the ones seen."""
    return metric(balancer.port, "gpugate_balancer_leader") == 1 and \
        metric(balancer.port, "gpugate_balancer_last_full_sync_timestamp_seconds") > 0


def wait(condition: Callable[[], bool], *, timeout: float, what: str, balancer: Balancer | None = None,
         guard: MemoryGuard | None = None, every: float = 0.1) -> float:
    """Seconds until ``condition`` holds; raises after ``timeout``, when the balancer exits or memory runs low."""
    began = time.monotonic()
    while not condition():
        if balancer is not None:
            balancer.check()
        if guard is not None and guard.tripped:
            raise RuntimeError(f"stopped for memory: {guard.tripped}")
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        time.sleep(every)
    return time.monotonic() - began


def process_cpu(plane: controlplane.ControlPlane, name: str) -> float:
    """CPU seconds one control-plane process has used so far (a figure this shared machine's load does
    not inflate, unlike wall time)."""
    return cpu_seconds(next(p.pid for p in plane.processes if p.name == name))


def patch_costs(plane: controlplane.ControlPlane, core: client.CoreV1Api, etcd: EtcdBulk, names: list[str],
                seed: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """benchmarks/patchcost.py's arms on ``names`` and on copies of them with fewer managers."""
    sets = {"kubelet": names}
    for key, prefix in patchcost.NODE_SETS.items():
        if not prefix:
            continue
        fold = patchcost.one_manager if key == "one manager" else patchcost.no_managers
        copies = [patchcost.renamed(fold(stored(realistic_node(int(name.rsplit("-", 1)[1]), random.Random(
            seed * 1_000_003 + int(name.rsplit("-", 1)[1]))))), prefix) for name in names]
        etcd.put(len(copies), lambda i, copies=copies: (f"/registry/minions/{copies[i]['metadata']['name']}",
                                                         copies[i]))
        sets[key] = [c["metadata"]["name"] for c in copies]
        wait(lambda key=key: all(_exists(core, name) for name in (sets[key][0], sets[key][-1])), timeout=300,
             what=f"the {key} nodes served")
    probe = patchcost.Probe(plane, account_token(core), plane.kubeconfig)
    return probe.run(sets, rounds)


def _exists(core: client.CoreV1Api, name: str) -> bool:
    return bool(orjson.loads(core.list_node(field_selector=f"metadata.name={name}",
                                            _preload_content=False).data)["items"])


def reset_nodes(plane: controlplane.ControlPlane, etcd: EtcdBulk, core: client.CoreV1Api, seen: NodeWatch,
                names: list[str], seed: int, guard: MemoryGuard) -> None:
    """Store every node unlabelled again, as at first, and wait until the API server serves them so.

    The API server is the judge, not the benchmark's watcher: first its watch cache must have
    taken in one event per node put (its own count), then a list of the nodes that still carry a
    gpugate label must come back empty; then the watcher's marks are relisted. Why: at 5,000
    nodes the watcher never saw every node unlabelled within 900 s (last session), and a list
    sent before the cache had caught up timed out (504: a consistent read waits for the cache,
    then a label-selected list scans every node) while kube-apiserver, on its share of this
    machine, decoded 5,000 nodes of 19-37 KB. How far behind the watcher was is printed."""
    began = time.monotonic()
    events_before = cached(plane, "nodes")
    etcd.put(len(names), lambda i: (f"/registry/minions/{names[i]}", stored(
        realistic_node(i, random.Random(seed * 1_000_003 + i)))))
    put = time.monotonic() - began
    wait(lambda: cached(plane, "nodes") >= events_before + len(names), timeout=1800, guard=guard, every=3.0,
         what="the API server's watch cache taking in the nodes stored again")
    taken = time.monotonic() - began

    def any_labelled() -> bool:
        try:
            return any(orjson.loads(core.list_node(label_selector=label, limit=1, _preload_content=False).data)[
                "items"] for label in (GPU_FREE_LABEL, GPU_LOAD_LABEL))
        except client.ApiException as err:
            if err.status in (429, 500, 503, 504):  # busy: ask again
                return True
            raise

    wait(lambda: not any_labelled(), timeout=900, what="the API server serving every node unlabelled again",
         guard=guard, every=2.0)
    behind = seen.labelled()
    wait(lambda: _relisted(seen, core), timeout=300, what="the watcher's relist", guard=guard, every=2.0)
    print(f"  nodes stored unlabelled again: put in {put:.0f} s, in the watch cache {taken:.0f} s and served so "
          f"{time.monotonic() - began:.0f} s after the first put; the watcher still saw {behind} labelled then, "
          "relisted", flush=True)


def _relisted(seen: NodeWatch, core: client.CoreV1Api) -> bool:
    try:
        seen.relist(core)
    except client.ApiException as err:
        if err.status in (429, 500, 503, 504):
            return False
        raise
    return True


def first_labelling(plane: controlplane.ControlPlane, core: client.CoreV1Api, tmp: Path, seen: NodeWatch,
                    nodes: int, guard: MemoryGuard, arm: str, code: Path) -> tuple[Balancer, dict[str, float]]:
    """Start a balancer (``code``'s) on unlabelled nodes; what it took until a watcher saw every node
    labelled: wall time (to its caches' sync, to the first and the last node labelled), its CPU and
    the API server's, the requests the API server served, and the balancer's writes."""
    counts_before = apiserver_counts(plane)
    changes_before = len(seen.changes)
    server_before = process_cpu(plane, "kube-apiserver")
    balancer = start_balancer(plane, core, tmp, DEFAULT_INTERVAL, arm, code)
    guard.pids["balancer"] = balancer.proc.pid
    marks: dict[str, float] = {}

    def all_labelled() -> bool:
        if "synced" not in marks and balancer.ready():
            marks["synced"] = time.monotonic() - balancer.started
            marks["cpu at sync"] = cpu_seconds(balancer.proc.pid)
            marks["server cpu at sync"] = process_cpu(plane, "kube-apiserver") - server_before
        labelled = seen.labelled()
        if labelled and "first" not in marks:
            marks["first"] = time.monotonic() - balancer.started
        return labelled >= nodes

    took = wait(all_labelled, timeout=1800, what=f"all nodes labelled ({arm})", balancer=balancer, guard=guard)
    counts = delta(apiserver_counts(plane), counts_before)
    rss, _ = rss_mb(balancer.proc.pid)
    return balancer, {
        "all nodes labelled (s)": took, "caches synced (s)": marks.get("synced", 0.0),
        "first labelled (s)": marks.get("first", 0.0),
        "balancer CPU (s)": cpu_seconds(balancer.proc.pid), "of which to sync": marks.get("cpu at sync", 0.0),
        "API server CPU (s)": process_cpu(plane, "kube-apiserver") - server_before,
        "of which to sync ": marks.get("server cpu at sync", 0.0),
        "balancer RSS (MB)": rss, "node writes": float(len(seen.changes) - changes_before),
        "requests/s, all": counts.get("requests", 0.0) / took,
        "requests/s, balancer": counts.get("balancer", 0.0) / took,
        "429s": counts.get("429", 0.0) + counts.get("rejected", 0.0),
    }


def print_firsts(firsts: dict[str, dict[str, float]]) -> None:
    """The first labelling of each arm, side by side."""
    print("\nfirst labelling of unlabelled nodes (goal: all within 60 s; no 429)")
    print(f"{'':<34}" + "".join(f"{arm:>12}" for arm in firsts))
    for key in next(iter(firsts.values())):
        print(f"{key:<34}" + "".join(f"{figures[key]:>12.1f}" for figures in firsts.values()))


# ---- a burst of binds and finishes ----------------------------------------------------------------------
def burst(bulk: Bulk, plane: controlplane.ControlPlane, balancer: Balancer, seen: NodeWatch, free: dict[str, int],
          count: int, interval: float, offset: int, placement: str, rng: random.Random) -> dict[str, float]:
    """``count`` one-GPU pods bound on nodes with room, then finished; what a Node watcher saw."""
    targets = targets_for(free, count, placement, rng)
    names = [f"burst-{offset + i:07d}" for i in range(count)]

    def converged() -> bool:
        return all(seen.marks.get(node, (None, None))[0] == str(free[node]) for node in set(targets))

    def pod(i: int) -> Request:
        body = creatable(realistic_pod(offset + i, targets[i], 1))
        body["metadata"]["name"] = names[i]
        body.pop("status")
        return create(f"/api/v1/namespaces/{NAMESPACE}/pods", body)

    def finish(i: int) -> Request:
        status = {"status": {"phase": "Succeeded"}}
        return ("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{names[i]}/status", orjson.dumps(status),
                "application/strategic-merge-patch+json")

    settle = interval + 2.0  # a write held back by the interval would show up here
    figures: dict[str, float] = {}
    changes_at, events_at, counts_at = len(seen.changes), len(seen.events), apiserver_counts(plane)
    began = time.monotonic()
    figures["bind send (s)"] = bulk.send(count, pod)
    figures["bind labels right (s)"] = wait(converged, timeout=600, what="labels after the binds",
                                            balancer=balancer) + figures["bind send (s)"]
    time.sleep(settle)
    mid_changes, mid_events = len(seen.changes), len(seen.events)
    for node in targets:
        free[node] += 1
    finish_began = time.monotonic()
    figures["finish send (s)"] = bulk.send(count, finish)
    figures["finish labels right (s)"] = wait(converged, timeout=600, what="labels after the finishes",
                                              balancer=balancer) + figures["finish send (s)"]
    time.sleep(settle)
    elapsed = time.monotonic() - began
    counts = delta(apiserver_counts(plane), counts_at)
    window = seen.changes[changes_at:]
    figures.update({
        "writes per bind": (mid_changes - changes_at) / count,
        "writes per finish": (len(seen.changes) - mid_changes) / count,
        "events per bind": (mid_events - events_at) / count,
        "events per finish": (len(seen.events) - mid_events) / count,
        "tier writes": float(sum(1 for _, _, tier in window if tier)),
        "free-only writes": float(sum(1 for _, _, tier in window if not tier)),
        "nodes touched": float(len(set(targets))),
        "writes < interval apart": float(too_close(window, DEFAULT_INTERVAL)[0]),
        "shortest gap (s)": min(too_close(window, DEFAULT_INTERVAL)[1], 999.0),
        "balancer req/s": counts.get("balancer", 0.0) / elapsed,
        "all req/s": counts.get("requests", 0.0) / elapsed,
        "429s": counts.get("429", 0.0) + counts.get("rejected", 0.0),
        "seconds": elapsed,
        "finish began (s)": finish_began - began,
    })
    return figures


def print_bursts(results: dict[str, dict[str, float]], count: int, code_before: Path | None) -> None:
    print(f"\nburst of {count} one-GPU pods bound, then finished; per pod, unless said")
    keys = ("writes per bind", "writes per finish", "events per bind", "events per finish", "nodes touched",
            "tier writes", "free-only writes", "writes < interval apart", "shortest gap (s)",
            "bind labels right (s)", "finish labels right (s)", "balancer req/s", "all req/s", "429s")
    width = max(len(k) for k in results) + 2
    print(f"{'':<26}" + "".join(f"{label:>{width}}" for label in results))
    for key in keys:
        print(f"{key:<26}" + "".join(f"{figures[key]:>{width}.2f}" for figures in results.values()))
    print(f"(columns: write_interval {DEFAULT_INTERVAL:g} s (the default) or 0 (every change written)"
          + (f", or the default of {code_before}" if code_before else "")
          + "; pods packed onto the fullest nodes or spread over any with room. writes: changes of gpugate's "
          "labels a Node watcher saw; events: every Node update event it saw; writes < interval apart: a node "
          f"written again sooner than 0.9 x {DEFAULT_INTERVAL:g} s, goal 0 with the default)")


# ---- the run ------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--burst", type=int, default=2000, help="GPU pods bound then finished, per arm")
    parser.add_argument("--connections", type=int, default=6, help="HTTPS connections that create the objects")
    parser.add_argument("--memory-floor-gb", type=float, default=4.0,
                        help="stop when the machine's MemAvailable falls under this")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--code-before", metavar="DIR|REV",
                        help="also measure another checkout's balancer (a directory, or a git revision of this "
                             "repository, unpacked with `git archive`), e.g. main: before and after a change, one run")
    parser.add_argument("--code", type=Path, default=REPO, metavar="DIR",
                        help="the checkout whose balancer is measured (default: this one)")
    parser.add_argument("--patch-cost", type=int, default=0, metavar="N",
                        help="at the end, patch N nodes per patch kind and print the API server's CPU per patch")
    parser.add_argument("--placements", nargs="+", choices=PLACEMENTS, default=list(PLACEMENTS),
                        help="how each arm's burst places its pods (each a burst of its own)")
    parser.add_argument("--patch-rounds", type=int, default=3, help="rounds of the --patch-cost arms (median)")
    parser.add_argument("--labelling-only", action="store_true",
                        help="measure the first labelling only, no bursts")
    args = parser.parse_args()
    found = binaries.paths()
    if found is None:
        raise SystemExit("the e2e control-plane binaries are not built: python -m tests.e2e.binaries build")
    unpacked = Path(tempfile.mkdtemp(prefix="balancer-cluster-code-"))
    try:
        return run(args, found, checkout(args.code_before, unpacked / "before") if args.code_before else None)
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)


def checkout(where: str, into: Path) -> Path:
    """``where`` if it is a directory (a checkout), else that git revision of this repository
    unpacked into ``into``; a clear error for neither."""
    if Path(where).is_dir():
        return Path(where)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", where], capture_output=True,
                             check=False)
    if archive.returncode:
        raise SystemExit(f"--code-before {where}: neither a directory nor a git revision of {REPO} "
                         f"({archive.stderr.decode().strip()})")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run(args: argparse.Namespace, found: Binaries, code_before: Path | None) -> int:
    """The whole run (see the module docstring); ``code_before`` is the other checkout, if any."""
    rng = random.Random(args.seed)
    run_began = time.monotonic()
    print("starting the control plane ...", flush=True)
    plane = controlplane.ControlPlane(found, settings=controlplane.Settings(
        controller_manager_args=NO_NODE_LIFECYCLE)).start()
    guard = MemoryGuard({p.name: p.pid for p in plane.processes}, args.memory_floor_gb * 1024).start()
    seen = NodeWatch()
    firsts: dict[str, dict[str, float]] = {}
    results: dict[str, dict[str, float]] = {}
    costs: dict[str, list[tuple[float, float]]] = {}
    try:
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        core = client.CoreV1Api(api)
        for namespace in (NAMESPACE, SYSTEM):
            core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        apply_rbac(plane.kubeconfig)
        wait(lambda: bool(core.list_namespaced_service_account(NAMESPACE, field_selector="metadata.name=default")
                          .items), timeout=120, what="the default ServiceAccount in the bench namespace")
        bulk = Bulk(plane, args.connections, guard)

        names = [f"gpu-{i:05d}" for i in range(args.nodes)]
        etcd = EtcdBulk(plane, max(args.connections // 2, 1), guard)
        took = etcd.put(args.nodes, lambda i: (f"/registry/minions/{names[i]}", stored(
            realistic_node(i, random.Random(args.seed * 1_000_003 + i)))))
        print(f"{args.nodes} nodes in etcd in {took:.0f} s", flush=True)

        free: dict[str, int] = {}
        shapes: list[tuple[str, int, int]] = []
        per_node = max(args.pods // max(args.nodes, 1), 1)
        for name in names:
            fill = rng.randint(0, 6)  # room left on every node for the bursts
            free[name] = 8 - fill
            shapes += [(name, gpus, rng.choice(ENV_COUNTS)) for gpus in node_pods(rng, per_node, fill)]

        def bound_pod(i: int) -> tuple[str, Obj]:
            node, gpus, env = shapes[i]
            pod = stored(realistic_pod(i, node, gpus, env_count=env), NAMESPACE)
            return f"/registry/pods/{NAMESPACE}/{pod['metadata']['name']}", pod

        took = etcd.put(len(shapes), bound_pod, "pods")
        print(f"{len(shapes)} pods in etcd in {took:.0f} s ({len(shapes) / took:.0f}/s)", flush=True)
        took += wait(lambda: cached(plane, "pods") >= len(shapes) and cached(plane, "nodes") >= args.nodes,
                     timeout=3600, what="every object in the API server's watch cache", guard=guard,
                     every=3.0)  # /metrics costs the API server CPU it needs for taking the objects in
        gpu_pods = sum(1 for _, gpus, _ in shapes if gpus)
        sample = orjson.loads(core.list_namespaced_pod(NAMESPACE, limit=200, _preload_content=False).data)["items"]
        pod_kb = sum(len(orjson.dumps(p)) for p in sample) / max(len(sample), 1) / 1024
        stored_node = core.read_node(names[0]).status.allocatable or {}
        assert stored_node.get("nvidia.com/gpu") == "8", f"node status not as stored: {stored_node}"
        guard.sample()
        print(f"{len(shapes)} pods ({gpu_pods} with GPUs, {pod_kb:.1f} KB each as served) in the API server's "
              f"watch cache {took:.0f} s after the first put; control plane RSS (MB): "
              + ", ".join(f"{k} {v:.0f}" for k, v in guard.peaks.items()), flush=True)
        loaded = time.monotonic() - run_began

        version = core.list_node(limit=1).metadata.resource_version
        watcher = threading.Thread(target=seen.run, args=(config.new_client_from_config(
            config_file=str(plane.kubeconfig)), version), name="node-watch", daemon=True)
        watcher.start()
        time.sleep(1.0)
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            counts_before = apiserver_counts(plane)
            balancers_began = time.monotonic()
            arms = [("after", args.code)] + ([("before", code_before)] if code_before is not None else [])
            for n, (arm, code) in enumerate(arms):  # after first: a run cut short still has its figures
                if n:  # every arm starts from unlabelled nodes, as stored at first
                    reset_nodes(plane, etcd, core, seen, names, args.seed, guard)
                balancer, firsts[arm] = first_labelling(plane, core, tmp, seen, args.nodes, guard, arm, code)
                print(f"  first labelling, {arm}: " + json.dumps(firsts[arm]), flush=True)
                balancer.stop()
            if not args.labelling_only:
                arms = [(f"{DEFAULT_INTERVAL:g}s", DEFAULT_INTERVAL, args.code), ("0s", 0.0, args.code)] + (
                    [("old", DEFAULT_INTERVAL, code_before)] if code_before else [])
                offsets = itertools.count(10_000_000, 1_000_000)
                for n, (short, interval, code) in enumerate(arms):
                    # One balancer at a time: each arm's stops before the next starts (and hands the
                    # lease back), so no column measures another arm's balancer.
                    balancer = start_balancer(plane, core, tmp, interval, short, code)
                    guard.pids["balancer"] = balancer.proc.pid
                    wait(lambda b=balancer: leading(b), timeout=900, what=f"the {short} balancer leading after "
                         "its first pass", balancer=balancer, guard=guard)
                    time.sleep(2.0)
                    for placement in args.placements:
                        results[f"{short} {placement}"] = burst(bulk, plane, balancer, seen, free, args.burst,
                                                                interval, next(offsets), placement, rng)
                        print(f"  burst done: {short} {placement}: " + json.dumps(results[f"{short} {placement}"]),
                              flush=True)  # a run cut short still leaves its figures
                    if not n:
                        cpu_default, (_, peak_default) = cpu_seconds(balancer.proc.pid), rss_mb(balancer.proc.pid)
                    balancer.stop()
            balancer.stop()
            counts_all = delta(apiserver_counts(plane), counts_before)
            elapsed = time.monotonic() - balancers_began
            guard.sample()
            if args.patch_cost:
                costs = patch_costs(plane, core, etcd, names[:min(args.patch_cost, args.nodes)], args.seed,
                                    args.patch_rounds)
    finally:
        for started in STARTED:
            if started.proc.poll() is None:
                started.stop()
        seen.stop.set()
        guard.stop.set()
        plane.stop()

    total = time.monotonic() - run_began
    print(f"\n{args.nodes} nodes, {len(shapes)} pods ({gpu_pods} with GPUs, {pod_kb:.1f} KB each as stored) "
          f"on the real API server; loaded in {loaded:.0f} s, whole run {total:.0f} s")
    print_firsts(firsts)
    if not args.labelling_only:
        print(f"{'balancer CPU to the end of its burst (s) / peak RSS (MB)':<52}{cpu_default:>12.1f}"
              f" / {peak_default:.0f}")
    print(f"{'429s over the run (requests / APF rejections)':<52}{counts_all.get('429', 0):>12.0f}"
          f" / {counts_all.get('rejected', 0):.0f}   goal: none")
    print(f"{'API requests/s over the balancers run, all':<52}{counts_all.get('requests', 0) / elapsed:>12.0f}")
    print("peak RSS (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in guard.peaks.items()))
    if costs:
        patchcost.print_costs(costs, min(args.patch_cost, args.nodes))
    if results:
        print_bursts(results, args.burst, code_before)
    if seen.error:
        print(f"node watch error: {seen.error}")
    print(json.dumps({"first labelling": firsts, "results": results,
                      "patch_costs_ms": costs, "peaks_mb": guard.peaks, "counts": counts_all}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
