"""Enforcement conformance, pods: every way a pod can name GPUs, through the real kube-apiserver v1.37.

The webhook as ``manifests/webhook`` ships it, the starter policies (``conformance_env``). Each shape
is an attack a tenant can make in their own namespace; each asserts the API server's answer (a
refusal by the webhook, or by the API server's own validation, never a 5xx) and that no pod holding
a GPU its policy forbids is stored. Kubernetes 1.37 makes the DRA extended-resource mapping GA:
``deviceclass.resource.kubernetes.io/<class>`` for every DeviceClass, and a class's
``extendedResourceName``, are served through a claim kube-scheduler makes, so they are GPU asks.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e import dra_slices
from tests.e2e.conformance_env import WEB_DENIAL, Obj, Shipped, container, pod, refused, shipped, stored_pods
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import Namespaces
from webhook.localcluster.cluster import Cluster, Nodes

CLASS = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
MIG_CLASS = "deviceclass.resource.kubernetes.io/mig.nvidia.com"
ACCEL = "e2e-accel"
ACCEL_NAME = "example.com/e2e-gpu"


@pytest.fixture(scope="module")
def env(local: Cluster, workdir: Path) -> Iterator[Shipped]:
    dra_slices.install_device_classes(local.api_client())
    with shipped(local, workdir, "asks") as found:
        yield found
    assert not found.errors(), found.errors()[:3]


@pytest.fixture(scope="module")
def plain(local: Cluster) -> Iterator[dict[str, str]]:
    """Namespaces named ``web`` and ``frontend`` exactly (a glob ``web-*`` does not match them)."""
    core = local.core()
    made = {}
    for name in ("web", "frontend"):
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        made[name] = name
    for name in made:
        wait_until(lambda name=name: _has_default_account(core, name), what=f"namespace {name} ready", timeout=30)
    yield made
    for name in made:
        core.delete_namespace(name)


def _has_default_account(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespaced_service_account("default", namespace)
        return True
    except ApiException:
        return False


GPU_ONE = {"nvidia.com/gpu": "1"}


def sidecar(limits: dict[str, str]) -> Obj:
    return container("sidecar", limits, restartPolicy="Always")


WEB_SHAPES: list[tuple[str, Obj]] = [
    ("nvidia-gpu", pod("p", container("app", GPU_ONE))),
    ("implicit-class-name", pod("p", container("app", {CLASS: "8"}))),
    ("implicit-mig-class-name", pod("p", container("app", {MIG_CLASS: "1"}))),
    ("mig-slice", pod("p", container("app", {"nvidia.com/mig-1g.10gb": "1"}))),
    ("shared-gpu", pod("p", container("app", {"nvidia.com/gpu.shared": "1"}))),
    ("init-container", pod("p", container("app"), init=[container("setup", GPU_ONE)])),
    ("sidecar", pod("p", container("app"), init=[sidecar({CLASS: "2"})])),
    ("second-container", pod("p", container("app"), container("helper", {CLASS: "1"}))),
    ("opt-out-label", pod("p", container("app", GPU_ONE), labels={"gpugate.io/skip": "true"})),
    ("gpus-label", pod("p", container("app"), labels={"gpugate.io/gpus": "1"})),
    ("milli-quantity", pod("p", container("app", {"nvidia.com/gpu": "2000m"}))),
]


@pytest.mark.parametrize(("shape", "body"), WEB_SHAPES, ids=[s for s, _ in WEB_SHAPES])
def test_a_web_namespace_gets_no_gpu_whatever_the_pod_names(env: Shipped, namespaces: Namespaces, shape: str,
                                                            body: Obj) -> None:
    web = namespaces.make("web-shop")
    message = refused(lambda: env.core.create_namespaced_pod(web, body))
    assert WEB_DENIAL in message and "(policy web-no-gpus@" in message
    assert refused(lambda: env.core.create_namespaced_pod(web, body, dry_run="All")) == message  # dry run alike
    assert stored_pods(env, web) == []


@pytest.mark.parametrize("name", ["web", "frontend"])
def test_the_plain_web_and_frontend_namespaces_are_denied_too(env: Shipped, plain: dict[str, str], name: str) -> None:
    message = refused(lambda: env.core.create_namespaced_pod(plain[name], pod("p", container("app", GPU_ONE))))
    assert WEB_DENIAL in message
    assert stored_pods(env, plain[name]) == []


@pytest.mark.parametrize(("shape", "body", "fragment"), [
    ("unknown-class", pod("p", container("app", {"deviceclass.resource.kubernetes.io/e2e-none": "1"})),
     "the extended resource of DeviceClass e2e-none, which gpugate does not know"),
    ("names-add-up", pod("p", container("a", {"nvidia.com/gpu": "3"}), container("b", {CLASS: "2"})),
     "asks 5 GPUs in all (container 'a' nvidia.com/gpu: 3; container 'b' " + CLASS + ": 2)"),
    ("sidecar-adds", pod("p", container("a", {"nvidia.com/gpu": "2"}), init=[sidecar({"nvidia.com/gpu": "3"})]),
     "asks 5 GPUs in all"),
    ("init-alone", pod("p", container("a", {"nvidia.com/gpu": "1"}), init=[container("setup", {CLASS: "5"})]),
     "initContainer 'setup' asks " + CLASS + ": 5; policy default-gpu@"),
], ids=["unknown-class", "names-add-up", "sidecar-adds", "init-alone"])
def test_max_counts_every_name_and_every_container(env: Shipped, namespaces: Namespaces, shape: str, body: Obj,
                                                  fragment: str) -> None:
    ml = namespaces.make("ml-team")
    assert fragment in refused(lambda: env.core.create_namespaced_pod(ml, body))
    assert stored_pods(env, ml) == []


def test_slices_and_shares_count_as_their_share_of_a_gpu(env: Shipped, namespaces: Namespaces) -> None:
    """A notebook meant never to hold a whole GPU: each container is within the policy, the pod is not."""
    nb = namespaces.make("notebooks")
    profile = {"gpugate.io/profile": "notebook"}
    two = [container(f"s{i}", {"nvidia.com/mig-2g.20gb": "1"}) for i in range(2)]
    shares = [container(f"t{i}", {"nvidia.com/gpu.shared": "1"}) for i in range(2)]
    message = refused(lambda: env.core.create_namespaced_pod(nb, pod("lab", *two, *shares, labels=profile)))
    assert ("pod 'lab' asks 1.07 GPUs in all (container 's0' nvidia.com/mig-2g.20gb: 1 = 0.29 GPU; container 's1' "
            "nvidia.com/mig-2g.20gb: 1 = 0.29 GPU; container 't0' nvidia.com/gpu.shared: 1 = 0.25 GPU") in message
    env.core.create_namespaced_pod(nb, pod("lab", *two, shares[0], labels=profile))  # 0.82 of a GPU


def test_a_pod_within_its_policy_is_stored_whatever_name_it_uses(env: Shipped, namespaces: Namespaces) -> None:
    ml = namespaces.make("ml-team")
    body = pod("a", container("a", {CLASS: "2"}), container("b", {"nvidia.com/gpu": "2"}))
    env.core.create_namespaced_pod(ml, body)
    assert stored_pods(env, ml) == ["a"]


def test_an_ephemeral_container_cannot_bring_a_gpu(env: Shipped, namespaces: Namespaces) -> None:
    """The API server refuses ephemeral containers at creation and any resources on one added later."""
    web = namespaces.make("web-shop")
    with_ephemeral = pod("p", container("app"))
    with_ephemeral["spec"]["ephemeralContainers"] = [container("debug", GPU_ONE)]
    refused(lambda: env.core.create_namespaced_pod(web, with_ephemeral), status=422)
    env.core.create_namespaced_pod(web, pod("p", container("app")))
    patch = {"spec": {"ephemeralContainers": [container("debug", GPU_ONE)]}}
    message = refused(lambda: env.core.patch_namespaced_pod_ephemeralcontainers("p", web, patch), status=422)
    assert "resources" in message


def test_a_deployment_in_a_web_namespace_is_refused_at_apply_and_never_gets_a_gpu_pod(
        env: Shipped, namespaces: Namespaces) -> None:
    """The validating webhook judges the pod template as the pod it becomes: the Deployment itself is
    refused with the pod's message, so no ReplicaSet ever tries (and fails) to make its pods."""
    web = namespaces.make("web-shop")
    labels = {"app": "shop"}
    apps = client.AppsV1Api(env.cluster.api_client())
    message = refused(lambda: apps.create_namespaced_deployment(web, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "shop"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [container("app", {CLASS: "1"})]}}}}))
    assert WEB_DENIAL in message and f"asks {CLASS}" in message
    assert apps.list_namespaced_deployment(web).items == [] and stored_pods(env, web) == []


