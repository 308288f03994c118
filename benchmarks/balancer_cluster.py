"""The balancer against the real API server: GPU nodes and bound pods of realistic size on the e2e
control plane (tests/e2e: etcd, kube-apiserver v1.36.3, kube-controller-manager, kube-scheduler,
the fake kubelet marking bound pods Running), ``gpugate balance`` as its own process.

Prints, from one run:

- wall time from the balancer's start to every GPU node labelled (goal < 60 s), seen by a Node
  watcher, and the balancer's CPU seconds and resident memory meanwhile;
- API requests per second the API server served over the run, and its 429s (priority and
  fairness; goal: none), from its own ``apiserver_request_total``;
- Node writes per pod bind and per pod finish, and the Node update events a watcher of all nodes
  sees per GPU pod bound, for a burst of binds then finishes, once with ``--write-interval 0``
  (every change written: the label churn before coalescing) and once with the Deployment's
  default (10 s: a change of gpu-free alone waits out the interval), side by side; at most one
  gpu-free-only write per node per interval is the goal.

Objects come from benchmarks/balancer_scale.py's generators (nodes of 10-50 KB, pods of 4-15 KB),
without the server-set metadata. The full size (5,000 nodes, 150,000 pods) stores about 1.5 GB in
etcd; on two shared cores create it once and expect tens of minutes.

    python benchmarks/balancer_cluster.py [--nodes 5000] [--pods 150000] [--burst 2000]
    python benchmarks/balancer_cluster.py --nodes 20 --pods 100 --burst 20      # shortest
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubernetes import client, watch  # noqa: E402

from benchmarks.balancer_scale import (  # noqa: E402
    cpu_seconds,
    metric,
    node_pods,
    realistic_node,
    realistic_pod,
    rss_mb,
)
from tests.e2e import binaries, processes  # noqa: E402
from tests.e2e.cluster import Cluster  # noqa: E402
from webhook.names import GPU_FREE_LABEL, GPU_LOAD_LABEL  # noqa: E402

NAMESPACE = "bench"
Obj = dict[str, Any]
SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "selfLink")


def creatable(obj: Obj) -> Obj:
    """The object as a client sends it: without what the API server sets."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in SERVER_SET}
    meta.pop("namespace", None)
    meta.pop("ownerReferences", None)  # the Jobs they name do not exist here
    return {**obj, "metadata": meta}


@dataclass
class NodeWatch:
    """Every Node update event a watcher of all nodes sees, and the ones that changed gpugate's labels."""

    events: list[float] = field(default_factory=list)
    label_changes: list[tuple[float, str]] = field(default_factory=list)
    labelled: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, core: client.CoreV1Api, version: str) -> None:
        try:
            self._follow(core, version)
        except Exception:
            if not self.stop.is_set():  # the control plane going away at the end ends the stream
                raise

    def _follow(self, core: client.CoreV1Api, version: str) -> None:
        marks: dict[str, tuple[str | None, str | None]] = {}
        while not self.stop.is_set():
            stream = watch.Watch()
            for event in stream.stream(core.list_node, resource_version=version, timeout_seconds=30,
                                       allow_watch_bookmarks=True, _preload_content=False):
                obj = event["raw_object"]
                version = obj["metadata"]["resourceVersion"]
                if event["type"] != "MODIFIED":
                    continue
                now = time.monotonic()
                self.events.append(now)
                name, labels = obj["metadata"]["name"], obj["metadata"].get("labels") or {}
                mark = (labels.get(GPU_FREE_LABEL), labels.get(GPU_LOAD_LABEL))
                if mark != marks.get(name, (None, None)):
                    self.label_changes.append((now, name))
                    marks[name] = mark
                if all(mark):
                    self.labelled.add(name)
                if self.stop.is_set():
                    stream.stop()


def in_parallel(function: Callable[[Any], object], items: list[Any], threads: int = 8) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(function, items))


