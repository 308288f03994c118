"""Policies govern DRA claims, judged by the real kube-apiserver v1.36.

One ``gpugate serve --resolve-claims`` serves the module as the ``gpugate-webhook`` ServiceAccount:
its RBAC is applied exactly as ``kubectl kustomize manifests/webhook`` renders it and the server
reads claims with a TokenRequest token of that account, so the real RBAC authorizer judges every
read (a test shows it may GET claims and templates and nothing else). It is registered exactly as
the same rendering says, with only ``clientConfig`` pointed at it.
Policies: the repository's ``policies/`` plus ``e2e-dra-pinned``, which pins products, families
and memory, so the CEL selectors gpugate writes go through the API server's own CEL compiler.

What is proven, each claim failing if the behaviour broke:

1. the API server serves ``resource.k8s.io/v1`` without any flag (1.36: GA, on by default);
2. a ResourceClaimTemplate asking GPUs in a web namespace is refused with the policy's message;
3. a pod in an ML namespace over ``max`` through the claim templates it references is refused, and
   within it, a pod asking GPUs only through a template gets its policy's tolerations and pack terms;
4. ``allocationMode: All`` is refused;
5. an allowed template is stored with the policy's CEL selectors (the API server compiles them:
   ``replace``, ``lowerAscii``, ``quantity`` and ``compareTo`` are in its DRA CEL environment), and
   a spec UPDATE never reaches the webhook (the API server refuses it as immutable first), while a
   metadata UPDATE of a claim the policy would refuse today goes through;
6. those selectors mean what the policy means when kube-scheduler v1.36 allocates: a template that
   names no product, in a namespace whose policy pins ``NVIDIA-A100-SXM4-80GB`` (GFD's spelling),
   is allocated on the node whose ResourceSlice says ``productName: NVIDIA A100-SXM4-80GB``, not on
   the H100 node beside it (slices as tests/e2e/dra_slices.py publishes them for the driver);
7. the claim kube-scheduler itself makes for a plain ``nvidia.com/gpu`` pod on a DRA-only node
   (extended-resource mapping: the chart's ``gpu.nvidia.com`` class names ``nvidia.com/gpu``) is
   judged by the pod that owns it, which gpugate already admitted: it is never refused, so the
   pod is bound, even when the policy the claim alone would match allows fewer devices.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.e2e import dra_slices
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import (
    GpugateServer,
    Namespaces,
    Registration,
    ServingCerts,
    api_message,
    deployed_policies,
    register_as_shipped,
    serving,
    webhook_account,
)
from tests.policy.kit import policy
from webhook.kube import claims
from webhook.localcluster.cluster import Cluster, Nodes

PINNED_POLICY = policy("e2e-dra-pinned", """
    match: {namespaces: ["pinned-*"]}
    gpu:
      max: 4
      products: [NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-80GB]
      families: [hopper, ampere]
      minMemoryMiB: 40000
""", priority=500)
A100_POLICY = policy("e2e-dra-a100", """
    match: {namespaces: ["a100-*"]}
    gpu: {products: [NVIDIA-A100-SXM4-80GB], families: [ampere], minMemoryMiB: 80000}
""", priority=500)
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def policy_dir(workdir: Path) -> Path:
    return deployed_policies(workdir / "policies", {"e2e-dra-pinned.yaml": PINNED_POLICY,
                                                    "e2e-dra-a100.yaml": A100_POLICY})


@pytest.fixture(scope="module")
def certs(workdir: Path) -> ServingCerts:
    return ServingCerts(workdir / "certs")


@pytest.fixture(scope="module")
def webhook_kubeconfig(local: Cluster, workdir: Path) -> Iterator[Path]:
    """The webhook's ServiceAccount and RBAC as manifests/webhook renders them, applied; a kubeconfig
    with a TokenRequest token of that account (what the pod's mounted token gives it)."""
    with webhook_account(local, workdir) as kubeconfig:
        yield kubeconfig


@pytest.fixture(scope="module")
def server(local: Cluster, certs: ServingCerts, policy_dir: Path, webhook_kubeconfig: Path) -> Iterator[GpugateServer]:
    assert local.plane is not None
    started = GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca, policies=policy_dir,
                            log=local.plane.logs / "gpugate-serve-dra.log", extra_args=("--resolve-claims",),
                            env={"KUBECONFIG": str(webhook_kubeconfig)})
    with serving(started):
        yield started


