"""The balancer with ``--prometheus`` against a real Prometheus that scrapes DCGM exporter pages.

Used by ``test_balancer_prometheus.py`` (asserts) and ``tools/telemetry_pictures.py`` (plots).
Three processes, each stopped by PID however the caller ends: the test's two dcgm-exporter
endpoints (``tests/dcgmexporter.py``: the released exporter writing ``Hostname`` and an upgraded
one writing ``hostname``), Debian's Prometheus scraping them and the balancer's own /metrics,
and ``gpugate balance`` itself (a process, the CLI as deployed, admin kubeconfig: RBAC is
``test_balancer.py``'s subject).
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.dcgmexporter import Exporter
from tests.promserver import Prometheus
from webhook.localcluster import processes
from webhook.localcluster.cluster import Cluster
from webhook.localcluster.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRAPE = "500ms"
WINDOW = "3s"
"""The balancer's avg_over_time window, scaled down from 5m with the scrape interval (30 s -> 0.5 s)."""
STALE_AFTER = 3.0
CONFIG = f"""\
prometheus: {{window: "{WINDOW}", interval: 0.5, timeout: 2, stale_after: {STALE_AFTER}}}
write_interval: 0.5
backoff_initial: 0.2
backoff_max: 2
inventory: {{enabled: false}}
"""
LOAD = "gpugate.io/gpu-load"


@dataclass
class Telemetry:
    cluster: Cluster
    prometheus: Prometheus
    released: Exporter
    """dcgm-exporter as released (``Hostname``)."""
    upgraded: Exporter
    """The next dcgm-exporter (``hostname``), as during a DaemonSet rollout."""
    balancer: subprocess.Popen[bytes]
    health_port: int
    log: Path

    def metric(self, name: str) -> float:
        """One unlabelled series of the balancer's /metrics, read directly (not through Prometheus)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        text = opener.open(f"http://127.0.0.1:{self.health_port}/metrics", timeout=5).read().decode()
        [value] = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
        return value

    def tier(self, node: str) -> str | None:
        return (self.cluster.core().read_node(node).metadata.labels or {}).get(LOAD)

    def log_tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return f"--- balancer (exit {self.balancer.poll()}):\n" + "\n".join(text[-lines:]) + \
            f"\n--- prometheus:\n{self.prometheus.process.tail(10)}"


@contextmanager
def telemetry(cluster: Cluster, workdir: Path, *, lease_namespace: str) -> Iterator[Telemetry]:
    """Exporters, Prometheus and the balancer, up; all stopped on the way out."""
    with ExitStack() as stack:
        released, upgraded = Exporter(), Exporter()
        stack.callback(released.stop)
        stack.callback(upgraded.stop)
        health_port = free_port()
        prometheus = Prometheus(workdir / "prometheus", {
            "nvidia-dcgm-exporter": [released.target, upgraded.target],
            "gpugate-balancer": [f"127.0.0.1:{health_port}"]}, interval=SCRAPE)
        stack.callback(prometheus.stop)
        config = workdir / "balancer.yaml"
        config.write_text(CONFIG)
        log = workdir / "balancer.log"
        with log.open("wb") as out:
            balancer = subprocess.Popen(
                [sys.executable, "-m", "webhook.cli", "balance", "--config", str(config),
                 "--prometheus", prometheus.url, "--identity", "e2e-telemetry", "--lease-name", "gpugate-telemetry",
                 "--lease-namespace", lease_namespace, "--health-bind", f"127.0.0.1:{health_port}"],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "KUBECONFIG": str(cluster.kubeconfig)})
        # Stopped like every harness process: SIGTERM (the balancer releases its Lease), then SIGKILL.
        stack.callback(processes.Process("gpugate-balance", balancer, (health_port,), log).stop, 20.0)
        yield Telemetry(cluster, prometheus, released, upgraded, balancer, health_port, log)