def test_a_classs_own_extended_resource_name_is_learned_from_the_cluster_and_followed(
        env: Shipped, namespaces: Namespaces) -> None:
    """A cluster admin adds a class with ``extendedResourceName``: the webhook's watch learns it and
    a pod asking that name is judged as a GPU ask; deleted, the name is no GPU any more."""
    web = namespaces.make("web-shop")
    resource = env.resource
    asking = pod("p", container("app", {ACCEL_NAME: "2"}))
    env.core.create_namespaced_pod(web, asking, dry_run="All")  # not a GPU name yet
    resource.create_device_class({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                  "metadata": {"name": ACCEL}, "spec": {
                                      "extendedResourceName": ACCEL_NAME, "selectors": [{"cel": {
                                          "expression": 'device.driver == "gpu.nvidia.com"'}}]}})
    try:
        started = time.monotonic()
        wait_until(lambda: _refused_now(env, web, asking), what="the webhook to learn the new class", timeout=30)
        learned = time.monotonic() - started
        message = refused(lambda: env.core.create_namespaced_pod(web, asking))
        assert f"container 'app' asks {ACCEL_NAME}" in message and WEB_DENIAL in message
        assert learned < 10
    finally:
        resource.delete_device_class(ACCEL)
    wait_until(lambda: not _refused_now(env, web, asking), what="the webhook to forget the class", timeout=30)


