"""Enforcement conformance, claims: ResourceClaims, templates, their owners and their order, on kube-apiserver v1.37.

The webhook as shipped (``conformance_env``). Nothing is trusted by its shape: a claim in
kube-scheduler's shape or the resourceclaim controller's is taken as such only when the pod it
names as its owner exists with that UID and asks exactly it; and the order of creation gives
nothing: a pod naming a claim or template that does not exist yet is refused, and a claim created
while pods already name it is judged with them (docs/dra.md says why both).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e import dra_slices
from tests.e2e.conformance_env import (
    WEB_DENIAL,
    Obj,
    Shipped,
    container,
    exactly,
    pod,
    refused,
    resource_claim,
    shipped,
    stored_pods,
    template,
)
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import LOOPBACK, Namespaces
from webhook import names
from webhook.kube import claims, rightsizedclaims
from webhook.localcluster.cluster import Cluster

UNREADABLE = "which gpugate could not read (it does not exist yet, or reading it failed)"


@pytest.fixture(scope="module")
def env(local: Cluster, workdir: Path) -> Iterator[Shipped]:
    dra_slices.install_device_classes(local.api_client())  # the chart's: gpu.nvidia.com serves nvidia.com/gpu
    with shipped(local, workdir, "claims") as found:
        yield found
    assert not found.errors(), found.errors()[:3]


def claim_pod(name: str, *entries: tuple[str, str, str], gpus: int = 0, labels: dict[str, str] | None = None) -> Obj:
    """A pod whose one container uses each (entry, kind, object) claim, with ``gpus`` of its own."""
    refs = [{"name": entry, ("resourceClaimName" if kind == "claim" else "resourceClaimTemplateName"): obj}
            for entry, kind, obj in entries]
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else None
    return pod(name, container("main", limits, claims_=[e for e, _, _ in entries]), claims_=refs, labels=labels)


def owned(name: str, owner: Obj, *, annotations: dict[str, str]) -> Obj:
    """Metadata of a claim naming ``owner`` (a stored pod) as its controlling owner."""
    return {"annotations": annotations, "ownerReferences": [{
        "apiVersion": "v1", "kind": "Pod", "name": owner.metadata.name, "uid": owner.metadata.uid,
        "controller": True}]}


def test_a_template_asking_gpus_in_a_web_namespace_is_refused(env: Shipped, namespaces: Namespaces) -> None:
    web = namespaces.make("web-shop")
    assert WEB_DENIAL in refused(lambda: env.resource.create_namespaced_resource_claim_template(web, template("t", 1)))


@pytest.mark.parametrize("kind", ["claim", "template"])
def test_a_pod_naming_what_does_not_exist_yet_is_refused_then_judged_with_it(
        env: Shipped, namespaces: Namespaces, kind: str) -> None:
    """Pod first, then its claims: refused at creation (the claim would never be counted with it).
    Claims first, then the pod: judged together, 8 devices against default-gpu's max of 4."""
    ml = namespaces.make("ml-team")
    body = claim_pod("p", ("a", kind, "four-a"), ("b", kind, "four-b"))
    assert UNREADABLE in refused(lambda: env.core.create_namespaced_pod(ml, body))
    for name in ("four-a", "four-b"):
        if kind == "claim":
            env.resource.create_namespaced_resource_claim(ml, resource_claim(name, exactly(4)))
        else:
            env.resource.create_namespaced_resource_claim_template(ml, template(name, 4))
    message = refused(lambda: env.core.create_namespaced_pod(ml, body))
    assert "asks more than 4 GPUs in all (the ResourceClaims and templates its claims 'a', 'b' name" in message
    assert stored_pods(env, ml) == []


def test_a_claim_deleted_and_created_again_larger_is_judged_with_the_pods_that_name_it(
        env: Shipped, namespaces: Namespaces) -> None:
    ml = namespaces.make("ml-team")
    env.resource.create_namespaced_resource_claim(ml, resource_claim("c", exactly(1)))
    env.core.create_namespaced_pod(ml, claim_pod("p", ("g", "claim", "c"), gpus=1))  # 2 of default-gpu's 4
    env.resource.delete_namespaced_resource_claim("c", ml)
    wait_until(lambda: not env.resource.list_namespaced_resource_claim(ml).items, what="claim c gone", timeout=30)
    message = refused(lambda: env.resource.create_namespaced_resource_claim(ml, resource_claim("c", exactly(4))))
    assert message.endswith(f"ResourceClaim 'c' in namespace '{ml}': a pod that already names it would then hold "
                            f"GPUs its policy does not allow (more than its max per pod, or where a deny rule "
                            f"forbids GPUs); delete the pods that name it first, or create a claim they may hold")
    assert "'p'" not in message  # neither which pods nor how many
    env.resource.create_namespaced_resource_claim(ml, resource_claim("c", exactly(3)))  # 1 + 3 = 4


