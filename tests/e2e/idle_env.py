"""Idle reclaim's stack for the e2e test and the docs' picture: exporter, Prometheus, two balancer replicas.

- a dcgm-exporter page (``tests/dcgmexporter.py``) the test fills with each pod's GPU activity;
- Debian's Prometheus scraping it and both replicas' /metrics every 500 ms, with the shipped
  gpugate-usage rules loaded (their interval scaled from 1m to 1s, nothing else changed);
- ``gpugate balance --usage --policies DIR --prometheus URL`` twice, as the balancer's
  ServiceAccount with exactly manifests/balancer's RBAC (a missing verb would be a 403: the
  Events, the annotation and the eviction must all be allowed by it), sharing the Lease.

Every process is stopped by its PID however the caller ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.dcgmexporter import Exporter
from tests.e2e.balancer_access import (
    INVENTORY,
    LEASE,
    NAMESPACE,
    QUICK_CONFIG,
    BalancerProcess,
    as_account,
    forget_earlier_runs,
    rbac_applied,
)
from tests.e2e.waiting import wait_until
from tests.promserver import Prometheus
from webhook.localcluster.cluster import Cluster
from webhook.localcluster.processes import free_port, terminate

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "manifests" / "observability" / "usage-rules.yaml"
CONFIG = QUICK_CONFIG + """\
inventory: {enabled: false}
prometheus: {window: "3s", interval: 0.5, timeout: 2, stale_after: 3}
usage: {idle_interval: 1, min_step: 1, evictions_per_hour: 3600, eviction_burst: 3}
"""
"""The idle look every second, one-second measuring steps (the exporter is scraped every 500 ms)."""


class Replica(BalancerProcess):
    def tail(self, lines: int = 30) -> str:
        text = self.text().splitlines()
        return f"--- {self.identity} (exit {self.process.poll()}):\n" + "\n".join(text[-lines:])


@dataclass
class IdleStack:
    cluster: Cluster
    exporter: Exporter
    prometheus: Prometheus
    replicas: list[Replica] = field(default_factory=list)

    def leader(self) -> Replica:
        return next(r for r in self.replicas if r.metric("gpugate_balancer_leader") == 1)

    def explain(self) -> str:
        return "\n".join(r.tail() for r in self.replicas) + f"\n--- prometheus:\n{self.prometheus.process.tail(10)}"


def rule_file(workdir: Path) -> Path:
    groups = yaml.safe_load(RULES.read_text())["spec"]
    for group in groups["groups"]:
        group["interval"] = "1s"
    path = workdir / "usage.rules.yaml"
    path.write_text(yaml.safe_dump(groups, sort_keys=False, width=100000))
    return path


@contextmanager
def idle_stack(cluster: Cluster, workdir: Path, policy: str) -> Iterator[IdleStack]:
    """The stack of the module docstring; ``policy``: the GPUPolicy file's text."""
    with ExitStack() as stack:
        stack.enter_context(rbac_applied(cluster))
        forget_earlier_runs(cluster, LEASE, INVENTORY)
        stack.callback(forget_earlier_runs, cluster, LEASE, INVENTORY)
        exporter = Exporter()
        stack.callback(exporter.stop)
        ports = [free_port(), free_port()]
        prometheus = Prometheus(workdir / "prometheus", {
            "nvidia-dcgm-exporter": [exporter.target],
            "gpugate-balancer": [f"127.0.0.1:{p}" for p in ports]},
            interval="500ms", rule_files=[rule_file(workdir)], evaluation_interval="1s")
        stack.callback(prometheus.stop)
        policies = workdir / "policies"
        policies.mkdir()
        (policies / "idle.yaml").write_text(policy)
        (workdir / "balancer.yaml").write_text(CONFIG)
        found = IdleStack(cluster, exporter, prometheus)
        for identity, port in zip(("idle-a", "idle-b"), ports, strict=True):
            log = workdir / f"{identity}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [sys.executable, "-m", "webhook.cli", "balance", *as_account(cluster, workdir, identity),
                     "--config", str(workdir / "balancer.yaml"), "--usage", "--policies", str(policies),
                     "--prometheus", prometheus.url, "--identity", identity, "--lease-name", LEASE,
                     "--lease-namespace", NAMESPACE, "--health-bind", f"127.0.0.1:{port}"],
                    cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
            stack.callback(terminate, process, 20)
            found.replicas.append(Replica(identity, process, port, log))
            time.sleep(0.5)  # idle-a asks for the Lease first, so it is the one that leads
        wait_until(lambda: sum(_leads(r) for r in found.replicas) == 1, timeout=60, what="one leading replica",
                   explain=found.explain)
        yield found


def _leads(replica: Replica) -> float:
    try:
        return replica.metric("gpugate_balancer_leader")
    except OSError:
        return 0.0
