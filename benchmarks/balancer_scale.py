"""Balancer at scale: 5,000 GPU nodes and 150,000 pods in the local fake API server.

Runs ``gpugate balance`` as its own process (so its memory is its own) against
tests/kubefake.py in this process, and prints:

- time from process start to every GPU node labelled (goal < 60 s);
- resident memory of the balancer, now and peak (goal < 500 MB);
- CPU cost per watch event (goal < 1 ms): balancer CPU seconds over a burst of pod events
  (pods finishing and new pods starting), including the node patches they cause.

Usage: python benchmarks/balancer_scale.py [--nodes 5000] [--pods 150000] [--events 20000]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.kubefake import FakeKube  # noqa: E402
from webhook.names import GPU_FREE_LABEL, GPU_LOAD_LABEL  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def node(i: int) -> dict:
    name = f"gpu-{i:05d}"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type":
                "p5.48xlarge", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                "topology.kubernetes.io/zone": f"zone-{i % 3}"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "190", "memory": "2000Gi", "nvidia.com/gpu": "8", "pods": "110"},
                       "capacity": {"cpu": "192", "memory": "2048Gi", "nvidia.com/gpu": "8", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}


def pod(i: int, node_name: str, gpus: int, phase: str = "Running") -> dict:
    resources: dict = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"job-{i:06d}-worker", "namespace": f"team-{i % 40}",
                         "labels": {"app": "trainer", "gpugate.io/group": f"job-{i // 4}"},
                         "annotations": {"gpugate.io/policy": "training@3f2a9c1b7d0e"},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{i // 4}",
                                              "uid": f"00000000-0000-0000-0000-{i:012d}", "controller": True}]},
            "spec": {"nodeName": node_name, "schedulerName": "default-scheduler", "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "registry.example.com/ml/trainer:2.4.1",
                                     "command": ["python", "-m", "train"], "args": ["--epochs", "10"],
                                     "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                                     "resources": resources}],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
            "status": {"phase": phase, "podIP": f"10.{i % 250}.{(i // 250) % 250}.{i % 200 + 1}",
                       "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}]}}


def rss_mb(pid: int) -> tuple[float, float]:
    text = Path(f"/proc/{pid}/status").read_text()
    values = {k: int(re.search(rf"{k}:\s+(\d+)", text).group(1)) / 1024 for k in ("VmRSS", "VmHWM")}
    return values["VmRSS"], values["VmHWM"]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def metric(port: int, name: str) -> float:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        text = opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return 0.0
    total = 0.0
    for line in text.splitlines():  # summed over label values
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    fk = FakeKube(record_requests=False).start()
    t0 = time.perf_counter()
    fk.put_many(node(i) for i in range(args.nodes))
    names = [f"gpu-{i:05d}" for i in range(args.nodes)]
    # Every node gets a random GPU fill (0..8 GPUs in pods of 1, 2 or 4), the rest of its pods are
    # CPU-only, like a real cluster where most pods (daemons, sidecars, services) hold no GPU.
    gpu_pods: list[int] = []
    shapes: list[tuple[str, int]] = []
    free = {}
    per_node = args.pods // args.nodes
    for name in names:
        fill = rng.randint(0, 8)
        free[name] = 8 - fill
        node_pods = []
        while fill:
            gpus = rng.choice([g for g in (1, 2, 4) if g <= fill])
            node_pods.append(gpus)
            fill -= gpus
        node_pods += [0] * max(per_node - len(node_pods), 0)
        for gpus in node_pods:
            if gpus:
                gpu_pods.append(len(shapes))
            shapes.append((name, gpus))
    fk.put_many(pod(i, node_name, gpus) for i, (node_name, gpus) in enumerate(shapes))
    print(f"fake API server: {args.nodes} nodes, {len(shapes)} pods ({len(gpu_pods)} with GPUs) stored in "
          f"{time.perf_counter() - t0:.1f} s")

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "balancer.yaml"
        config.write_text("resync_interval: 3600\nwatch_timeout: 600\n")
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "webhook.cli", "balance", "--server", fk.url, "--config", str(config),
             "--identity", "bench", "--lease-namespace", "bench", "--health-bind", f"127.0.0.1:{port}",
             "--log-level", "WARNING"], cwd=REPO)
        try:
            def labelled(obj: dict) -> bool:
                labels = obj["metadata"].get("labels") or {}
                return GPU_FREE_LABEL in labels and GPU_LOAD_LABEL in labels

            while fk.count("v1", "Node", labelled) < args.nodes:
                if proc.poll() is not None:
                    print("balancer exited early", file=sys.stderr)
                    return 1
                if time.perf_counter() - start > 600:
                    print("not all nodes labelled after 600 s", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            to_labelled = time.perf_counter() - start
            cpu_sync = cpu_seconds(proc.pid)
            rss_sync, peak_sync = rss_mb(proc.pid)

            # Burst of pod events: half of the GPU pods finish, as many new GPU pods start.
            while metric(port, "gpugate_balancer_last_full_sync_timestamp_seconds") <= 0:
                time.sleep(0.1)
            seen_before = metric(port, "gpugate_balancer_watch_events_total")
            writes_before = metric(port, "gpugate_balancer_label_writes_total")
            cpu_before = cpu_seconds(proc.pid)
            half = min(args.events // 2, len(gpu_pods))
            finishing = rng.sample(gpu_pods, half)
            burst = [pod(i, shapes[i][0], shapes[i][1], phase="Succeeded") for i in finishing]
            for i in finishing:
                free[shapes[i][0]] += shapes[i][1]
            roomy = [n for n in names if free[n]]
            for k in range(args.events - half):
                target = rng.choice(roomy)
                while not free[target]:
                    target = rng.choice(roomy)
                free[target] -= 1
                burst.append(pod(len(shapes) + k, target, 1))
            t_burst = time.perf_counter()
            fk.put_many(burst)
            while metric(port, "gpugate_balancer_watch_events_total") - seen_before < len(burst):
                if time.perf_counter() - t_burst > 300:
                    print("events not all handled after 300 s", file=sys.stderr)
                    return 1
                time.sleep(0.05)
            # let the writes those events caused finish
            last, stable_since = -1.0, time.perf_counter()
            while time.perf_counter() - stable_since < 1.0:
                now = metric(port, "gpugate_balancer_label_writes_total")
                if now != last:
                    last, stable_since = now, time.perf_counter()
                time.sleep(0.1)
            burst_wall = time.perf_counter() - t_burst
            cpu_burst = cpu_seconds(proc.pid) - cpu_before
            writes = last - writes_before
            rss_end, peak_end = rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
        fk.stop()

    per_event_ms = cpu_burst / len(burst) * 1000
    print()
    print(f"{'figure':<44}{'measured':>14}{'goal':>12}")
    print(f"{'start to all nodes labelled (s)':<44}{to_labelled:>14.1f}{'< 60':>12}")
    print(f"{'balancer CPU during initial sync (s)':<44}{cpu_sync:>14.1f}{'':>12}")
    print(f"{'resident memory after sync (MB)':<44}{rss_sync:>14.0f}{'< 500':>12}")
    print(f"{'resident memory peak (MB)':<44}{max(peak_sync, peak_end):>14.0f}{'< 500':>12}")
    print(f"{'watch events in burst':<44}{len(burst):>14d}{'':>12}")
    print(f"{'node patches caused by the burst':<44}{writes:>14.0f}{'':>12}")
    print(f"{'balancer CPU per watch event (ms)':<44}{per_event_ms:>14.3f}{'< 1':>12}")
    print(f"{'burst wall time, incl. patches (s)':<44}{burst_wall:>14.1f}{'':>12}")
    print(f"{'exit code after SIGTERM':<44}{proc.returncode:>14d}{'0':>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