@pytest.fixture
def registered(local: Cluster, server: GpugateServer, registration: Registration, certs: ServingCerts,
               namespaces: Namespaces) -> Registration:
    """The base rendering pointed at the module's server, in effect when the fixture returns."""
    register_as_shipped(registration, server, certs)
    probe = namespaces.make("web-probe")
    wait_until(lambda: _refused(local, probe), timeout=20, interval=0.1,
               what="the API server to call gpugate for resourceclaimtemplates", explain=local.logs_tail)
    return registration


def _refused(cluster: Cluster, namespace: str) -> bool:
    try:
        resource_api(cluster).create_namespaced_resource_claim_template(namespace, template("probe", 1),
                                                                         dry_run="All")
    except ApiException as error:
        return error.status == 403
    return False


def resource_api(cluster: Cluster) -> client.ResourceV1Api:
    return client.ResourceV1Api(cluster.api_client())


def template(name: str, count: int | None = None, *, labels: dict[str, str] | None = None,
             **exact: Any) -> Obj:
    ask: Obj = {"deviceClassName": "gpu.nvidia.com", **exact}
    if count is not None:
        ask["count"] = count
    return {"apiVersion": claims.API_VERSION, "kind": claims.TEMPLATE_KIND,
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": ask}]}}}}


def stored_template(cluster: Cluster, namespace: str, name: str) -> Obj:
    return cluster.api_client().sanitize_for_serialization(
        resource_api(cluster).read_namespaced_resource_claim_template(name, namespace))


def denial(action: Any) -> ApiException:
    with pytest.raises(ApiException) as caught:
        action()
    return caught.value


def test_the_api_server_serves_resource_k8s_io_v1_by_default(local: Cluster) -> None:
    served = client.ApisApi(local.api_client()).get_api_versions()
    group = next(g for g in served.groups if g.name == "resource.k8s.io")
    assert "v1" in {v.version for v in group.versions}
    assert group.preferred_version.version == "v1"
    kinds = {r.name: r.kind for r in resource_api(local).get_api_resources().resources}
    assert kinds["resourceclaimtemplates"] == "ResourceClaimTemplate"
    assert kinds["resourceclaims"] == "ResourceClaim"


def test_a_claim_template_in_a_web_namespace_is_refused_with_the_policys_message(
        local: Cluster, registered: Registration, namespaces: Namespaces) -> None:
    web = namespaces.make("web-shop")
    error = denial(lambda: resource_api(local).create_namespaced_resource_claim_template(web, template("eight", 8)))
    assert error.status == 403
    message = api_message(error)
    assert f"ResourceClaimTemplate 'eight' in namespace '{web}': request 'gpus' asks 8 gpu.nvidia.com; " \
           f"GPUs are not available in web and frontend namespaces" in message
    assert "(policy web-no-gpus@" in message


def test_a_pod_over_max_through_its_claim_templates_is_refused(
        local: Cluster, registered: Registration, namespaces: Namespaces) -> None:
    ml = namespaces.make("ml-train")
    training = {"gpugate.io/profile": "training"}
    # Six GPUs each: within training's max of 8 per claim, so the template itself is admitted.
    resource_api(local).create_namespaced_resource_claim_template(ml, template("six", 6, labels=training))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "labels": training},
           "spec": {"resourceClaims": [{"name": "a", "resourceClaimTemplateName": "six"},
                                       {"name": "b", "resourceClaimTemplateName": "six"}],
                    "containers": [{"name": "trainer", "image": "registry.example/train:1",
                                    "resources": {"claims": [{"name": "a"}, {"name": "b"}]}}]}}
    core = local.core()
    error = denial(lambda: core.create_namespaced_pod(ml, pod))
    assert error.status == 403
    message = api_message(error)
    assert (f"pod 'trainer' in namespace '{ml}' asks more than 8 GPUs in all (the ResourceClaims and templates "
            f"its claims 'a', 'b' name, counted by their devices and capacity); policy training@") in message
    assert "allows 8 per pod" in message
    # One template's worth fits: the same pod with one claim is stored.
    pod["spec"]["resourceClaims"] = pod["spec"]["resourceClaims"][:1]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "a"}]
    stored = core.create_namespaced_pod(ml, pod, dry_run="All")
    # ... shaped as a GPU pod by the mutating endpoint, which read the template as the webhook's account:
    # training's tolerations and its pack terms for six GPUs (gpu-free below 7, 8, 10, 14).
    tolerations = [(t.key, t.operator, t.effect) for t in stored.spec.tolerations or []]
    assert ("nvidia.com/gpu", "Exists", "NoSchedule") in tolerations
    preferred = stored.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    assert [t.preference.match_expressions[0].values for t in preferred][:4] == [["7"], ["8"], ["10"], ["14"]]
    assert not any((c.resources.limits or {}).get("nvidia.com/gpu") for c in stored.spec.containers)


