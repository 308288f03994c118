"""What test_placement.py, test_replay_fidelity.py and benchmarks/replay_vs_scheduler.py share:
the real ``gpugate serve`` registered with the API server, the real ``gpugate balance``, and
watches that say at once when a pod was decided or a node relabelled.

Why a module of its own: both test modules judge where the real kube-scheduler puts pods the
webhook shaped, so both need the same webhook (started and registered with
:mod:`tests.e2e.webhook_fixture`, not a second copy of it) and the same way to wait for the
scheduler's decision without sleeping. Every process started here is stopped by its PID, also
when the test fails (context managers).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.waiting import stop_stream
from tests.e2e.webhook_fixture import (
    GPUGATE,
    ROOT,
    GpugateServer,
    Namespaces,
    Obj,
    Registration,
    RenderedWebhooks,
    ServingCerts,
    create_pod,
    kustomize,
    policy_of,
)
from webhook.localcluster import processes
from webhook.localcluster.cluster import Cluster
from webhook.placement import tiers

WEBHOOK_BASE = ROOT / "manifests" / "webhook"
STARTER_POLICIES = ROOT / "policies"
POOL_LABEL = "e2e.gpugate.io/pool"
"""Node label naming the nodes of one test; its pods select it with ``nodeSelector``, so nodes other
tests of the session left behind are filtered out. Scoring-neutral: kube-scheduler normalizes
every score over the feasible nodes only (framework/plugins/helper/normalize_score.go), and a
nodeSelector is a filter (framework/plugins/nodeaffinity/node_affinity.go, Filter)."""
SKIP_LABEL = "gpugate.io/skip"
FREE, LOAD = "gpugate.io/gpu-free", "gpugate.io/gpu-load"


# --- policies and the webhook ------------------------------------------------------------------

def policy_folder(destination: Path, extra: Mapping[str, str] | None = None) -> Path:
    """The starter policies as the Deployment mounts them (the files policies/kustomization.yaml
    puts in the ConfigMap), plus ``extra`` test policies (file name -> YAML)."""
    destination.mkdir(parents=True, exist_ok=True)
    generator = yaml.safe_load((STARTER_POLICIES / "kustomization.yaml").read_text())["configMapGenerator"][0]
    for name in generator["files"]:
        shutil.copy(STARTER_POLICIES / name, destination / name)
    for name, text in (extra or {}).items():
        (destination / name).write_text(text)
    return destination


def _shaped_probe(cluster: Cluster, namespace: str) -> bool:
    """A server-side dry-run create of a training pod: True once the API server calls the webhook."""
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "probe", "labels": {"gpugate.io/profile": "training", "gpugate.io/gpus": "1"}},
             "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12"}]}}
    try:
        return policy_of(create_pod(cluster.core(), namespace, probe, dry_run=True)) is not None
    except ApiException:
        return False


@contextmanager
def webhook(cluster: Cluster, workdir: Path, policies: Path, *, workers: int = 1) -> Iterator[GpugateServer]:
    """``gpugate serve`` on 127.0.0.1 with ``policies``, registered as manifests/webhook renders it.

    Only ``clientConfig`` is switched to url + caBundle (no kube-proxy here), exactly as
    test_webhook.py does; both configurations are removed and the server stopped on the way out.
    """
    if cluster.plane is None:
        raise RuntimeError("the webhook runs on this machine's 127.0.0.1; an attached cluster cannot call it")
    certs = ServingCerts(workdir / "certs")
    server = GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca, policies=policies, workers=workers,
                           log=cluster.plane.logs / f"gpugate-serve-{workdir.name}.log")
    registration = Registration(cluster)
    namespaces = Namespaces(cluster)
    server.start()
    try:
        registration.apply(RenderedWebhooks.of(kustomize(WEBHOOK_BASE)).pointed_at(server.base_url,
                                                                                    certs.bundle.ca_cert))
        probe = namespaces.make("ml-probe")
        deadline = time.monotonic() + 30
        while not _shaped_probe(cluster, probe):  # the API server's webhook informer lags a little
            if time.monotonic() > deadline:
                raise AssertionError(f"the API server never called the webhook:\n{processes.tail(server.log)}")
            time.sleep(0.1)
        yield server
    finally:
        try:
            registration.remove()
            namespaces.delete_all()
        finally:
            if server.running():
                server.stop()


# --- the balancer ------------------------------------------------------------------------------

BALANCER_CONFIG = """\
# One writer without a Lease (test_balancer.py owns the Lease tests); every change written at
# once (write_interval 0), so a label follows a binding within milliseconds, as the replay's
# --label-lag 1 assumes.
lease: {enabled: false}
# No GPUInventory: this balancer only keeps labels (right-sizing has tests of its own), and a
# namespace another module deleted must not stop it (a missing one is now a clear exit).
inventory: {enabled: false}
write_interval: 0
resync_interval: 5
backoff_initial: 0.2
backoff_max: 2
watch_timeout: 60
"""


class Balancer:
    """``gpugate balance`` as a subprocess with the admin kubeconfig; stopped by its PID.

    The balancer's own writing (RBAC, Lease, tiers) is tested in tests/e2e/test_balancer.py; here it
    only has to keep the labels following the pods, as it would in a cluster.
    """

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.log = workdir / "balancer.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Balancer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "balancer.yaml"
        config.write_text(BALANCER_CONFIG)
        port = processes.free_port()
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(GPUGATE), "balance", "--config", str(config), "--health-bind", f"127.0.0.1:{port}",
                 "--identity", "e2e-placement"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; by PID."""
        if self.process is not None:
            processes.terminate(self.process, grace=15)

    def tail(self, lines: int = 20) -> str:
        return processes.tail(self.log, lines)