def scheduler_shaped(name: str, owner: Obj, count: int) -> Obj:
    return resource_claim(name, {"name": "container-0-request-0", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count}},
        metadata=owned(name, owner, annotations={claims.EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}))


def test_a_claim_in_the_schedulers_shape_with_a_forged_owner_is_judged_as_a_users_claim(
        env: Shipped, namespaces: Namespaces) -> None:
    """Owner references are not authenticated: a live pod that asks no such devices, or the right
    pod under another UID, does not make a claim the scheduler's."""
    web = namespaces.make("web-shop")
    cpu = env.core.create_namespaced_pod(web, pod("cpu", container("app")))
    message = refused(lambda: env.resource.create_namespaced_resource_claim(web, scheduler_shaped("x", cpu, 8)))
    assert WEB_DENIAL in message
    ml = namespaces.make("ml-team")
    six = env.core.create_namespaced_pod(ml, pod("six", container("main", {"nvidia.com/gpu": "6"}),
                                                 labels={"gpugate.io/profile": "training"}))
    # Exactly what kube-scheduler would write for this pod: its own, judged with it (training allows 8).
    env.resource.create_namespaced_resource_claim(ml, scheduler_shaped("mine", six, 6), dry_run="All")
    # The same under another UID: a user's claim with no labels, which default-gpu (max 4) refuses.
    other_uid = scheduler_shaped("not-mine", six, 6)
    other_uid["metadata"]["ownerReferences"][0]["uid"] = str(uuid.uuid4())
    more = refused(lambda: env.resource.create_namespaced_resource_claim(ml, other_uid))
    assert "asks 6 gpu.nvidia.com devices; policy default-gpu@" in more
    # A request the pod does not make: a user's claim too (within default-gpu's 4, so stored) ...
    misnamed = scheduler_shaped("z", six, 2)
    misnamed["spec"]["devices"]["requests"][0]["name"] = "container-0-request-5"
    env.resource.create_namespaced_resource_claim(ml, misnamed)
    # ... which no pod may name: only the pod kube-scheduler makes such a claim for may use it.
    borrower = claim_pod("borrower", ("g", "claim", "z"))
    assert "which only the pod kube-scheduler made it for may use" in refused(
        lambda: env.core.create_namespaced_pod(ml, borrower))


def test_a_pod_naming_a_claim_before_it_exists_in_the_schedulers_shape_is_refused(
        env: Shipped, namespaces: Namespaces) -> None:
    """A pod names a claim that does not exist yet, then the claim is made in kube-scheduler's shape
    with an owner reference to any live pod: the pod is refused at creation, the claim as a user's."""
    web = namespaces.make("web-shop")
    assert UNREADABLE in refused(lambda: env.core.create_namespaced_pod(web, claim_pod("p", ("g", "claim", "later"))))
    anyone = env.core.create_namespaced_pod(web, pod("anyone", container("app")))
    assert WEB_DENIAL in refused(
        lambda: env.resource.create_namespaced_resource_claim(web, scheduler_shaped("later", anyone, 8)))


def test_a_claim_in_the_controllers_shape_is_judged_with_the_pod_it_names(env: Shipped,
                                                                         namespaces: Namespaces) -> None:
    """A claim annotated as made from the pod's template, owned by the pod: judged with the pod, so a
    larger copy of it gives the pod nothing over its max."""
    ml = namespaces.make("ml-team")
    env.resource.create_namespaced_resource_claim_template(ml, template("small", 1))
    owner = env.core.create_namespaced_pod(ml, claim_pod("p", ("gpus", "template", "small"), gpus=1))
    forged = resource_claim("p-gpus-forged", exactly(8), metadata=owned("p-gpus-forged", owner, annotations={
        "resource.kubernetes.io/pod-claim-name": "gpus"}))
    message = refused(lambda: env.resource.create_namespaced_resource_claim(ml, forged))
    assert "the pod it is made for would then hold GPUs its policy does not allow" in message
    # The controller's own claim for the pod (the template's one device) was admitted with the pod.
    wait_until(lambda: [c.metadata.name for c in env.resource.list_namespaced_resource_claim(ml).items],
               what="the resourceclaim controller's claim for p", timeout=60, explain=env.cluster.logs_tail)


