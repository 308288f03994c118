"""gpugate's own chart on the e2e control plane with the built helm: `helm install`, the webhook
serving through the configurations the chart made, `helm test` passing (its pod run on this machine
with its own ServiceAccount: tests/e2e/hostpod.py), `helm upgrade` with a changed policy rolling the
webhook, and `helm uninstall` leaving no webhook configuration behind.

The webhook runs on this machine (the control plane has no kubelet that runs containers), so the
release sets ``webhook.url`` to it and ``webhook.caBundle`` to its CA (``tls.mode: external``); the
Deployment, balancer and the rest are installed as in a cluster and their pods run as fake pods.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import helmtool
from tests.e2e import hostpod
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import (
    GPUGATE,
    GpugateServer,
    ServingCerts,
    create_pod,
    pod_manifest,
    policy_of,
    serving,
)
from webhook.localcluster.cluster import Cluster, Nodes

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "chart" / "gpugate"
RELEASE = "gpugate"
NAMESPACE = "gpugate-chart"
WEBHOOK_NAME = "gpugate-webhook"
EXTRA_POLICY = """\
apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {name: chart-e2e}
spec:
  priority: 0
  match: {namespaces: ["*"]}
  gpu: {resource: nvidia.com/gpu, default: 1, max: 2}
"""


@pytest.fixture(scope="module")
def server(local: Cluster, workdir: Path) -> Iterator[GpugateServer]:
    """`gpugate serve` with the starter policies, on 127.0.0.1."""
    assert local.plane is not None
    certs = ServingCerts(workdir / "certs")
    started = GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca, policies=ROOT / "policies",
                            log=local.plane.logs / "gpugate-chart-serve.log")
    with serving(started):
        yield started


@pytest.fixture(scope="module")
def module_nodes(local: Cluster) -> Iterator[Nodes]:
    """Two nodes: the webhook's two replicas spread one per node (DoNotSchedule)."""
    made = Nodes(local)
    made.cpu()
    made.cpu()
    made.gpu(gpus=8)
    yield made
    made.remove_all()


def helm(local: Cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helmtool.helm_binary()), "--kubeconfig", str(local.kubeconfig), *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def release_values(server: GpugateServer, workdir: Path, **extra: object) -> Path:
    values = {"tls": {"mode": "external"},
              "webhook": {"url": server.base_url, "caBundle": base64.b64encode(server.ca.read_bytes()).decode()},
              **extra}
    path = workdir / f"values-{len(list(workdir.glob('values-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _forget_unowned_cluster_objects(cluster: Cluster) -> None:
    """Earlier modules on this worker's control plane apply the kustomize bases, whose cluster-wide
    objects (PriorityClasses, ClusterRoles and their bindings) carry the chart's names; helm
    refuses to adopt objects it does not own, so those leftovers go first."""
    api = cluster.api_client()
    scheduling, rbac = client.SchedulingV1Api(api), client.RbacAuthorizationV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    kinds = ((scheduling.list_priority_class, scheduling.delete_priority_class),
             (rbac.list_cluster_role, rbac.delete_cluster_role),
             (rbac.list_cluster_role_binding, rbac.delete_cluster_role_binding),
             (admission.list_mutating_webhook_configuration, admission.delete_mutating_webhook_configuration),
             (admission.list_validating_webhook_configuration, admission.delete_validating_webhook_configuration))
    for list_them, delete in kinds:
        for obj in list_them().items:
            owner = (obj.metadata.annotations or {}).get("meta.helm.sh/release-name")
            if obj.metadata.name.startswith("gpugate-") and owner != RELEASE:
                delete(obj.metadata.name)


@pytest.fixture(scope="module")
def installed(local: Cluster, server: GpugateServer, module_nodes: Nodes, workdir: Path) -> Iterator[Path]:
    values = release_values(server, workdir)
    _forget_unowned_cluster_objects(local)
    result = helm(local, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                  "--values", str(values), "--wait", "--timeout", "180s")
    assert result.returncode == 0, result.stdout + result.stderr + local.logs_tail()
    try:
        yield values
    finally:
        helm(local, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "120s")


def _stored(local: Cluster) -> tuple[dict, dict]:
    api = client.AdmissionregistrationV1Api(local.api_client())
    return (json.loads(api.read_mutating_webhook_configuration(WEBHOOK_NAME, _preload_content=False).data),
            json.loads(api.read_validating_webhook_configuration(WEBHOOK_NAME, _preload_content=False).data))


def test_install_registers_both_webhooks_at_the_url_and_the_webhook_shapes_pods(
        local: Cluster, server: GpugateServer, installed: Path, namespace: str) -> None:
    for stored, path in zip(_stored(local), ("/mutate", "/validate"), strict=True):
        [hook] = stored["webhooks"]
        assert hook["clientConfig"]["url"] == server.base_url + path
        excluded = next(e["values"] for e in hook["namespaceSelector"]["matchExpressions"]
                        if e["key"] == "kubernetes.io/metadata.name")
        assert {NAMESPACE, "kube-system", "gpu-operator"} <= set(excluded)
    def shaped() -> dict | None:
        pod = create_pod(local.core(), namespace, pod_manifest(generate_name="chart-", gpus=1), dry_run=True)
        return pod if policy_of(pod) else None

    pod = wait_until(shaped, what="the API server to call the chart's webhook")
    assert policy_of(pod).startswith("default-gpu@")
    apps = client.AppsV1Api(local.api_client())
    for name in ("gpugate-webhook", "gpugate-balancer"):
        deployment = apps.read_namespaced_deployment(name, NAMESPACE)
        assert deployment.status.ready_replicas == 2, name


