"""The balancer against the real control plane, as its ServiceAccount with exactly manifests/balancer's RBAC.

What only a real API server can show, end to end:

1. the RBAC of manifests/balancer is enough: each replica runs as the ``gpugate-balancer``
   ServiceAccount with a token from the TokenRequest API and exactly the rendered ServiceAccount,
   (Cluster)Role and (Cluster)RoleBinding, and must end with no API error (a missing verb is a
   403, counted in ``gpugate_balancer_api_errors_total``; the labels would not come either). Both
   list paths are used: paged lists (verb ``list``) in the first test, the streaming list (verb
   ``watch`` with ``sendInitialEvents``) in the others, which the API server must serve (no fallback);
2. nodes get ``gpugate.io/gpu-free`` and ``gpugate.io/gpu-load`` as real pods are bound by the real
   scheduler and finish, written under the field manager ``gpugate-balancer`` (the node's
   managedFields); a CPU node whose NICs advertise ``nvidia.com/*`` SR-IOV functions gets none,
   and the GPUInventory ConfigMap the leader writes for the webhook (created, then read and
   updated by name, as the Role allows) offers the GPU node's GPUs and nothing of the NICs;
3. two replicas share the real Lease and only its holder patches nodes (each replica's own count
   of patches in /metrics); SIGKILL of the holder hands over one lease duration after its last
   renewal: never earlier (the Lease's own acquireTime against the old holder's renewTime), and
   not much later (within two retry periods plus slack for a busy machine);
4. fencing: while another identity holds the Lease, neither replica writes,
   although both see a pod bind and want a node relabelled (``gpugate_balancer_pending_writes``):
   the node's labels, as the API server stores them, do not move until the Lease is free again;
5. readiness: a replica whose pod list the API server refuses (403: its own
   ServiceAccount, bound to the manifests' ClusterRole without the pods rule) is alive, holds the
   Lease, but is not ready and writes nothing from its half view; bound to the manifests' ClusterRole,
   it lists the pods, turns ready and labels the node.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch

from tests.e2e.balancer_access import NAMESPACE, kubectl_stdout, rbac_applied, scrape
from tests.e2e.placement_env import expected_marks
from tests.e2e.waiting import wait_until
from webhook.kube import inventory
from webhook.localcluster.cluster import Cluster, Nodes
from webhook.localcluster.fakekubelet import COMPLETE_AFTER
from webhook.localcluster.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "gpugate-balancer"
LEASE = "gpugate-balancer"  # the Deployment's --lease-name: the only Lease the Role lets it read and renew
INVENTORY = "gpugate-inventory"  # the only ConfigMap the Role lets it read and update
LEASE_SECONDS = 4
FREE, LOAD = "gpugate.io/gpu-free", "gpugate.io/gpu-load"
RETRY_SECONDS = 0.5
HANDOVER_SLACK = 4.0
"""Seconds a busy two-core machine may add to a handover (process scheduling, API latency)."""
FENCE_WATCH_SECONDS = 4.0
"""How long a node must keep its labels while no replica holds the Lease (four passes of the loop)."""
# Lease timing scaled down from 15/10/2 s so a handover fits in a test; the ratios are the defaults'.
CONFIG = f"""\
lease: {{duration: {LEASE_SECONDS}, renew_deadline: 3, retry_period: {RETRY_SECONDS}}}
backoff_initial: 0.2
backoff_max: 2
watch_timeout: 30
write_interval: 1
"""


@pytest.fixture(scope="module")
def balancer_rbac(cluster: Cluster) -> Iterator[str]:
    """The ServiceAccount and RBAC rendered from manifests/balancer, applied as they are; yields their YAML."""
    with rbac_applied(cluster) as text:
        yield text


class Replica:
    """``gpugate balance`` as a process with the ServiceAccount's token; stopped by its PID."""

    def __init__(self, identity: str, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.identity = identity
        self.process = process
        self.port = port
        self.log = log

    def metric(self, name: str, **labels: str) -> float:
        return scrape(self.port, name, **labels)

    def writes(self) -> float:
        return self.metric("gpugate_balancer_label_writes_total", result="ok")

    def api_errors(self) -> float:
        return self.metric("gpugate_balancer_api_errors_total")

    def healthy(self) -> bool:
        return self._answers_200("/healthz")

    def ready(self) -> bool:
        return self._answers_200("/readyz")

    def _answers_200(self, path: str) -> bool:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            return bool(opener.open(f"http://127.0.0.1:{self.port}{path}", timeout=2).status == 200)
        except OSError:
            return False

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": line})
        return out

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


@pytest.fixture
def replicas(cluster: Cluster, balancer_rbac: str, tmp_path: Path) -> Iterator[Any]:
    """Start balancer replicas as the balancer's ServiceAccount; every one is stopped afterwards."""
    core = cluster.core()
    coordination = client.CoordinationV1Api(cluster.api_client())
    try:
        coordination.delete_namespaced_lease(LEASE, NAMESPACE)  # a clean start: no holder left by an earlier run
    except client.ApiException as error:
        assert error.status == 404
    try:
        core.delete_namespaced_config_map(INVENTORY, NAMESPACE)  # ...and no inventory written before
    except client.ApiException as error:
        assert error.status == 404
    kubeconfig = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server_entry = kubeconfig["clusters"][0]["cluster"]
    ca_file = tmp_path / "ca.crt"
    if "certificate-authority-data" in server_entry:
        ca_file.write_bytes(base64.b64decode(server_entry["certificate-authority-data"]))
    else:
        ca_file.write_bytes(Path(server_entry["certificate-authority"]).read_bytes())
    started: list[Replica] = []

    def start(identity: str, *, stream_lists: bool = True, account: str = ACCOUNT, config_extra: str = "") -> Replica:
        token = core.create_namespaced_service_account_token(account, NAMESPACE, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
        token_file = tmp_path / f"{identity}.token"
        token_file.write_text(token)
        port = free_port()
        log = tmp_path / f"{identity}.log"
        config = tmp_path / f"{identity}.yaml"
        config.write_text(CONFIG + f"stream_lists: {'true' if stream_lists else 'false'}\n" + config_extra)
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "webhook.cli", "balance", "--server", server_entry["server"],
                 "--token-file", str(token_file), "--certificate-authority", str(ca_file), "--config", str(config),
                 "--identity", identity, "--lease-name", LEASE, "--lease-namespace", NAMESPACE,
                 "--health-bind", f"127.0.0.1:{port}"],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        replica = Replica(identity, process, port, log)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.stop()
    try:
        core.delete_namespaced_config_map(INVENTORY, NAMESPACE)
    except client.ApiException as error:
        assert error.status == 404, error


def node_labels(cluster: Cluster, name: str) -> dict[str, str]:
    return cluster.core().read_node(name).metadata.labels or {}


def marks(cluster: Cluster, name: str) -> tuple[str | None, str | None]:
    labels = node_labels(cluster, name)
    return labels.get(FREE), labels.get(LOAD)


def holder(cluster: Cluster) -> str | None:
    try:
        lease = client.CoordinationV1Api(cluster.api_client()).read_namespaced_lease(LEASE, NAMESPACE)
    except client.ApiException:
        return None
    return lease.spec.holder_identity


def lease_spec(cluster: Cluster) -> dict[str, Any] | None:
    """The Lease's spec as the API server stores it (raw JSON), None while there is none."""
    try:
        response = client.CoordinationV1Api(cluster.api_client()).read_namespaced_lease(
            LEASE, NAMESPACE, _preload_content=False)
    except client.ApiException as error:
        assert error.status == 404, error
        return None
    return dict(json.loads(response.data).get("spec") or {})


def inventory_of(cluster: Cluster) -> inventory.Inventory | None:
    """The GPUInventory in the ConfigMap the balancer's leader writes (None while there is none)."""
    try:
        config_map = cluster.core().read_namespaced_config_map(INVENTORY, NAMESPACE)
    except client.ApiException as error:
        assert error.status == 404, error
        return None
    return inventory.parse((config_map.data or {})["inventory.json"])


def micro(value: str) -> datetime:
    """A Lease MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


def gpu_pod(name: str, node: str, gpus: int, *, complete_after: float | None = None) -> dict[str, Any]:
    labels = {COMPLETE_AFTER: str(complete_after)} if complete_after is not None else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "main", "image": "registry.example/cuda:12",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def explain(cluster: Cluster, *replicas: Replica) -> Any:
    def text() -> str:
        tails = "\n".join(f"--- {r.identity} (exit {r.process.poll()}):\n" +
                          "\n".join(r.log.read_text(errors="replace").splitlines()[-15:]) for r in replicas)
        return f"{tails}\n{cluster.logs_tail()}"
    return text


def test_labels_follow_pods_as_they_bind_and_finish_with_only_the_manifests_rbac(
        cluster: Cluster, nodes: Nodes, namespace: str, replicas: Any) -> None:
    gpu = nodes.gpu(gpus=8)
    cpu = nodes.cpu(extra_resources={"nvidia.com/cx7_sriov_rdma": "16"})  # NICs are no GPUs
    a = replicas("e2e-a", stream_lists=False)  # paged lists: the "list" verb is used too (the other test streams)
    why = explain(cluster, a)
    wait_until(lambda: marks(cluster, gpu) == ("8", "idle"), timeout=60, what="first labels", explain=why)
    wait_until(a.ready, timeout=10, what="/readyz once the caches synced", explain=why)
    core = cluster.core()
    core.create_namespaced_pod(namespace, gpu_pod("train", gpu, 6, complete_after=4))
    wait_until(lambda: marks(cluster, gpu) == ("2", "busy"), timeout=30, what="labels once the pod is bound",
               explain=why)
    wait_until(lambda: marks(cluster, gpu) == ("8", "idle"), timeout=30, what="labels once the pod Succeeded",
               explain=why)
    assert FREE not in node_labels(cluster, cpu) and LOAD not in node_labels(cluster, cpu)
    node = json.loads(core.read_node(gpu, _preload_content=False).data)
    managers = {(m["manager"], m["operation"]) for m in node["metadata"].get("managedFields") or []}
    assert ("gpugate-balancer", "Update") in managers, managers
    found = wait_until(lambda: inventory_of(cluster), timeout=60, what="the leader's GPUInventory ConfigMap",
                       explain=why)
    resources = {offer.resource for offer in found.offers}
    assert ("nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3") in {(o.resource, o.product) for o in found.offers}, found
    assert "nvidia.com/cx7_sriov_rdma" not in resources, found
    assert a.api_errors() == 0, why()  # a verb short in the manifests' RBAC is a 403 here
    assert a.metric("gpugate_balancer_relists_total") == 0


COALESCE_SECONDS = 3.0


def test_gpu_free_changes_are_coalesced_to_one_node_write_per_interval(
        cluster: Cluster, nodes: Nodes, namespace: str, replicas: Any) -> None:
    """Each GPU pod bind changes gpugate.io/gpu-free, and each Node write fans out to
    every Node watcher (kube-scheduler requeues its unschedulable pods on it). A watcher of the
    real API server sees the balancer's label changes: at most one per ``write_interval``, a change
    of tier (gpu-load, idle to busy at the fourth bind) no sooner than one of gpu-free alone, fewer
    changes than binds, and the last labels are the true ones."""
    gpu = nodes.gpu(gpus=8)
    a = replicas("e2e-coalesce", config_extra=f"write_interval: {COALESCE_SECONDS}\n")
    why = explain(cluster, a)
    wait_until(lambda: marks(cluster, gpu) == ("8", "idle"), timeout=60, what="first labels", explain=why)
    core = cluster.core()
    seen: list[tuple[float, str | None, str | None]] = []
    stop = threading.Event()
    start_version = core.read_node(gpu).metadata.resource_version

    def watch_node() -> None:
        stream = watch.Watch()
        last = ("8", "idle")
        for event in stream.stream(core.list_node, field_selector=f"metadata.name={gpu}",
                                   resource_version=start_version, timeout_seconds=60):
            labels = event["object"].metadata.labels or {}
            now = (labels.get(FREE), labels.get(LOAD))
            if now != last:
                seen.append((time.monotonic(), *now))
                last = now
            if stop.is_set():
                stream.stop()

    watcher = threading.Thread(target=watch_node, daemon=True)
    watcher.start()
    time.sleep(0.5)
    binds = 6
    for i in range(binds):  # one GPU each, a bind every 0.3 s: six gpu-free values in under 2 s
        core.create_namespaced_pod(namespace, gpu_pod(f"one-{i}", gpu, 1))
        time.sleep(0.3)
    wait_until(lambda: marks(cluster, gpu) == expected_marks(8, binds), timeout=60,
               what=f"labels {expected_marks(8, binds)} once all {binds} pods are bound", explain=why)
    time.sleep(COALESCE_SECONDS + 1)  # a late write would show up here
    stop.set()
    core.patch_node(gpu, {"metadata": {"annotations": {"e2e.gpugate.io/poke": str(time.time())}}})  # ends the watch
    watcher.join(timeout=30)
    assert seen and seen[-1][1:] == expected_marks(8, binds), seen
    assert len(seen) < binds, f"a Node write per bind, nothing coalesced: {seen}"
    assert any(load == "busy" for _, _, load in seen), seen  # the tier changed within the binds
    for (before, *_), (after, *_) in zip(seen, seen[1:], strict=False):
        assert after - before >= COALESCE_SECONDS * 0.9, f"two Node writes within the interval: {seen}"
    assert a.api_errors() == 0, why()


def test_two_replicas_share_the_lease_only_the_holder_writes_and_sigkill_hands_over(
        cluster: Cluster, nodes: Nodes, namespace: str, replicas: Any) -> None:
    gpus = [nodes.gpu(gpus=8) for _ in range(3)]
    a, b = replicas("e2e-a"), replicas("e2e-b")
    why = explain(cluster, a, b)
    wait_until(lambda: holder(cluster) in ("e2e-a", "e2e-b"), timeout=60, what="a replica holding the Lease",
               explain=why)
    wait_until(lambda: all(marks(cluster, g) == ("8", "idle") for g in gpus), timeout=60, what="first labels",
               explain=why)
    wait_until(lambda: a.ready() and b.ready(), timeout=30, what="both replicas synced", explain=why)
    leader, standby = (a, b) if holder(cluster) == "e2e-a" else (b, a)
    core = cluster.core()
    for i, g in enumerate(gpus):
        core.create_namespaced_pod(namespace, gpu_pod(f"job-{i}", g, 2 + 2 * i))
    wait_until(lambda: [marks(cluster, g) for g in gpus] == [("6", "idle"), ("4", "busy"), ("2", "busy")],
               timeout=30, what="labels from the holder", explain=why)
    assert holder(cluster) == leader.identity, "the lease moved without a reason"
    assert leader.writes() >= 3 and standby.writes() == 0, (leader.writes(), standby.writes())
    assert leader.metric("gpugate_balancer_leader") == 1 and standby.metric("gpugate_balancer_leader") == 0

    before = lease_spec(cluster)
    assert before is not None and before["holderIdentity"] == leader.identity, before
    leader.stop(signal.SIGKILL)  # no release: the standby must wait for the lease to expire
    last_renewal: dict[str, Any] = before

    def taken_over() -> dict[str, Any] | None:
        nonlocal last_renewal
        spec = lease_spec(cluster) or {}
        if spec.get("holderIdentity") == leader.identity:
            last_renewal = spec  # the dead holder's last renewal (one may have been in flight)
            return None
        return spec if spec.get("holderIdentity") == standby.identity else None

    taken = wait_until(taken_over, timeout=LEASE_SECONDS + 30, what="the standby taking the lease", explain=why)
    gap = (micro(taken["acquireTime"]) - micro(last_renewal["renewTime"])).total_seconds()
    assert taken["leaseTransitions"] == before["leaseTransitions"] + 1, (before, taken)
    assert gap >= LEASE_SECONDS, f"the standby took a lease renewed {gap:.2f} s before: not yet expired"
    assert gap <= LEASE_SECONDS + 2 * RETRY_SECONDS + HANDOVER_SLACK, f"handover {gap:.1f} s after the last renewal"
    core.create_namespaced_pod(namespace, gpu_pod("after", gpus[0], 2))
    wait_until(lambda: marks(cluster, gpus[0]) == ("4", "busy"), timeout=30, what="the new holder writing",
               explain=why)
    assert standby.writes() >= 1
    assert standby.api_errors() == 0, why()
    # The API server streamed the lists (Kubernetes' WatchList): no replica had to fall back to pages.
    assert not [line for line in standby.lines() if line.get("event") == "no streaming list here, listing in pages"]


def take_lease(cluster: Cluster, identity: str) -> None:
    """Write the Lease as another replica that just acquired it would (admin credentials), for an hour."""
    api = client.CoordinationV1Api(cluster.api_client())
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def attempt() -> bool:
        lease = json.loads(api.read_namespaced_lease(LEASE, NAMESPACE, _preload_content=False).data)
        spec = lease["spec"]
        lease["spec"] = {**spec, "holderIdentity": identity, "leaseDurationSeconds": 3600, "acquireTime": now,
                         "renewTime": now, "leaseTransitions": int(spec.get("leaseTransitions") or 0) + 1}
        try:
            api.replace_namespaced_lease(LEASE, NAMESPACE, lease)
        except client.ApiException as error:
            if error.status == 409:  # the holder renewed in between: read again
                return False
            raise
        return True

    wait_until(attempt, timeout=30, what=f"{identity} writing the Lease")


def test_a_replica_without_the_lease_writes_nothing_even_when_labels_are_due(
        cluster: Cluster, nodes: Nodes, namespace: str, replicas: Any) -> None:
    gpu = nodes.gpu(gpus=8)
    a, b = replicas("e2e-a"), replicas("e2e-b")
    why = explain(cluster, a, b)
    wait_until(lambda: holder(cluster) in ("e2e-a", "e2e-b"), timeout=60, what="a replica holding the Lease",
               explain=why)
    wait_until(lambda: marks(cluster, gpu) == ("8", "idle"), timeout=60, what="first labels", explain=why)
    wait_until(lambda: a.ready() and b.ready(), timeout=30, what="both replicas synced", explain=why)

    take_lease(cluster, "e2e-intruder")  # a third replica (or a split brain) holds it now
    wait_until(lambda: a.metric("gpugate_balancer_leader") == 0 and b.metric("gpugate_balancer_leader") == 0,
               timeout=30, what="both replicas seeing they do not lead", explain=why)
    written = a.writes() + b.writes()
    cluster.core().create_namespaced_pod(namespace, gpu_pod("train", gpu, 6))
    # Both see the bound pod and want the node relabelled (2 free, busy): a write is due in each.
    wait_until(lambda: a.metric("gpugate_balancer_pending_writes") >= 1
               and b.metric("gpugate_balancer_pending_writes") >= 1,
               timeout=30, what="both replicas wanting to relabel the node", explain=why)
    # Their loops pass at least once a second (and at once on an event): give them several passes.
    watched_until = time.monotonic() + FENCE_WATCH_SECONDS
    while time.monotonic() < watched_until:
        assert marks(cluster, gpu) == ("8", "idle"), f"a replica without the Lease wrote\n{why()}"
        time.sleep(0.2)
    assert a.writes() + b.writes() == written
    assert holder(cluster) == "e2e-intruder"

    client.CoordinationV1Api(cluster.api_client()).delete_namespaced_lease(LEASE, NAMESPACE)  # the intruder leaves
    wait_until(lambda: holder(cluster) in ("e2e-a", "e2e-b"), timeout=30, what="a replica taking the free Lease",
               explain=why)
    wait_until(lambda: marks(cluster, gpu) == ("2", "busy"), timeout=30, what="the new holder's labels",
               explain=why)
    assert a.api_errors() == 0 and b.api_errors() == 0, why()


def test_not_ready_and_silent_until_the_first_full_list_of_pods(
        cluster: Cluster, nodes: Nodes, balancer_rbac: str, replicas: Any) -> None:
    """Readiness: a replica whose pod list the API server refuses is alive but not
    ready, and writes nothing from its half view; once the manifests' ClusterRole is bound to it,
    the list succeeds, it turns ready and labels the node."""
    gpu = nodes.gpu(gpus=8)
    documents = list(yaml.safe_load_all(balancer_rbac))
    cluster_role = next(d for d in documents if d["kind"] == "ClusterRole")
    role = next(d for d in documents if d["kind"] == "Role" and d["metadata"]["name"] == LEASE)
    account = "e2e-balancer-no-pods"
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    no_pods = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": account},
               "rules": [rule for rule in cluster_role["rules"] if "pods" not in rule["resources"]]}
    assert len(no_pods["rules"]) == len(cluster_role["rules"]) - 1
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": NAMESPACE}},
        no_pods,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": account},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": account},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": account, "namespace": NAMESPACE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]},
         "subjects": subject},
    ]
    granted = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": f"{account}-granted"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": cluster_role["metadata"]["name"]},
               "subjects": subject}
    kubectl_stdout(cluster, "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    try:
        r = replicas("e2e-no-pods", account=account)
        why = explain(cluster, r)
        wait_until(lambda: holder(cluster) == r.identity, timeout=60, what="the replica holding the Lease",
                   explain=why)
        wait_until(lambda: r.api_errors() >= 2, timeout=60, what="its pod list refused twice", explain=why)
        assert r.healthy(), why()
        assert not r.ready(), "ready although it never listed a pod"
        assert marks(cluster, gpu) == (None, None), "labels written from a view without pods"
        assert r.writes() == 0

        kubectl_stdout(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(granted))
        wait_until(r.ready, timeout=60, what="ready once it may list pods", explain=why)
        wait_until(lambda: marks(cluster, gpu) == ("8", "idle"), timeout=60, what="its first labels", explain=why)
    finally:
        kubectl_stdout(cluster, "delete", "--ignore-not-found", "-f", "-",
                       stdin=yaml.safe_dump_all([*objects, granted]))
