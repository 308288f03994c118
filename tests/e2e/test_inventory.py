"""The balancer publishes the GPUInventory and the real webhook right-sizes by it, on the real
control plane.

What only a real API server shows: manifests/balancer's RBAC is exactly enough to list and watch
PriorityClasses and to create and then update the ``gpugate-inventory`` ConfigMap by name (the balancer
runs as its ServiceAccount with a TokenRequest token; any 403 would show in its log and metrics, and
no ConfigMap would come); what it writes is what the webhook reads; and the loop closes: the real
scheduler binds a right-sized pod, the balancer's watch sees the slice taken, the next inventory says
so, and the webhook gives the next pod the next rung.

The one stand-in: there is no kubelet to project the ConfigMap into the webhook's volume, so
``Volume.sync`` does what the kubelet's ConfigMap volume does (writes the key's bytes to the file,
atomically by rename), reading the ConfigMap through the API as the kubelet would.

MIG profiles of an H200 (``1g.18gb``, ``2g.35gb``, ``3g.71gb``), which no other test's nodes
advertise, so nothing else in the session changes what the cluster offers of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.e2e.balancer_access import (
    INVENTORY,
    LEASE,
    NAMESPACE,
    QUICK_CONFIG,
    as_account,
    forget_earlier_runs,
    rbac_applied,
    scrape,
)
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import (
    GpugateServer,
    Namespaces,
    Obj,
    create_pod,
    pod_manifest,
    read_pod,
    shipped_webhook,
)
from webhook.kube import inventory as webhook_inventory
from webhook.localcluster.cluster import Cluster, Nodes
from webhook.localcluster.processes import free_port, terminate

ROOT = Path(__file__).resolve().parents[2]
H200 = "NVIDIA-H200"
PROFILES = ("1g.18gb", "2g.35gb", "3g.71gb")
# The inventory written within half a second of a change, so the test waits on events, not on the 5 s default.
CONFIG = QUICK_CONFIG + "inventory: {min_interval: 0.5, refresh: 30}\n"
POLICY = f"""\
apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata:
  name: e2e-inventory
spec:
  priority: 100
  match:
    namespaces: ["inv-*"]
  tolerations: auto
  rightsizing:
    migStrategy: mixed
    ladder:
      - {{mig: {PROFILES[0]}}}
      - {{mig: {PROFILES[1]}}}
      - {{mig: {PROFILES[2]}}}
"""


@pytest.fixture(scope="module")
def balancer_rbac(local: Cluster) -> Iterator[None]:
    """The ServiceAccount and RBAC exactly as ``kubectl kustomize manifests/balancer`` renders them."""
    with rbac_applied(local):
        yield


class Balancer:
    """``gpugate balance`` as the balancer's ServiceAccount, in its own process."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process, self.port, self.log = process, port, log

    def metric(self, name: str, **labels: str) -> float:
        return scrape(self.port, name, **labels)

    def tail(self) -> str:
        return f"--- balancer (exit {self.process.poll()}):\n" + \
            "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])

    def stop(self) -> None:
        terminate(self.process, grace=20)


@pytest.fixture(scope="module")
def balancer(local: Cluster, balancer_rbac: None, workdir: Path) -> Iterator[Balancer]:
    forget_earlier_runs(local, LEASE, INVENTORY)
    access = as_account(local, workdir, "e2e-inventory")
    (workdir / "balancer.yaml").write_text(CONFIG)
    port, log = free_port(), workdir / "balancer.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "webhook.cli", "balance", *access,
             "--config", str(workdir / "balancer.yaml"), "--identity", "e2e-inventory", "--lease-name", LEASE,
             "--lease-namespace", NAMESPACE, "--health-bind", f"127.0.0.1:{port}"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    running = Balancer(process, port, log)
    try:
        yield running
    finally:
        running.stop()
        forget_earlier_runs(local, LEASE, INVENTORY)


class Volume:
    """The webhook's ConfigMap volume: the kubelet's part, done by the test (see the module docstring)."""

    def __init__(self, local: Cluster, path: Path) -> None:
        self.core, self.path = local.core(), path

    def stored(self) -> webhook_inventory.Inventory | None:
        try:
            found = self.core.read_namespaced_config_map(INVENTORY, NAMESPACE)
        except client.ApiException as error:
            assert error.status == 404
            return None
        return webhook_inventory.parse(found.data["inventory.json"])

    def sync(self) -> webhook_inventory.Inventory | None:
        """Project the ConfigMap's key into the file (write then rename, as the kubelet swaps its symlink)."""
        found = self.core.read_namespaced_config_map(INVENTORY, NAMESPACE)
        staging = self.path.with_suffix(".tmp")
        staging.write_text(found.data["inventory.json"])
        staging.replace(self.path)
        return webhook_inventory.parse(found.data["inventory.json"])


