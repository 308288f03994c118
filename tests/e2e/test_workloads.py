"""Workloads judged at apply, on the real API server: ``kubectl apply`` of a Deployment asking GPUs in a
web namespace is refused with the pod's message, and an allowed Job brings its pods' warnings back to
the person who applied it (the webhook registered as manifests/webhook ships it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.webhook_fixture import GpugateServer, Namespaces, ServingCerts, kubectl, registered_as_shipped, serving
from tests.server.harness import copy_policies
from webhook.localcluster.cluster import Cluster

WEB = "GPUs are not available in web and frontend namespaces"


@pytest.fixture(scope="module")
def webhook(local: Cluster, workdir: Path) -> Iterator[GpugateServer]:
    """``gpugate serve`` with the starter policies, registered as manifests/webhook renders it."""
    assert local.plane is not None
    certs = ServingCerts(workdir / "certs")
    running = GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca, policies=copy_policies(workdir / "policies"),
                            log=local.plane.logs / "gpugate-workloads.log")
    with serving(running), registered_as_shipped(local, running, certs):
        yield running


def deployment(namespace: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "shop", "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "shop"}},
                 "template": {"metadata": {"labels": {"app": "shop"}},
                              "spec": {"containers": [{"name": "shop", "image": "registry.example.com/shop:1",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})


def job(namespace: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "finetune", "namespace": namespace},
        "spec": {"template": {"metadata": {"labels": {"gpugate.io/profile": "training", "gpugate.io/gpus": "2"}},
                              "spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "trainer", "image": "registry.example.com/t:1"}]}}}})


def test_kubectl_apply_of_a_deployment_asking_gpus_in_web_shop_is_refused_with_the_pods_message(
        local: Cluster, webhook: GpugateServer, namespaces: Namespaces) -> None:
    namespace = namespaces.make("web-shop")
    applied = kubectl(local, "apply", "-f", "-", input=deployment(namespace), check=False)
    assert applied.returncode != 0, applied.stdout
    assert 'admission webhook "validate.gpugate.io" denied the request' in applied.stderr, applied.stderr
    assert f"Deployment 'shop': pod 'shop-' in namespace '{namespace}'" in applied.stderr and WEB in applied.stderr
    listed = kubectl(local, "get", "deployments", "-n", namespace, "-o", "name")
    assert listed.stdout.strip() == "", "nothing was created"


def test_an_allowed_job_is_created_and_its_pods_warnings_reach_the_applier(
        local: Cluster, webhook: GpugateServer, namespaces: Namespaces) -> None:
    namespace = namespaces.make("ml-team")
    applied = kubectl(local, "apply", "-f", "-", input=job(namespace))
    assert "job.batch/finetune created" in applied.stdout
    warnings = [line for line in applied.stderr.splitlines() if line.startswith("Warning: ")]
    assert any("gpugate training@" in w and "set nvidia.com/gpu: 2 (requests = limits) on container 'trainer'"
               in w for w in warnings), applied.stderr
    assert any("preferred co-location of job batch.kubernetes.io/job-name=finetune" in w for w in warnings), warnings


def test_a_template_change_is_judged_again_and_a_scale_is_not(
        local: Cluster, webhook: GpugateServer, namespaces: Namespaces) -> None:
    namespace = namespaces.make("web-shop")
    cpu_only = deployment(namespace).replace("nvidia.com/gpu", "example.com/fpga")
    kubectl(local, "apply", "-f", "-", input=cpu_only)
    kubectl(local, "scale", "deployment/shop", "-n", namespace, "--replicas=2")  # deployments/scale: not judged
    changed = kubectl(local, "apply", "-f", "-", input=deployment(namespace), check=False)
    assert changed.returncode != 0 and WEB in changed.stderr, changed.stderr