@contextmanager
def balancer(cluster: Cluster, workdir: Path) -> Iterator[Balancer]:
    running = Balancer(cluster, workdir).start()
    try:
        yield running
    finally:
        running.stop()


# --- watches ---------------------------------------------------------------------------------------

class Watch:
    """The latest version of every object a list+watch returns, and a way to wait for a condition.

    Why not polling GETs: the machine has two shared cores; one watch stream per kind costs the
    API server almost nothing and reports a binding or a label within milliseconds.
    """

    def __init__(self, lister: Callable[..., Any], *, what: str, **selector: Any) -> None:
        self.lister = lister
        self.what = what
        self.selector = selector
        self.objects: dict[str, Obj] = {}
        self.error: str | None = None
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{what}", daemon=True)

    def __enter__(self) -> Watch:
        self._sync()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        stop_stream(self._stop, self._response, self._thread)

    def _sync(self) -> str:
        response = self.lister(_preload_content=False, **self.selector)
        listing = json.loads(response.data)
        with self._changed:
            self.objects = {item["metadata"]["name"]: item for item in listing["items"]}
            self._changed.notify_all()
        return str(listing["metadata"]["resourceVersion"])

    def _run(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._sync()
                version = self._follow(version)
            except Exception as error:  # a broken stream: list again
                if self._stop.is_set():
                    return
                self.error = repr(error)
                version = None
                self._stop.wait(0.2)

    def _follow(self, version: str) -> str | None:
        response = self.lister(watch=True, resource_version=version, allow_watch_bookmarks=True,
                               timeout_seconds=60, _preload_content=False, **self.selector)
        self._response = response
        try:
            buffer = b""
            for chunk in response.stream(amt=None, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        return None  # 410 Gone or worse: list again
                    version = obj["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    with self._changed:
                        if kind == "DELETED":
                            self.objects.pop(obj["metadata"]["name"], None)
                        else:
                            self.objects[obj["metadata"]["name"]] = obj
                        self._changed.notify_all()
        finally:
            self._response = None
            response.release_conn()
        return version

    def wait(self, probe: Callable[[dict[str, Obj]], Any], *, timeout: float = 30.0, what: str = "",
             explain: Callable[[], str] | None = None) -> Any:
        """Return ``probe(objects)`` as soon as it is truthy; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                value = probe(self.objects)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    detail = f"\n{explain()}" if explain else ""
                    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or self.what} "
                                         f"(watch error: {self.error}){detail}")
                self._changed.wait(min(left, 1.0))


def pod_watch(cluster: Cluster, namespace: str) -> Watch:
    core = cluster.core()
    return Watch(lambda **kw: core.list_namespaced_pod(namespace, **kw), what=f"pods in {namespace}")


def node_watch(cluster: Cluster, pool: str) -> Watch:
    core = cluster.core()
    return Watch(core.list_node, what=f"nodes of pool {pool}", label_selector=f"{POOL_LABEL}={pool}")


def decision(pod: Obj | None) -> str | None:
    """``node:<name>`` once bound, ``unschedulable:<message>`` once the scheduler gave up, else None.

    The scheduler writes PodScheduled=False (reason Unschedulable) after a failed cycle
    (pkg/scheduler/schedule_one.go, handleSchedulingFailure -> updatePod).
    """
    if pod is None:
        return None
    node = pod["spec"].get("nodeName")
    if node:
        return f"node:{node}"
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"unschedulable:{condition.get('message', '')}"
    return None


def delete_now(core: client.CoreV1Api, namespace: str, name: str) -> None:
    """Delete a pod with grace 0 (what the fake kubelet would do for a bound one anyway)."""
    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as error:
        if error.status != 404:
            raise


def expected_marks(capacity: int, used: int) -> tuple[str, str]:
    """What the balancer writes for a plain GPU node with ``used`` of ``capacity`` GPUs requested
    (webhook/placement/marks.py whole_free_gpus, tiers.allocation_tier without utilization)."""
    tier = tiers.allocation_tier(min(used / capacity, 1.0), tiers.TierThresholds())
    return str(max(capacity - used, 0)), tier


def label_nodes(core: client.CoreV1Api, labels: Mapping[str, Mapping[str, str | None]]) -> None:
    """Write node labels by hand, as the balancer would (a merge patch per node)."""
    for node, values in labels.items():
        core.patch_node(node, {"metadata": {"labels": dict(values)}})