@pytest.fixture(scope="module")
def volume(local: Cluster, workdir: Path) -> Volume:
    path = workdir / "inventory" / "inventory.json"
    path.parent.mkdir()
    return Volume(local, path)


@pytest.fixture(scope="module")
def webhook(local: Cluster, workdir: Path, volume: Volume) -> Iterator[GpugateServer]:
    with shipped_webhook(local, workdir, POLICY, name="inventory", inventory=volume.path) as running:
        yield running


@pytest.fixture
def namespace(namespaces: Namespaces) -> str:
    """A ``inv-*`` namespace the policy matches (conftest's ``namespaces`` deletes it)."""
    return namespaces.make("inv")


def offered(document: webhook_inventory.Inventory | None) -> dict[str, int]:
    """Free units of this test's MIG profiles, as a document says."""
    wanted = {f"nvidia.com/mig-{p}" for p in PROFILES}
    return {o.resource.removeprefix("nvidia.com/mig-"): o.free for o in (document.offers if document else ())
            if o.resource in wanted}


def limits(pod: Obj) -> Obj:
    return (pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}


def test_the_balancer_publishes_with_its_rbac_and_the_webhook_right_sizes_by_what_it_published(
        local: Cluster, nodes: Nodes, balancer: Balancer, webhook: GpugateServer, volume: Volume,
        namespace: str) -> None:
    memory = {f"nvidia.com/mig-{p}.memory": str(m) for p, m in zip(PROFILES, (16384, 32768, 65536), strict=True)}
    node = nodes.gpu(gpus=1, product=H200, gpu_memory_mib=143771, mig={p: 1 for p in PROFILES},
                     labels={"nvidia.com/mig.strategy": "mixed", **memory})
    core = local.core()

    def explain() -> str:
        return f"{balancer.tail()}\n{local.logs_tail()}"

    def published_when(predicate: Callable[[dict[str, int]], bool], what: str) -> webhook_inventory.Inventory:
        return wait_until(lambda: (lambda d: d if predicate(offered(d)) else None)(volume.stored()), timeout=60,
                          what=what, explain=explain)

    first = published_when(lambda free: free == {p: 1 for p in PROFILES}, "the first inventory with the new node")
    offers = {o.resource: o for o in first.offers}
    assert (offers["nvidia.com/mig-1g.18gb"].product, offers["nvidia.com/mig-1g.18gb"].memory_mib) == (H200, 16384)
    defaults = [pc.metadata.name for pc in client.SchedulingV1Api(local.api_client()).list_priority_class().items
                if pc.global_default]
    assert first.default_priority_class == (defaults[0] if defaults else None)
    stored = json.loads(core.read_namespaced_config_map(INVENTORY, NAMESPACE, _preload_content=False).data)
    managers = {m["manager"] for m in stored["metadata"].get("managedFields") or []}
    assert managers == {"gpugate-balancer"}, managers

    # Each 10 GB ask gets the smallest slice free now; once the scheduler binds it, the balancer says it
    # is taken, and the next ask moves up a rung.
    for index, profile in enumerate(PROFILES):
        taken = set(PROFILES[:index])
        published_when(lambda free, taken=taken: all(free[p] == (0 if p in taken else 1) for p in PROFILES),
                       f"the inventory to show {sorted(taken) or 'nothing'} taken")
        volume.sync()
        resource = f"nvidia.com/mig-{profile}"
        # The webhook re-reads the file at most once a second: a dry run shows when it has.
        probe = pod_manifest(generate_name="probe-", labels={"gpugate.io/gpu-memory": "10G"})
        wait_until(lambda resource=resource, probe=probe: limits(create_pod(core, namespace, probe, dry_run=True))
                   == {resource: "1"}, timeout=30, what=f"the webhook to give {profile}", explain=explain)
        create_pod(core, namespace, pod_manifest(f"ask-{index}", labels={"gpugate.io/gpu-memory": "10G"}))
        assert limits(read_pod(core, namespace, f"ask-{index}")) == {resource: "1"}
        wait_until(lambda index=index: read_pod(core, namespace, f"ask-{index}")["spec"].get("nodeName") == node,
                   timeout=60, what=f"the scheduler to bind ask-{index}", explain=explain)

    published_when(lambda free: all(free[p] == 0 for p in PROFILES), "the inventory to show every slice taken")
    assert balancer.metric("gpugate_balancer_inventory_writes_total", result="ok") >= 4
    assert balancer.metric("gpugate_balancer_api_errors_total") == 0, explain()
    # The RBAC refusals kubeclient.failure writes ("answered 403 Forbidden"), not a 403 in a timestamp.
    refused = [line for line in balancer.log.read_text(errors="replace").splitlines() if "answered 403" in line]
    assert not refused, refused[:3]
