"""The health quarantine's rig on the real control plane: DRA and device-plugin GPU nodes whose DCGM
pages a real Prometheus scrapes, and ``gpugate balance`` with a ``health:`` section.

Used by test_health.py (asserts) and benchmarks/health_quarantine.py (time from an XID to its
DeviceTaintRule). Nothing stands in for what decides: kube-scheduler allocates claims and skips
tainted devices, kube-controller-manager's device-taint eviction controller deletes pods on a
NoExecute device, Prometheus evaluates the balancer's queries, the API server validates every
DeviceTaintRule, pod and claim. The fake kubelet runs pods (a validation pod succeeds after
``complete-after``, or fails when its image is one of ``PodLifecycle.crash_images``).

The exporter's GPUs and the DRA driver's devices are the same GPUs: the ResourceSlices publish each
GPU with the UUID dcgm-exporter reports it under.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.dcgmexporter import Device, Exporter, Reading
from tests.e2e import dra_slices
from tests.e2e.balancer_access import NAMESPACE, BalancerProcess, as_account
from tests.promserver import Prometheus
from webhook import names
from webhook.balancer.quarantineledger import KEY, Ledger, decode
from webhook.balancer.quarantineplan import SELECTOR
from webhook.localcluster.cluster import Cluster
from webhook.localcluster.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPLETE_AFTER = "e2e.gpugate.io/complete-after"
VALIDATION_IMAGE = "gpugate-e2e/dcgm-validate"
GENTLE = 5.0
"""Seconds an XID 64 quarantine stays NoSchedule, its pods evicted through the Eviction API, before NoExecute."""
SCRAPE = "500ms"
HOLD, GROWTH = 3.0, 1.5
"""The hold, in seconds, and its growth: a repeat holds 4.5 s, a failed validation after it 6.75 s. A
validation pod runs 3 s (so a GPU is out at least 6 s: time for a test to see what a quarantine does)."""


def config(*, hold: float = HOLD, dry_run: bool = False, interval: float = 0.5, step: float = 1.0,
           effect: str = "NoExecute") -> str:
    """``gpugate balance --config``: the production health policy's shape with seconds for minutes."""
    return f"""\
lease: {{duration: 4, renew_deadline: 3, retry_period: 0.5}}
backoff_initial: 0.2
backoff_max: 2
watch_timeout: 30
write_interval: 1
inventory: {{enabled: false}}
prometheus: {{window: "3s", interval: 1, timeout: 2, stale_after: 5}}
health:
  enabled: true
  dry_run: {str(dry_run).lower()}
  interval: {interval}
  step: {step}
  hold: {hold}
  hold_growth: {GROWTH}
  rules:
    - {{name: fatal-xid, signal: xid, xids: [48, 74, 79, 95, 119, 120], window: 60, effect: {effect}}}
    - {{name: remap-failed, signal: xid, xids: [64], window: 60, effect: NoExecute, no_execute_after: {GENTLE}}}
    - {{name: driver-taint, signal: driver-taint, effect: NoSchedule}}
  eviction: {{api_first: true}}
  validation:
    image: {VALIDATION_IMAGE}
    command: [dcgmi, diag, -r, "1"]
    timeout: 20
    labels: {{"{COMPLETE_AFTER}": "3"}}
"""


def gpus_of(node: str, count: int, *, mig: bool = False) -> list[dra_slices.Gpu]:
    """The node's GPUs, each with the UUID its dcgm-exporter series carries."""
    return [dra_slices.Gpu(minor=i, uuid=Device(host=node, gpu=i).uuid,
                           mig_profiles=dra_slices.H100_PROFILES if mig else ()) for i in range(count)]


class Replica(BalancerProcess):
    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-lines:])


