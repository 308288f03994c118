"""What the enforcement conformance modules share: the webhook as shipped, on the real API server.

``tests/e2e/test_conformance_asks.py`` (every way a pod names GPUs) and
``tests/e2e/test_conformance_claims.py`` (claims, templates, their owners and their order) try the
attacks a tenant who may create pods, ResourceClaims, templates and workloads in their own
namespaces can make. Each module runs one ``gpugate serve --resolve-claims`` with a token of the
``gpugate-webhook`` ServiceAccount under the RBAC ``manifests/webhook`` renders, the repository's
starter policies, and both webhook configurations exactly as ``kubectl kustomize manifests/webhook``
renders them (only ``clientConfig`` pointed at the server), for the whole module.

Every attack asserts what the API server answered: a refusal (403 from the webhook, 422 from the
API server's own validation), never a 5xx, and no pod stored with a GPU its policy forbids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e import webhook_fixture as fixture
from tests.e2e.waiting import wait_until
from webhook.kube import claims
from webhook.localcluster.cluster import Cluster

Obj = dict[str, Any]
WEBHOOK_BASE = fixture.ROOT / "manifests" / "webhook"
WEB_DENIAL = "GPUs are not available in web and frontend namespaces"


class Shipped:
    """The served webhook, registered as shipped, and the cluster it judges for."""

    def __init__(self, cluster: Cluster, server: fixture.GpugateServer, registration: fixture.Registration) -> None:
        self.cluster, self.server, self.registration = cluster, server, registration
        self.core = cluster.core()
        self.resource = client.ResourceV1Api(cluster.api_client())

    def errors(self) -> list[Obj]:
        """Admissions the server answered with an internal error (a bug; none is expected)."""
        return [a for a in self.server.admissions() if a.get("result") == "error"]


@contextmanager
def shipped(local: Cluster, workdir: Path, name: str) -> Iterator[Shipped]:
    """The module's webhook: RBAC applied, server started with the account's token, configurations
    registered and in effect (a probe template in a web namespace is refused); all undone after."""
    policies = fixture.deployed_policies(workdir / "policies")
    certs = fixture.ServingCerts(workdir / "certs")
    assert local.plane is not None
    with fixture.webhook_account(local, workdir) as kubeconfig:
        server = fixture.GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca, policies=policies,
                                       log=local.plane.logs / f"gpugate-serve-{name}.log",
                                       extra_args=("--resolve-claims",), env={"KUBECONFIG": str(kubeconfig)})
        with fixture.serving(server):
            registration = fixture.Registration(local)
            namespaces = fixture.Namespaces(local)
            try:
                registration.apply(fixture.RenderedWebhooks.of(fixture.kustomize(WEBHOOK_BASE)).pointed_at(
                    server.base_url, certs.bundle.ca_cert))
                probe = namespaces.make("web-probe")
                wait_until(lambda: _probe_refused(local, probe), timeout=30, interval=0.1,
                           what="the API server to call gpugate", explain=local.logs_tail)
                yield Shipped(local, server, registration)
            finally:
                registration.remove()
                namespaces.delete_all()


def _probe_refused(cluster: Cluster, namespace: str) -> bool:
    try:
        client.ResourceV1Api(cluster.api_client()).create_namespaced_resource_claim_template(
            namespace, template("probe", 1), dry_run="All")
    except ApiException as error:
        return error.status == 403
    return False


def refused(action: Callable[[], object], *, status: int = 403) -> str:
    """The message of the API server's refusal of ``action`` (a webhook's is a 403; its own validation
    a 422); fails on success and on any 5xx."""
    try:
        action()
    except ApiException as error:
        assert error.status is not None and error.status < 500, f"{error.status}: {fixture.api_message(error)}"
        assert error.status == status, f"expected {status}, got {error.status}: {fixture.api_message(error)}"
        return fixture.api_message(error)
    raise AssertionError("the API server stored what it should have refused")


def pod(name: str, *containers: Obj, labels: dict[str, str] | None = None, init: list[Obj] | None = None,
        claims_: list[Obj] | None = None) -> Obj:
    spec: Obj = {"terminationGracePeriodSeconds": 0, "containers": list(containers)}
    if init:
        spec["initContainers"] = init
    if claims_:
        spec["resourceClaims"] = claims_
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": spec}


def container(name: str, limits: dict[str, str] | None = None, *, claims_: list[str] | None = None,
              **fields: Any) -> Obj:
    out: Obj = {"name": name, "image": "registry.example/app:1", **fields}
    resources: Obj = {}
    if limits:
        resources["limits"] = dict(limits)
    if claims_:
        resources["claims"] = [{"name": c} for c in claims_]
    if resources:
        out["resources"] = resources
    return out


def exactly(count: int, device_class: str = "gpu.nvidia.com") -> Obj:
    return {"name": "gpus", "exactly": {"deviceClassName": device_class, "count": count}}


def template(name: str, count: int, *, labels: dict[str, str] | None = None) -> Obj:
    return {"apiVersion": claims.API_VERSION, "kind": claims.TEMPLATE_KIND,
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"spec": {"devices": {"requests": [exactly(count)]}}}}


def resource_claim(name: str, *requests: Obj, metadata: Obj | None = None) -> Obj:
    return {"apiVersion": claims.API_VERSION, "kind": claims.CLAIM_KIND,
            "metadata": {"name": name, **(metadata or {})}, "spec": {"devices": {"requests": list(requests)}}}


def stored_pods(shipped_: Shipped, namespace: str) -> list[str]:
    return [p.metadata.name for p in shipped_.core.list_namespaced_pod(namespace).items]
