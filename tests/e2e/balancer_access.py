"""What the e2e modules that run ``gpugate balance`` share: its namespace, its RBAC as shipped, its /metrics.

- ``rbac_applied`` applies the ServiceAccount and RBAC exactly as ``kubectl kustomize
  manifests/balancer`` renders them (in the shared gpugate-system namespace) and deletes them on
  the way out (:func:`tests.e2e.accounts.applied`);
- ``as_account`` gives the flags that run a balancer as that ServiceAccount, as a pod would;
- ``forget_earlier_runs`` clears the Lease and the inventory an earlier test left;
- ``scrape`` reads one metric from a process's plaintext /metrics, summed over the series whose
  labels match; ``answers_ok`` probes its health port;
- ``QUICK_CONFIG`` is the balancer's timing for a test.

Used by test_balancer.py, test_inventory.py and test_extender.py.
"""

from __future__ import annotations

import base64
import http.client
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client

from tests.e2e.accounts import applied, token
from tests.e2e.accounts import kubectl as kubectl_stdout  # noqa: F401 - test_balancer imports it from here
from tests.e2e.webhook_fixture import kustomize
from webhook.localcluster import processes
from webhook.localcluster.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "gpugate-system"
ACCOUNT = "gpugate-balancer"
LEASE = "gpugate-balancer"  # the one Lease the shipped Role lets the balancer read and renew
INVENTORY = "gpugate-inventory"  # the ConfigMap the balancer publishes the GPUInventory in
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
QUICK_CONFIG = """\
lease: {duration: 4, renew_deadline: 3, retry_period: 0.5}
backoff_initial: 0.2
backoff_max: 2
watch_timeout: 30
write_interval: 1
"""
"""``gpugate balance --config`` with the Lease timing scaled down (the ratios are the defaults') and
one-second writes, so a test waits on events and a failover, not on the production defaults."""


@contextmanager
def rbac_applied(cluster: Cluster) -> Iterator[str]:
    """The balancer's ServiceAccount and RBAC as shipped, applied for the block; yields their YAML."""
    docs = [d for d in kustomize(ROOT / "manifests" / "balancer") if d["kind"] in RBAC_KINDS]
    assert {d["kind"] for d in docs} == set(RBAC_KINDS)
    with applied(cluster, docs, NAMESPACE) as text:
        yield text


def as_account(cluster: Cluster, folder: Path, identity: str, account: str = ACCOUNT) -> list[str]:
    """The ``gpugate balance`` flags that reach the API server as ``account`` (the shipped ServiceAccount
    unless told), as a pod would: the server's URL, a one-hour token and the API server's CA, the
    last two written into ``folder`` (``<identity>.token``, ``apiserver-ca.crt``)."""
    token_file = folder / f"{identity}.token"
    token_file.write_text(token(cluster, account, NAMESPACE))
    server_entry = yaml.safe_load(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]
    ca_file = folder / "apiserver-ca.crt"
    if "certificate-authority-data" in server_entry:
        ca_file.write_bytes(base64.b64decode(server_entry["certificate-authority-data"]))
    else:
        ca_file.write_bytes(Path(server_entry["certificate-authority"]).read_bytes())
    return ["--server", server_entry["server"], "--token-file", str(token_file),
            "--certificate-authority", str(ca_file)]


def forget_earlier_runs(cluster: Cluster, lease: str, inventory: str) -> None:
    """No Lease holder and no inventory ConfigMap left by an earlier test: a balancer starts both afresh."""
    for delete in (lambda: client.CoordinationV1Api(cluster.api_client()).delete_namespaced_lease(lease, NAMESPACE),
                   lambda: cluster.core().delete_namespaced_config_map(inventory, NAMESPACE)):
        try:
            delete()
        except client.ApiException as error:
            assert error.status == 404


def answers_ok(port: int, path: str) -> bool:
    """Whether the balancer's plaintext health port on 127.0.0.1 answers ``path`` (/healthz, /readyz)
    with 200; False while it is not listening yet."""
    try:
        return processes.http_get(http.client.HTTPConnection("127.0.0.1", port, timeout=2), path)[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def scrape(port: int, name: str, **labels: str) -> float:
    """The sum of metric ``name``'s series on 127.0.0.1:``port``/metrics whose labels include ``labels``."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    text = opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")) and all(w in line for w in want))


@dataclass
class BalancerProcess:
    """``gpugate balance`` started by an e2e rig in its own process: its identity, /metrics port and log."""

    identity: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def metric(self, name: str, **labels: str) -> float:
        return scrape(self.port, name, **labels)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        processes.Process(self.identity, self.process, (self.port,), self.log).stop(20.0)