@dataclass
class HealthRig:
    cluster: Cluster
    workdir: Path
    exporter: Exporter
    prometheus: Prometheus
    readings: dict[str, list[Reading]] = field(default_factory=dict)
    replicas: list[Replica] = field(default_factory=list)

    # ---- GPUs and their DCGM pages ----------------------------------------------------------------
    def dra_node(self, nodes: Any, name: str, *, gpus: int = 8, mig: bool = False) -> list[dra_slices.Gpu]:
        """A node the DRA driver serves (no device-plugin GPUs), its slices published, its GPUs exported."""
        made = gpus_of(name, gpus, mig=mig)
        nodes.gpu(name, gpus=gpus, whole_gpus=0)
        dra_slices.publish(self.cluster.api_client(), name, made)
        self.export(name, gpus)
        return made

    def export(self, host: str, gpus: int) -> None:
        self.readings[host] = [Reading(device=Device(host=host, gpu=i), active=0.2, xid=0) for i in range(gpus)]
        self.exporter.show([r for found in self.readings.values() for r in found])

    def xid(self, host: str, gpu: int, code: int) -> float:
        """GPU ``gpu`` of ``host`` reports XID ``code`` from now on; returns when the page changed."""
        self.readings[host] = [replace(r, xid=code) if r.device.gpu == gpu else r for r in self.readings[host]]
        self.exporter.show([r for found in self.readings.values() for r in found])
        return time.monotonic()

    # ---- the balancer -----------------------------------------------------------------------------
    def start(self, identity: str, text: str) -> Replica:
        """``gpugate balance`` as the shipped ServiceAccount (its RBAC is the one tested), with ``text`` as config."""
        path = self.workdir / f"{identity}.yaml"
        path.write_text(text)
        port = free_port()
        log = self.workdir / f"{identity}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "webhook.cli", "balance", *as_account(self.cluster, self.workdir, identity),
                 "--config", str(path), "--prometheus", self.prometheus.url, "--identity", identity,
                 "--lease-name", "gpugate-balancer", "--lease-namespace", NAMESPACE,
                 "--health-bind", f"127.0.0.1:{port}"],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        replica = Replica(identity, process, port, log)
        self.replicas.append(replica)
        return replica

    def leader(self) -> Replica:
        lease = client.CoordinationV1Api(self.cluster.api_client()).read_namespaced_lease("gpugate-balancer",
                                                                                          NAMESPACE)
        return next(r for r in self.replicas if r.identity == lease.spec.holder_identity)

    def logs(self) -> str:
        return "\n".join(f"--- {r.identity}:\n{r.tail()}" for r in self.replicas) + \
            f"\n--- prometheus:\n{self.prometheus.process.tail(10)}\n{self.cluster.logs_tail(15)}"

    # ---- what the cluster holds ---------------------------------------------------------------
    def rules(self) -> dict[str, dict[str, Any]]:
        listed = client.ResourceV1Api(self.cluster.api_client()).list_device_taint_rule(
            label_selector=SELECTOR, _preload_content=False)
        return {r["metadata"]["name"]: r for r in json.loads(listed.data)["items"]}

    def ledger(self) -> Ledger:
        try:
            found = self.cluster.core().read_namespaced_config_map(names.HEALTH_LEDGER, NAMESPACE)
        except client.ApiException as err:
            if err.status == 404:
                return Ledger()
            raise
        return decode((found.data or {}).get(KEY))

    def forget(self) -> None:
        """No rule, ledger or validation pod left from an earlier balancer (or test module)."""
        resource = client.ResourceV1Api(self.cluster.api_client())
        for name in self.rules():
            resource.delete_device_taint_rule(name)
        core = self.cluster.core()
        for pod in core.list_namespaced_pod(NAMESPACE, label_selector="gpugate.io/validation").items:
            core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
        try:
            core.delete_namespaced_config_map(names.HEALTH_LEDGER, NAMESPACE)
        except client.ApiException as err:
            if err.status != 404:
                raise


@contextmanager
def health_rig(cluster: Cluster, workdir: Path, *, scrape: str = SCRAPE) -> Iterator[HealthRig]:
    """The exporter and Prometheus (scraping every ``scrape``), up; every balancer started through the rig,
    and what it left, gone after."""
    with ExitStack() as stack:
        exporter = Exporter()
        stack.callback(exporter.stop)
        exporter.show([])
        prometheus = Prometheus(workdir / "prometheus", {"nvidia-dcgm-exporter": [exporter.target]},
                                interval=scrape)
        stack.callback(prometheus.stop)
        _namespace_as_shipped(cluster)
        rig = HealthRig(cluster, workdir, exporter, prometheus)
        stack.callback(rig.forget)
        stack.callback(lambda: [r.stop() for r in rig.replicas])
        rig.forget()
        yield rig


def _namespace_as_shipped(cluster: Cluster) -> None:
    """The balancer's namespace with the labels it ships with (manifests/webhook/namespace.yaml): the
    restricted Pod Security Standard enforced, as where the validation pods go in a real install."""
    shipped = yaml.safe_load((ROOT / "manifests" / "webhook" / "namespace.yaml").read_text())
    assert shipped["metadata"]["name"] == NAMESPACE
    core = cluster.core()
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as err:
        if err.status != 409:
            raise
    core.patch_namespace(NAMESPACE, {"metadata": {"labels": shipped["metadata"]["labels"]}})


class RuleWatch:
    """When each DeviceTaintRule of the balancer's was first seen (monotonic), from a watch: the
    time-to-taint is measured from the XID's appearance on the exporter's page to this."""

    def __init__(self, cluster: Cluster) -> None:
        self.seen: dict[str, float] = {}
        self._api = client.ResourceV1Api(cluster.api_client())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rule-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(self._api.list_device_taint_rule, label_selector=SELECTOR,
                                           timeout_seconds=5):
                    name = event["object"].metadata.name
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.seen.setdefault(name, time.monotonic())
                    if self._stop.is_set():
                        break
            except Exception:
                time.sleep(0.2)
            finally:
                stream.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
