"""The admission routes take DRA claims: claims and templates are shaped and judged,
metadata-only UPDATEs and subresources pass untouched, and with --resolve-claims the validating
endpoint reads a pod's templates from the API (a fake API server on 127.0.0.1, the real client)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient

from tests.kubefake import FakeKube
from tests.server.harness import copy_policies
from webhook import kubeclient
from webhook.admission import reviews
from webhook.kube import claims
from webhook.server import routes
from webhook.server.claimlookup import ClaimLookup


def template(name: str = "eight", count: int = 8, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": claims.API_VERSION, "kind": claims.TEMPLATE_KIND,
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}}}}


def review(obj: dict[str, Any], namespace: str, *, operation: str = "CREATE", old: dict[str, Any] | None = None,
           sub_resource: str = "") -> dict[str, Any]:
    wrapped: Any = reviews.wrap_pod(obj, uid=str(uuid.uuid4()), namespace=namespace, operation=operation)
    wrapped["request"]["oldObject"] = old
    if sub_resource:
        wrapped["request"]["subResource"] = sub_resource
    return wrapped


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[FlaskClient]:
    app = routes.create_app(routes.ServerSettings(policy_dir=copy_policies(tmp_path / "policies"),
                                                  reload_interval=0))
    yield app.test_client()


def answer(client: FlaskClient, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    http = client.post(f"/{endpoint}", json=body)
    assert http.status_code == 200
    return http.get_json()["response"]


def test_a_gpu_template_in_a_web_namespace_is_denied_and_named(app_client: FlaskClient) -> None:
    response = answer(app_client, "validate", review(template(), "web-shop"))
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert response["status"]["message"].startswith(
        "ResourceClaimTemplate 'eight' in namespace 'web-shop': request 'gpus' asks 8 gpu.nvidia.com; GPUs are not "
        "available in web and frontend namespaces")


def test_a_template_is_shaped_on_create_and_the_shaped_one_is_allowed(app_client: FlaskClient) -> None:
    asked = template("one", 1, labels={"gpugate.io/profile": "inference"})
    response = answer(app_client, "mutate", review(asked, "ml-team"))
    shaped = jsonpatch.apply_patch(asked, reviews.decode_patch(response["patch"]))
    selectors = shaped["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert selectors == [{"cel": {"expression": claims.memory_selector(24000)}}]
    assert response["auditAnnotations"]["policy"].startswith("inference@")
    assert answer(app_client, "validate", review(shaped, "ml-team"))["allowed"] is True
    assert "patch" not in answer(app_client, "mutate", review(shaped, "ml-team"))


@pytest.mark.parametrize(("operation", "sub_resource", "changed"), [
    ("UPDATE", "", False),       # the resourceclaim controller's finalizer: metadata only
    ("UPDATE", "status", True),  # resourceclaims/status: the scheduler's allocation
    ("DELETE", "", False),
])
def test_what_cannot_change_a_decision_passes_untouched(app_client: FlaskClient, operation: str,
                                                        sub_resource: str, changed: bool) -> None:
    stored = template()
    new = {**stored, "metadata": {**stored["metadata"], "finalizers": ["resource.kubernetes.io/delete-protection"]}}
    if changed:
        new = {**new, "status": {"allocation": {}}}
    response = answer(app_client, "validate", review(new, "web-shop", operation=operation, old=stored,
                                                     sub_resource=sub_resource))
    assert response["allowed"] is True


def test_an_update_that_changes_the_spec_is_judged(app_client: FlaskClient) -> None:
    response = answer(app_client, "validate", review(template(count=9), "ml-team", operation="UPDATE",
                                                     old=template(count=1)))
    assert response["allowed"] is False and "policy default-gpu@" in response["status"]["message"]


def test_the_lookup_reads_a_pods_templates_through_the_real_client() -> None:
    with FakeKube() as kube:
        kube.register("resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates", True)
        kube.register("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", True)
        kube.put({**template("six", 6), "metadata": {"name": "six", "namespace": "ml-a"}})
        lookup = ClaimLookup(kubeclient.api_client(kube.url))
        pod = {"spec": {"resourceClaims": [{"name": "a", "resourceClaimTemplateName": "six"},
                                           {"name": "b", "resourceClaimName": "absent"}]}}
        resolved = lookup.resolve(pod, "ml-a")
    assert list(resolved) == [("ResourceClaimTemplate", "six")]
    assert resolved[("ResourceClaimTemplate", "six")].most_devices(frozenset(claims.NVIDIA_DEVICE_CLASSES)) == 6