def test_a_right_sized_template_only_gpugate_computed_is_admitted(env: Shipped, namespaces: Namespaces) -> None:
    """A pod may not carry a right-sized template of its own making, and a template named like one is
    admitted only as what right-sizing recomputes for a pod that names it: the balancer, which
    creates them from pods' annotations, cannot be made to create anything else."""
    ml = namespaces.make("ml-team")
    made = rightsizedclaims.template({}, {"devices": {"requests": [exactly(8)]}})
    name = made["metadata"]["name"]
    forged = claim_pod("p", (names.RIGHTSIZED_CLAIM, "template", name))
    forged["metadata"]["labels"] = {names.CLAIM_TEMPLATE_LABEL: name}
    forged["metadata"]["annotations"] = {names.CLAIM_TEMPLATE_ANNOTATION: rightsizedclaims.encode(made)}
    assert "carries a right-sized ResourceClaimTemplate" in refused(lambda: env.core.create_namespaced_pod(ml, forged))
    message = refused(lambda: env.resource.create_namespaced_resource_claim_template(ml, made))
    assert "no pod that names it recomputes to exactly it" in message


def test_allocation_mode_all_and_admin_access_are_refused(env: Shipped, namespaces: Namespaces) -> None:
    # The API server itself refuses adminAccess outside a namespace labelled for it: gpugate judges it there.
    ml = namespaces.make("ml-team", labels={"resource.kubernetes.io/admin-access": "true"})
    every = resource_claim("every", {"name": "all", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                "allocationMode": "All"}})
    assert "allocationMode: All" in refused(lambda: env.resource.create_namespaced_resource_claim(ml, every))
    admin = resource_claim("admin", {"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                              "adminAccess": True}})
    assert "adminAccess" in refused(lambda: env.resource.create_namespaced_resource_claim(ml, admin))


def post(env: Shipped, endpoint: str, review: Obj) -> Obj:
    """POST a review to the served webhook directly, as any pod that reaches its port could."""
    connection = http.client.HTTPSConnection(LOOPBACK, env.server.port, timeout=10)
    raw = socket.create_connection((LOOPBACK, env.server.port), timeout=10)
    connection.sock = env.server.client_context().wrap_socket(raw, server_hostname=env.server.server_name)
    try:
        connection.request("POST", f"/{endpoint}", body=json.dumps(review),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.status
        return json.loads(response.read())["response"]
    finally:
        connection.close()


def pod_review(namespace: str, body: Obj) -> Obj:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "operation": "CREATE", "object": body}}


def test_a_direct_post_for_another_namespace_learns_nothing_of_its_objects(env: Shipped,
                                                                          namespaces: Namespaces) -> None:
    """The webhook cannot tell the API server's call from a POST made by hand: its answer names no
    class, count or request of another namespace's claims, and reads the same for a template that
    does not exist as for one that cannot be read."""
    secret = namespaces.make("ml-secret")
    hidden = template("hidden", 6, labels={"gpugate.io/profile": "training"})
    hidden["spec"]["spec"]["devices"]["requests"][0]["name"] = "request-secret"
    env.resource.create_namespaced_resource_claim_template(secret, hidden)
    asking = claim_pod("probe", ("a", "template", "hidden"), ("b", "template", "hidden"),
                       labels={"gpugate.io/profile": "training"})
    answer = post(env, "validate", pod_review(secret, asking))
    message = answer["status"]["message"]
    assert answer["allowed"] is False and "asks more than 8 GPUs in all" in message
    cleaned = re.sub(r"@[0-9a-f]+", "@REVISION", message.replace(secret, "NS"))
    for leaked in ("6", "12", "gpu.nvidia.com", "request-secret", "ResourceClaimTemplate"):
        assert leaked not in cleaned, (leaked, cleaned)
    absent = post(env, "validate", pod_review(secret, claim_pod("probe", ("a", "template", "nothing"))))
    assert absent["status"]["message"].replace("nothing", "X") == (
        f"pod 'probe' in namespace '{secret}': its claim 'a' names ResourceClaimTemplate 'X', which gpugate could not "
        f"read (it does not exist yet, or reading it failed), so its GPUs cannot be counted. Create claims and "
        f"templates before the pods that use them")
    with pytest.raises(ApiException):  # nothing the POST did is stored
        env.core.read_namespaced_pod("probe", secret)
