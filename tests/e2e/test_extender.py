"""The real kube-scheduler calls the balancer's extender, on the real control plane.

The second scheduler runs exactly the KubeSchedulerConfiguration that ``kubectl kustomize
manifests/scheduler`` renders (as tests/e2e/test_placement.py takes it), with two edits a loopback
cluster needs: ``urlPrefix`` points at 127.0.0.1 instead of the balancer's Service (there is no
kube-proxy), and ``tlsConfig.caFile`` at this test's CA instead of the Secret mounted in the pod.
Weight, verb, nodeCacheCapable, httpTimeout and ignorable are the manifest's. The balancer is the
real ``gpugate balance`` command with ``--extender-bind``.

The cluster: a GPU node ``g`` whose cpu and memory are two-thirds taken by a CPU-only pod, an
empty CPU node ``c``, and a third GPU node running 2-GPU jobs (8 cpu each), which the balancer has
listed before it starts, so the pod-shape mix it learns is that of a cluster running GPU jobs. The
test pods are CPU-only pods of the gpugate-binpack profile, limited to ``g`` and ``c``. The
profile's own plugins (NodeResourcesFit MostAllocated) prefer ``g``, the fuller node. The extender
prefers ``c``: a CPU pod on a GPU node takes the cpu the GPU jobs of the mix would need there and
leaves its GPUs stranded (FGD's first lesson). The test asks the extender before it relies on that.

1. With the extender down (its listener not started: no certificate yet, so the scheduler's calls
   are refused), the pod still schedules, by the plugins alone, onto ``g``; the balancer's
   ``gpugate_balancer_extender_serving`` says 0. (``pkg/scheduler/schedule_one.go``,
   ``prioritizeNodes``: "Prioritization errors from extender can be ignored".)
2. Once the certificate is there, the extender serves; the same pod shape now lands on ``c``: the
   extender's score (x weight 25 x 10 = 250 points per level) outweighs the plugins' preference.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from cryptography import x509
from kubernetes import client

from tests.e2e import shipped_scheduler
from tests.e2e.accounts import applied, kubeconfig_as
from tests.e2e.balancer_access import QUICK_CONFIG, answers_ok, scrape
from tests.e2e.shipped_scheduler import BINPACK
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import find, kustomize
from webhook.certs import pki
from webhook.localcluster.cluster import Cluster, Nodes
from webhook.localcluster.processes import free_port, terminate
from webhook.placement.scoring import RECOMMENDED_WEIGHT

ROOT = Path(__file__).resolve().parents[2]
LOCAL_ONLY_REASON = "the extender and the second scheduler run on this machine's 127.0.0.1"
"""Why this module skips against an attached cluster (the ``local`` fixture of conftest.py)."""
POOL = "e2e.gpugate.io/extender-pool"


@dataclass
class Extender:
    """``gpugate balance --extender-bind`` in its own process; its TLS folder starts empty."""

    process: subprocess.Popen[bytes]
    port: int
    health_port: int
    tls: Path
    ca: Path
    bundle: pki.CertBundle
    log: Path

    def metric(self, name: str, **labels: str) -> float:
        return scrape(self.health_port, name, **labels)

    def ready(self) -> bool:
        return answers_ok(self.health_port, "/readyz")

    def install_certificate(self) -> None:
        """What the kubelet does when the optional Secret volume's Secret appears."""
        pki.write_bundle(self.bundle, self.tls)

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        """One call as kube-scheduler makes it (the same path, body and content type, the same CA)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        request = urllib.request.Request(f"https://127.0.0.1:{self.port}/extender/prioritize",
                                         data=json.dumps(args).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=context))
        with opener.open(request, timeout=10) as response:
            return list(json.loads(response.read()))

    def tail(self) -> str:
        return f"--- balancer (exit {self.process.poll()}):\n" + \
            "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


@pytest.fixture(scope="module")
def namespace(local: Cluster) -> Iterator[str]:
    core = local.core()
    name = f"e2e-ext-{os.urandom(3).hex()}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_until(lambda: _has_default_account(local, name), what="the namespace's default ServiceAccount")
    yield name
    core.delete_namespace(name)


def _has_default_account(local: Cluster, namespace: str) -> bool:
    try:
        local.core().read_namespaced_service_account("default", namespace)
    except client.ApiException as error:
        assert error.status == 404
        return False
    return True


@pytest.fixture(scope="module")
def extender(local: Cluster, workdir: Path, namespace: str, pool: Pool) -> Iterator[Extender]:
    tls, scheduler_side = workdir / "balancer-tls", workdir / "scheduler-ca"
    tls.mkdir()
    scheduler_side.mkdir()
    bundle = pki.create_bundle(service="gpugate-balancer", namespace="gpugate-system", now=datetime.now(UTC),
                               days=1, ips=("127.0.0.1",))
    (scheduler_side / "ca.crt").write_bytes(bundle.ca_cert)
    (workdir / "balancer.yaml").write_text(QUICK_CONFIG)
    port, health_port, log = free_port(), free_port(), workdir / "balancer.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "webhook.cli", "balance", "--config", str(workdir / "balancer.yaml"),
             "--no-inventory", "--identity", "e2e-extender", "--lease-name", "e2e-extender",
             "--lease-namespace", namespace, "--health-bind", f"127.0.0.1:{health_port}",
             "--extender-bind", f"127.0.0.1:{port}", "--extender-cert", str(tls / pki.CERT_FILE),
             "--extender-key", str(tls / pki.KEY_FILE)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "KUBECONFIG": str(local.kubeconfig)})
    running = Extender(process, port, health_port, tls, scheduler_side / "ca.crt", bundle, log)
    try:
        yield running
    finally:
        terminate(process, grace=20)


@pytest.fixture(scope="module")
def scheduler(local: Cluster, extender: Extender, namespace: str) -> Iterator[Any]:
    config = shipped_scheduler.configuration()
    [entry] = config["extenders"]
    # The manifest's choices, kept as they are...
    assert (entry["prioritizeVerb"], entry["weight"], entry["nodeCacheCapable"], entry["ignorable"]) == \
        ("prioritize", RECOMMENDED_WEIGHT, True, True)
    # ...and only where it is reached and how it is trusted, switched to this machine.
    entry["urlPrefix"] = f"https://127.0.0.1:{extender.port}{urlsplit(entry['urlPrefix']).path}"
    entry["tlsConfig"] = {**entry["tlsConfig"], "caFile": str(extender.ca)}
    started = local.start_scheduler(config, name=f"{BINPACK}-extender-{namespace}", leader_elect=False)
    try:
        yield started
    finally:
        started.stop()


@dataclass
class Pool:
    gpu: str
    cpu: str
    tag: str


@pytest.fixture(scope="module")
def pool(local: Cluster, namespace: str) -> Iterator[Pool]:
    made = Nodes(local)
    tag = namespace
    gpu = made.gpu(gpus=8, labels={POOL: tag})
    cpu = made.cpu(labels={POOL: tag})
    jobs = made.gpu(gpus=8, labels={POOL: f"{tag}-jobs"})  # never a candidate: the test pods' affinity
    core = local.core()
    for index in range(4):
        core.create_namespaced_pod(namespace, pod(f"job-{index}", f"{tag}-jobs", cpu="8", memory="64Gi", gpus=2,
                                                  node=jobs))
    # Two thirds of g's cpu and memory taken by a CPU-only pod: the plugins' MostAllocated prefers g.
    core.create_namespaced_pod(namespace, pod("filler", tag, cpu="40", memory="320Gi", node=gpu))
    wait_until(lambda: all(p.status.phase == "Running" for p in core.list_namespaced_pod(namespace).items),
               what="the jobs and the filler to run")
    try:
        yield Pool(gpu=gpu, cpu=cpu, tag=tag)
    finally:
        made.remove_all()


def pod(name: str, tag: str, *, cpu: str = "4", memory: str = "16Gi", gpus: int = 0,
        node: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {
        "schedulerName": BINPACK,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": POOL, "operator": "In", "values": [tag]}]}]}}},
        "containers": [{"name": "main", "image": "registry.example/tool:1", "resources": resources}],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def bound_node(local: Cluster, namespace: str, name: str, explain: Any) -> str:
    return wait_until(lambda: local.core().read_namespaced_pod(name, namespace).spec.node_name, timeout=60,
                      what=f"pod {name} to be scheduled", explain=explain)


def test_with_the_extender_down_the_pod_still_schedules_by_the_plugins_and_a_metric_says_so(
        local: Cluster, namespace: str, extender: Extender, scheduler: Any, pool: Pool) -> None:
    def explain() -> str:
        return f"{extender.tail()}\n--- scheduler:\n{scheduler.tail()}"

    wait_until(extender.ready, timeout=60, what="the balancer's caches", explain=explain)
    assert extender.metric("gpugate_balancer_extender_serving") == 0, explain()
    local.core().create_namespaced_pod(namespace, pod("while-down", pool.tag))
    assert bound_node(local, namespace, "while-down", explain) == pool.gpu, "MostAllocated: the fuller node"
    assert extender.metric("gpugate_balancer_extender_requests_total") == 0  # no call got through


def test_the_scheduler_calls_the_extender_and_its_choice_wins_over_the_plugins(
        local: Cluster, namespace: str, extender: Extender, scheduler: Any, pool: Pool) -> None:
    def explain() -> str:
        return f"{extender.tail()}\n--- scheduler:\n{scheduler.tail()}"

    extender.install_certificate()
    wait_until(lambda: extender.metric("gpugate_balancer_extender_serving") == 1, timeout=30,
               what="the extender to start once its certificate is there", explain=explain)

    # What the extender prefers for this pod shape, asked as the scheduler asks (once its cache holds
    # every pod bound so far): the empty CPU node.
    def preference() -> dict[str, int] | None:
        answer = {h["Host"]: h["Score"] for h in extender.prioritize(
            {"Pod": {**pod("probe", pool.tag), "metadata": {"name": "probe", "namespace": namespace}},
             "NodeNames": [pool.gpu, pool.cpu]})}
        return answer if answer[pool.cpu] > answer[pool.gpu] else None

    wait_until(preference, timeout=30, what="the extender to prefer the CPU node", explain=explain)
    calls = extender.metric("gpugate_balancer_extender_requests_total", result="ok")
    local.core().create_namespaced_pod(namespace, pod("with-extender", pool.tag))
    assert bound_node(local, namespace, "with-extender", explain) == pool.cpu, explain()
    assert extender.metric("gpugate_balancer_extender_requests_total", result="ok") > calls, \
        "the scheduler's own prioritize call"
    assert extender.metric("gpugate_balancer_extender_requests_total", result="error") == 0


# --- the extender's certificate, made by manifests/balancer's Job under its own RBAC ------------------

CERTS_KINDS = ("ServiceAccount", "Role", "RoleBinding")
SYSTEM = "gpugate-system"


def test_the_certificate_job_makes_the_extenders_secret_with_only_its_rbac(local: Cluster, workdir: Path) -> None:
    """The Job's own command and args, as its ServiceAccount (a TokenRequest token, nothing else): the
    Secret the balancer mounts and kube-scheduler trusts, for the Service the scheduler calls; a second
    run (every Argo CD sync) keeps it as it is."""
    documents = kustomize(ROOT / "manifests" / "balancer")
    job = find(documents, "Job", "gpugate-balancer-certs")
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    rbac = [d for d in documents if d["kind"] in CERTS_KINDS and d["metadata"]["name"] == account]
    assert {d["kind"] for d in rbac} == set(CERTS_KINDS)
    core = local.core()
    with applied(local, rbac, SYSTEM):
        try:
            [container] = job["spec"]["template"]["spec"]["containers"]
            secret_ref = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--secret="))
            secret_namespace, secret_name = secret_ref.split("/")
            try:
                core.delete_namespaced_secret(secret_name, secret_namespace)
            except client.ApiException as error:
                assert error.status == 404
            kubeconfig = kubeconfig_as(local, account, SYSTEM, workdir / "certs-job.kubeconfig", seconds=600)
            gpugate = Path(sys.executable).with_name("gpugate")
            assert container["command"][0] == "gpugate"

            def run() -> subprocess.CompletedProcess[str]:
                return subprocess.run([str(gpugate), *container["command"][1:], *container["args"]], text=True,
                                      capture_output=True, timeout=120,
                                      env={**os.environ, "KUBECONFIG": str(kubeconfig)})

            first = run()
            assert first.returncode == 0, first.stderr + first.stdout
            stored = core.read_namespaced_secret(secret_name, secret_namespace)
            assert stored.type == "kubernetes.io/tls" and {"ca.crt", "tls.crt", "tls.key"} <= set(stored.data)
            cert = x509.load_pem_x509_certificate(base64.b64decode(stored.data["tls.crt"]))
            dns_names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName)
            config = shipped_scheduler.configuration()
            assert urlsplit(config["extenders"][0]["urlPrefix"]).hostname in dns_names, dns_names
            second = run()
            assert second.returncode == 0, second.stderr + second.stdout
            again = core.read_namespaced_secret(secret_name, secret_namespace)
            assert again.metadata.resource_version == stored.metadata.resource_version, "a valid certificate is kept"
        finally:
            try:
                core.delete_namespaced_secret("gpugate-balancer-tls", SYSTEM)
            except client.ApiException:
                pass