def _helm_test(local: Cluster, workdir: Path) -> tuple[subprocess.CompletedProcess[str], hostpod.HostRun]:
    """`helm test`, with its smoke pod run on this machine once the fake kubelet started it."""
    outcome: dict[str, subprocess.CompletedProcess[str]] = {}
    thread = threading.Thread(target=lambda: outcome.update(
        result=helm(local, "test", RELEASE, "--namespace", NAMESPACE, "--timeout", "120s")))
    thread.start()
    try:
        pod = hostpod.wait_running(local, NAMESPACE, "gpugate-smoke")
        ran = hostpod.run(local, pod, workdir)
    finally:
        thread.join(timeout=180)
    return outcome["result"], ran


def test_helm_test_passes_its_smoke_pod_shaped_one_pod_and_saw_the_other_denied(
        local: Cluster, installed: Path, workdir: Path) -> None:
    result, ran = _helm_test(local, workdir)
    assert ran.exit_code == 0, ran.output
    assert "shaped: gpugate-smoke: policy default-gpu@" in ran.output
    assert "denied: web-gpugate-smoke:" in ran.output and "GPUs are not available in web" in ran.output
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"Phase:\s+Succeeded", result.stdout), result.stdout
    # The hooks' namespaces and account went once the test passed; the pod stays for --logs.
    core = local.core()
    wait_until(lambda: all(_gone(lambda n=n: core.read_namespace(n)) for n in ("gpugate-smoke", "web-gpugate-smoke")),
               what="the test namespaces to be deleted")


def _gone(read) -> bool:
    """Deleted, or on its way (a namespace is Terminating until the namespace controller empties it)."""
    try:
        found = read()
    except ApiException as error:
        return error.status == 404
    return bool(found.status and found.status.phase == "Terminating")


def test_the_smoke_check_fails_when_no_webhook_shapes_pods(local: Cluster, namespace: str) -> None:
    """The check can fail: in a namespace the webhook never sees, the GPU pod comes back unshaped."""
    core = local.core()
    core.patch_namespace(namespace, {"metadata": {"labels": {"gpugate.io/skip": "true"}}})
    done = subprocess.run([str(GPUGATE), "smoke", f"--shaped-namespace={namespace}"], capture_output=True,
                          text=True, timeout=60, env={"KUBECONFIG": str(local.kubeconfig)}, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "did not shape it" in done.stderr


def test_upgrade_with_a_changed_policy_rolls_the_webhook(local: Cluster, server: GpugateServer, installed: Path,
                                                           workdir: Path) -> None:
    apps = client.AppsV1Api(local.api_client())
    before = apps.read_namespaced_deployment("gpugate-webhook", NAMESPACE)
    values = release_values(server, workdir, policies={"files": {"chart-e2e.yaml": EXTRA_POLICY}})
    result = helm(local, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(values),
                  "--wait", "--timeout", "180s")
    assert result.returncode == 0, result.stdout + result.stderr
    config = local.core().read_namespaced_config_map("gpugate-policies", NAMESPACE)
    assert config.data == {"chart-e2e.yaml": EXTRA_POLICY}
    after = apps.read_namespaced_deployment("gpugate-webhook", NAMESPACE)
    old, new = (d.spec.template.metadata.annotations["checksum/policies"] for d in (before, after))
    assert old != new
    assert after.metadata.generation > before.metadata.generation

    def rolled() -> bool:
        current = apps.read_namespaced_deployment("gpugate-webhook", NAMESPACE)
        status = current.status
        return (status.observed_generation == current.metadata.generation and status.updated_replicas == 2
                and status.ready_replicas == 2 and not status.unavailable_replicas)

    wait_until(rolled, what="the webhook Deployment to roll out the new policies")
    sets = client.AppsV1Api(local.api_client()).list_namespaced_replica_set(
        NAMESPACE, label_selector="app.kubernetes.io/name=gpugate-webhook").items
    assert len(sets) == 2, "the upgrade made a new ReplicaSet"
    assert sorted(s.status.replicas for s in sets) == [0, 2]


def test_uninstall_leaves_no_webhook_configuration(local: Cluster, installed: Path) -> None:
    result = helm(local, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "120s")
    assert result.returncode == 0, result.stdout + result.stderr
    api = client.AdmissionregistrationV1Api(local.api_client())
    for read in (api.read_mutating_webhook_configuration, api.read_validating_webhook_configuration):
        with pytest.raises(ApiException) as error:
            read(WEBHOOK_NAME)
        assert error.value.status == 404
    for name in ("gpugate-webhook", "gpugate-certs", "gpugate-balancer"):
        assert not [c for c in client.RbacAuthorizationV1Api(local.api_client()).list_cluster_role().items
                    if c.metadata.name == name]