def apiserver_requests(cluster: Cluster) -> tuple[float, float]:
    """All requests the API server counted so far, and its 429s."""
    assert cluster.plane is not None
    status, body = cluster.plane.get("/metrics")
    assert status == 200, status
    total = throttled = 0.0
    for line in body.decode().splitlines():
        if line.startswith("apiserver_request_total{"):
            value = float(line.rsplit(" ", 1)[1])
            total += value
            if 'code="429"' in line:
                throttled += value
    return total, throttled


def start_balancer(cluster: Cluster, tmp: Path, write_interval: float, tag: str) -> tuple[subprocess.Popen[bytes], int]:
    port = processes.free_port()
    config = tmp / f"balancer-{tag}.yaml"
    config.write_text("resync_interval: 3600\nwatch_timeout: 600\n")
    log = (tmp / f"balancer-{tag}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "webhook.cli", "balance", "--config", str(config), "--identity", f"bench-{tag}",
         "--lease-namespace", NAMESPACE, "--lease-name", f"bench-{tag}", "--write-interval", str(write_interval),
         "--health-bind", f"127.0.0.1:{port}", "--log-level", "WARNING"],
        cwd=REPO, env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PYTHONPATH": str(REPO)},
        stdout=log, stderr=subprocess.STDOUT)
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def burst(cluster: Cluster, cores: list[client.CoreV1Api], nodes: list[str], free: dict[str, int], count: int,
          seen: NodeWatch, settle: float, tag: str) -> dict[str, float]:
    """``count`` GPU pods bound then deleted (finished); Node events and label writes per pod."""
    rng = random.Random(tag)
    targets = []
    for _ in range(count):
        roomy = [n for n in nodes if free[n]]
        node = rng.choice(roomy)
        free[node] -= 1
        targets.append(node)
    offset = 10_000_000 if tag == "a" else 20_000_000
    bodies = [creatable(realistic_pod(offset + i, node, 1)) for i, node in enumerate(targets)]
    names = [body["metadata"]["name"] for body in bodies]
    start_events, start_changes = len(seen.events), len(seen.label_changes)
    began = time.monotonic()
    in_parallel(lambda pair: cores[pair[0] % len(cores)].create_namespaced_pod(
        NAMESPACE, pair[1], _preload_content=False), list(enumerate(bodies)))
    time.sleep(settle)
    bound_events, bound_changes = len(seen.events) - start_events, len(seen.label_changes) - start_changes
    mid_events, mid_changes = len(seen.events), len(seen.label_changes)
    in_parallel(lambda pair: cores[pair[0] % len(cores)].delete_namespaced_pod(
        pair[1], NAMESPACE, grace_period_seconds=0), list(enumerate(names)))
    time.sleep(settle)
    for node in targets:
        free[node] += 1
    busiest = Counter(name for at, name in seen.label_changes[start_changes:] if at >= began)
    return {"bind events": bound_events / count, "bind writes": bound_changes / count,
            "finish events": (len(seen.events) - mid_events) / count,
            "finish writes": (len(seen.label_changes) - mid_changes) / count,
            "busiest node writes": max(busiest.values(), default=0), "seconds": time.monotonic() - began}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--burst", type=int, default=2000, help="GPU pods bound then finished, per arm")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    found = binaries.paths()
    if found is None:
        raise SystemExit("the e2e control-plane binaries are not built: python -m tests.e2e.binaries build")
    rng = random.Random(args.seed)
    print("starting the control plane ...", flush=True)
    cluster = Cluster.local(found)
    try:
        core = cluster.core()
        cores = [client.CoreV1Api(cluster.api_client()) for _ in range(8)]
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        names = [f"gpu-{i:05d}" for i in range(args.nodes)]
        t0 = time.monotonic()

        def make_node(i: int) -> None:
            node = creatable(realistic_node(i, rng))
            status = node.pop("status")
            api = cores[i % len(cores)]
            api.create_node(node, _preload_content=False)
            api.patch_node_status(node["metadata"]["name"], {"status": status})
        in_parallel(make_node, list(range(args.nodes)))
        print(f"{args.nodes} nodes in {time.monotonic() - t0:.0f} s", flush=True)
        free: dict[str, int] = {}
        shapes: list[tuple[str, int]] = []
        per_node = max(args.pods // max(args.nodes, 1), 1)
        for name in names:
            fill = rng.randint(0, 6)  # room left on every node for the bursts
            free[name] = 8 - fill
            shapes += [(name, gpus) for gpus in node_pods(rng, per_node, fill)]
        t0 = time.monotonic()
        in_parallel(lambda i: cores[i % len(cores)].create_namespaced_pod(
            NAMESPACE, creatable(realistic_pod(i, shapes[i][0], shapes[i][1])), _preload_content=False),
            list(range(len(shapes))))
        print(f"{len(shapes)} pods in {time.monotonic() - t0:.0f} s", flush=True)

        seen = NodeWatch()
        version = core.list_node(limit=1).metadata.resource_version
        watcher = threading.Thread(target=seen.run, args=(core, version), daemon=True)
        watcher.start()
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            requests_before, throttled_before = apiserver_requests(cluster)
            started = time.monotonic()
            proc, port = start_balancer(cluster, tmp, 0, "before")
            while len(seen.labelled) < args.nodes:
                if proc.poll() is not None or time.monotonic() - started > 900:
                    print(f"balancer exited or too slow; {len(seen.labelled)} of {args.nodes} labelled:\n"
                          f"{processes.tail(tmp / 'balancer-before.log')}", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            to_labelled = time.monotonic() - started
            cpu_labelled, (rss, peak) = cpu_seconds(proc.pid), rss_mb(proc.pid)
            time.sleep(2)
            results = {"before (write_interval 0)": burst(cluster, cores, names, free, args.burst, seen, 5, "a")}
            stop(proc)
            proc, port = start_balancer(cluster, tmp, 10, "after")
            while metric(port, "gpugate_balancer_last_full_sync_timestamp_seconds") <= 0:
                time.sleep(0.2)
            results["after (write_interval 10, default)"] = burst(cluster, cores, names, free, args.burst, seen,
                                                                  12, "b")
            cpu_end, (_, peak_end) = cpu_seconds(proc.pid), rss_mb(proc.pid)
            stop(proc)
            requests_after, throttled_after = apiserver_requests(cluster)
            elapsed = time.monotonic() - started
        seen.stop.set()
    finally:
        cluster.stop()

    print(f"\n{args.nodes} nodes, {len(shapes)} pods on the real API server")
    print(f"{'start to all nodes labelled, wall (s)':<50}{to_labelled:>10.1f}   goal < 60")
    print(f"{'balancer CPU to all labelled (s) / RSS (MB) / peak':<50}{cpu_labelled:>10.1f} / {rss:.0f} / {peak:.0f}")
    print(f"{'balancer CPU, whole second run (s) / peak (MB)':<50}{cpu_end:>10.1f} / {peak_end:.0f}")
    print(f"{'API requests/s over the run / 429s':<50}{(requests_after - requests_before) / elapsed:>10.0f}"
          f" / {throttled_after - throttled_before:.0f}   goal: no 429")
    print(f"\nburst of {args.burst} GPU pods bound, then finished (per pod)")
    keys = ("bind writes", "finish writes", "bind events", "finish events", "busiest node writes")
    print(f"{'':<38}" + "".join(f"{k:>21}" for k in keys))
    for label, figures in results.items():
        print(f"{label:<38}" + "".join(f"{figures[k]:>21.2f}" for k in keys))
    print("(writes: gpugate label changes a watcher sees; events: every Node update event it sees, the fake "
          "kubelet's heartbeats included)")
    print(json.dumps({"to_labelled": to_labelled, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