def _refused_now(env: Shipped, namespace: str, body: Obj) -> bool:
    try:
        env.core.create_namespaced_pod(namespace, body, dry_run="All")
    except ApiException as error:
        assert error.status == 403, error.status
        return True
    return False


def test_kube_schedulers_claim_for_the_implicit_class_name_is_verified_and_the_pod_bound(
        env: Shipped, namespaces: Namespaces, nodes: Nodes) -> None:
    """A training pod asks ``deviceclass.resource.kubernetes.io/gpu.nvidia.com: 6`` (training allows 8)
    on a node that only DRA serves. kube-scheduler makes its claim in PreBind; judged alone (no
    labels) default-gpu would refuse 6. gpugate reads the owner pod, finds the same UID and exactly
    those devices asked, and lets the claim through: the pod is bound with 6 GPUs."""
    api = env.cluster.api_client()
    node = nodes.gpu(f"conf-dra-{secrets.token_hex(2)}", gpus=8, whole_gpus=0, product="NVIDIA-H100-80GB-HBM3")
    try:
        dra_slices.publish(api, node, dra_slices.gpus(8, node=node))
        ml = namespaces.make("ml-team")
        body = pod("mapped", container("main", {CLASS: "6"}), labels={"gpugate.io/profile": "training"})
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        env.core.create_namespaced_pod(ml, body)
        wait_until(lambda: (env.core.read_namespaced_pod("mapped", ml).spec.node_name or "") == node,
                   what="kube-scheduler binding the pod (its claim admitted)", timeout=90,
                   explain=env.cluster.logs_tail)
        (claim,) = api.sanitize_for_serialization(env.resource.list_namespaced_resource_claim(ml).items)
        assert claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
        assert [r["exactly"]["count"] for r in claim["spec"]["devices"]["requests"]] == [6]
        assert len(claim["status"]["allocation"]["devices"]["results"]) == 6
    finally:
        dra_slices.unpublish(api, node)