def test_allocation_mode_all_is_refused(local: Cluster, registered: Registration, namespaces: Namespaces) -> None:
    ml = namespaces.make("ml-all")
    claim = {"apiVersion": claims.API_VERSION, "kind": claims.CLAIM_KIND, "metadata": {"name": "every-gpu"},
             "spec": {"devices": {"requests": [{"name": "all", "exactly": {
                 "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]}}}
    error = denial(lambda: resource_api(local).create_namespaced_resource_claim(ml, claim))
    assert error.status == 403
    message = api_message(error)
    assert f"ResourceClaim 'every-gpu' in namespace '{ml}', request 'all' asks allocationMode: All" in message
    assert "Ask for allocationMode: ExactCount with a count of 4 or fewer" in message


def test_an_allowed_template_is_stored_with_the_policys_cel_selectors_and_its_spec_stays_immutable(
        local: Cluster, registered: Registration, namespaces: Namespaces) -> None:
    pinned = namespaces.make("pinned")
    own = 'device.attributes["gpu.nvidia.com"].type == "gpu"'
    resource_api(local).create_namespaced_resource_claim_template(
        pinned, template("two", 2, selectors=[{"cel": {"expression": own}}]))
    stored = stored_template(local, pinned, "two")
    expressions = [s["cel"]["expression"] for s in stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]
                   ["selectors"]]
    assert expressions == [
        own,
        claims.product_selector(("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB")),
        claims.family_selector(("hopper", "ampere")),
        claims.memory_selector(40000),
    ]
    assert stored["metadata"]["annotations"]["gpugate.io/policy"].startswith("e2e-dra-pinned@")
    # A spec change is refused by the API server's own validation, before any validating webhook.
    stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 3
    error = denial(lambda: resource_api(local).replace_namespaced_resource_claim_template("two", pinned, stored))
    assert error.status == 422 and "field is immutable" in api_message(error)


def test_a_metadata_update_of_a_claim_the_policy_would_refuse_now_goes_through(
        local: Cluster, registration: Registration, server: GpugateServer, certs: ServingCerts,
        namespaces: Namespaces) -> None:
    """The resourceclaim controller adds and removes a finalizer by UPDATE: judging metadata could
    only ever block a deletion. A claim stored before gpugate was registered keeps working."""
    web = namespaces.make("web-legacy")
    claim = {"apiVersion": claims.API_VERSION, "kind": claims.CLAIM_KIND, "metadata": {"name": "old"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    api = resource_api(local)
    api.create_namespaced_resource_claim(web, claim)  # before registration: nothing judges it
    register_as_shipped(registration, server, certs)
    probe = namespaces.make("web-probe")
    wait_until(lambda: _refused(local, probe), timeout=20, interval=0.1,
               what="the API server to call gpugate for resourceclaimtemplates", explain=local.logs_tail)
    merge = "application/merge-patch+json"
    api.patch_namespaced_resource_claim("old", web, {"metadata": {"finalizers": ["example.com/keep"],
                                                                  "labels": {"team": "web"}}}, _content_type=merge)
    api.patch_namespaced_resource_claim("old", web, {"metadata": {"finalizers": None}}, _content_type=merge)
    error = denial(lambda: api.create_namespaced_resource_claim(web, {**claim, "metadata": {"name": "new"}}))
    assert error.status == 403 and "GPUs are not available in web and frontend namespaces" in api_message(error)


def test_the_policys_selectors_steer_the_schedulers_allocation_to_the_pinned_product(
        local: Cluster, registered: Registration, namespaces: Namespaces, nodes: Nodes) -> None:
    api = local.api_client()
    dra_slices.install_device_classes(api)
    h100 = nodes.gpu("dra-pin-h100", gpus=4, whole_gpus=0, product="NVIDIA-H100-80GB-HBM3")
    a100 = nodes.gpu("dra-pin-a100", gpus=2, whole_gpus=0, product="NVIDIA-A100-SXM4-80GB")
    try:
        dra_slices.publish(api, h100, dra_slices.gpus(4, node=h100))  # 81559 MiB: memory alone would pass
        pinned = namespaces.make("a100")
        resource_api(local).create_namespaced_resource_claim_template(pinned, template("one", 1))
        core = local.core()
        core.create_namespaced_pod(pinned, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer"},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"}],
                     "containers": [{"name": "main", "image": "trainer", "resources": {"claims": [{"name": "gpu"}]}}]}})
        # Only H100s are published: the selectors gpugate added leave no device, so the pod waits.
        wait_until(lambda: _unschedulable(core, pinned, "trainer"), what="kube-scheduler to find no device",
                   timeout=60, explain=local.logs_tail)
        assert not core.read_namespaced_pod("trainer", pinned).spec.node_name
        dra_slices.publish(api, a100, dra_slices.gpus(2, node=a100, product="NVIDIA A100-SXM4-80GB",
                                                      architecture="Ampere", cuda_compute_capability="8.0.0",
                                                      memory_mib=81920))
        wait_until(lambda: (core.read_namespaced_pod("trainer", pinned).spec.node_name or "") != "",
                   what="kube-scheduler binding the pod once A100s are published", timeout=90,
                   explain=local.logs_tail)
        assert core.read_namespaced_pod("trainer", pinned).spec.node_name == a100
        (claim,) = local.api_client().sanitize_for_serialization(
            resource_api(local).list_namespaced_resource_claim(pinned).items)
        assert [r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]] == [a100]
    finally:
        dra_slices.unpublish(api, h100)
        dra_slices.unpublish(api, a100)


def _unschedulable(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    conditions = core.read_namespaced_pod(name, namespace).status.conditions or []
    # kube-scheduler v1.36's DynamicResources plugin: "0/2 nodes are available: 2 cannot allocate all claims."
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               and "cannot allocate all claims" in (c.message or "") for c in conditions)


def test_the_webhooks_account_reads_claims_templates_device_classes_and_pods_and_nothing_else(
        local: Cluster, webhook_kubeconfig: Path) -> None:
    """The shipped RBAC (manifests/webhook/rbac.yaml), asked of the real RBAC authorizer as the account."""
    api = client.AuthorizationV1Api(config.new_client_from_config(config_file=str(webhook_kubeconfig)))

    def allowed(verb: str, resource: str, group: str = "resource.k8s.io", name: str = "x",
                namespace: str | None = "ml-any") -> bool:
        review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(namespace=namespace, verb=verb, group=group,
                                                            resource=resource, name=name or None)))
        return bool(api.create_self_subject_access_review(review).status.allowed)

    granted = {("resource.k8s.io", "resourceclaims"): {"get"}, ("resource.k8s.io", "resourceclaimtemplates"): {"get"},
               ("", "pods"): {"get", "list"}}
    for (group, resource), verbs in granted.items():
        for verb in ("get", "list", "watch", "create", "update", "delete"):
            name = "" if verb in ("list", "watch", "create") else "x"
            assert allowed(verb, resource, group=group, name=name) is (verb in verbs), (resource, verb)
    for verb in ("list", "watch"):
        assert allowed(verb, "deviceclasses", name="", namespace=None)
    assert not allowed("create", "deviceclasses", name="", namespace=None)
    assert not allowed("get", "secrets", group="") and not allowed("get", "resourceslices", name="x", namespace=None)


def test_the_claim_kube_scheduler_makes_for_a_mapped_nvidia_gpu_pod_is_judged_by_its_pod(
        local: Cluster, registered: Registration, namespaces: Namespaces, nodes: Nodes) -> None:
    """A training pod asks ``nvidia.com/gpu: 6`` (training allows 8) on a DRA-only node. kube-scheduler
    (DynamicResources, extendeddynamicresources.go) makes a ResourceClaim for it in PreBind: no labels,
    owned by the pod, annotated ``resource.kubernetes.io/extended-resource-claim``, asking 6
    ``gpu.nvidia.com``. Judged alone, that claim matches default-gpu (max 4) and would be refused,
    which fails the binding again and again: the pod would stay Pending for ever. gpugate judges it
    by its pod instead, so the pod is bound and the claim allocated, untouched by the webhook."""
    api = local.api_client()
    dra_slices.install_device_classes(api)
    node = nodes.gpu("dra-mapped", gpus=8, whole_gpus=0, product="NVIDIA-H100-80GB-HBM3")
    try:
        dra_slices.publish(api, node, dra_slices.gpus(8, node=node))
        ml = namespaces.make("ml-mapped")
        core = local.core()
        core.create_namespaced_pod(ml, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "mapped", "labels": {"gpugate.io/profile": "training"}},
            "spec": {"terminationGracePeriodSeconds": 0, "nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "main", "image": "trainer",
                                     "resources": {"limits": {"nvidia.com/gpu": "6"}}}]}})
        wait_until(lambda: (core.read_namespaced_pod("mapped", ml).spec.node_name or "") != "",
                   what="kube-scheduler binding the mapped pod (its claim admitted)", timeout=90,
                   explain=lambda: local.logs_tail() + _events(core, ml))
        (claim,) = api.sanitize_for_serialization(resource_api(local).list_namespaced_resource_claim(ml).items)
        assert claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
        assert "gpugate.io/policy" not in claim["metadata"]["annotations"]  # not shaped: allocated before admission
        assert [o["name"] for o in claim["metadata"]["ownerReferences"]] == ["mapped"]
        assert len(claim["status"]["allocation"]["devices"]["results"]) == 6
        # A pod that names such a claim itself is refused: only the scheduler may use one.
        error = denial(lambda: core.create_namespaced_pod(ml, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "borrower"},
            "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": claim["metadata"]["name"]}],
                     "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "g"}]}}]}}))
        assert error.status == 403 and "which only the pod kube-scheduler made it for may use" in api_message(error)
    finally:
        dra_slices.unpublish(api, node)


def _events(core: client.CoreV1Api, namespace: str) -> str:
    return "\n".join(f"{e.reason}: {e.message}" for e in core.list_namespaced_event(namespace).items)
