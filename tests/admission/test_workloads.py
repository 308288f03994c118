"""Workloads are judged at apply: each pod template as the pod it becomes, with that pod's reasons and warnings."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask.testing import FlaskClient

from tests.server.harness import copy_policies
from webhook.admission import chain, reviews, workloads
from webhook.policy import loading
from webhook.server import routes

ROOT = Path(__file__).resolve().parents[2]
POLICIES = loading.load_dir(ROOT / "policies")
WEB = "GPUs are not available in web and frontend namespaces"


def gpu_template(labels: dict[str, str] | None = None, gpus: str | None = "1") -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": gpus}} if gpus is not None else {}
    return {"metadata": {"labels": {"app": "shop", **(labels or {})}},
            "spec": {"containers": [{"name": "shop", "image": "shop:1", "resources": resources}]}}


def workload(kind: str, template: dict[str, Any], name: str = "shop") -> dict[str, Any]:
    """A minimal object of ``kind`` holding ``template`` where its controller reads it."""
    found = next(k for k in workloads.WORKLOAD_KINDS if k.kind == kind)
    api_version = f"{found.group}/{found.version}"
    if kind == "CronJob":
        spec: dict[str, Any] = {"schedule": "@daily", "jobTemplate": {"spec": {"template": template}}}
    elif kind == "JobSet":
        spec = {"replicatedJobs": [{"name": "workers", "template": {"spec": {"template": template}}}]}
    else:
        spec = {"template": template}
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}


def judge(obj: dict[str, Any], namespace: str) -> Any:
    kind = workloads.kind_of_document(obj)
    assert kind is not None
    return workloads.judge(kind, obj, namespace=namespace, policies=POLICIES)


ALL_KINDS = [k.kind for k in workloads.WORKLOAD_KINDS]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_workload_asking_gpus_in_a_web_namespace_is_refused_with_the_pods_reason(kind: str) -> None:
    obj = workload(kind, gpu_template())
    verdict = judge(obj, "web-shop")
    (pod_reason,) = chain.admit(workloads.template_pods(workloads.kind_of_document(obj), obj)[0][1],
                                namespace="web-shop", policies=POLICIES).reasons
    assert not verdict.allowed and WEB in pod_reason
    prefix = f"{kind} 'shop': " + ("replicatedJob 'workers': " if kind == "JobSet" else "")
    assert verdict.reasons == (prefix + pod_reason,)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_workload_without_gpus_in_a_web_namespace_is_allowed(kind: str) -> None:
    assert judge(workload(kind, gpu_template(gpus=None)), "web-shop").allowed


def test_an_allowed_job_carries_the_warnings_its_pods_get() -> None:
    template = gpu_template({"gpugate.io/profile": "training", "gpugate.io/gpus": "2"}, gpus=None)
    obj = workload("Job", template, name="finetune")
    verdict = judge(obj, "ml-team")
    pod = workloads.template_pods(workloads.WORKLOAD_KINDS[4], obj)[0][1]
    assert verdict.allowed and verdict.warnings == chain.admit(pod, namespace="ml-team", policies=POLICIES).warnings
    assert any("set nvidia.com/gpu: 2" in w for w in verdict.warnings)
    assert str(verdict.policy).startswith("training@")


def test_a_job_template_is_judged_with_the_label_its_controller_adds() -> None:
    """The Job controller labels its pods with the job's name: a group policy reads it."""
    obj = workload("Job", gpu_template(), name="finetune")
    (_, pod), = workloads.template_pods(workloads.kind_of_document(obj), obj)
    assert pod["metadata"]["labels"][workloads.JOB_NAME_LABEL] == "finetune"
    assert pod["metadata"]["generateName"] == "finetune-" and "name" not in pod["metadata"]


def test_a_gpus_label_over_the_limit_is_refused_with_mutations_reason() -> None:
    """The mutating webhook refuses gpus: "100" for a pod, so the workload is refused with that reason."""
    obj = workload("Deployment", gpu_template({"gpugate.io/profile": "training", "gpugate.io/gpus": "100"},
                                              gpus=None))
    verdict = judge(obj, "ml-team")
    assert not verdict.allowed and "asks for 100 GPUs; policy training allows 8" in verdict.message


def test_the_skip_label_on_a_template_skips_shaping_never_the_rules() -> None:
    skipped = gpu_template({"gpugate.io/skip": "true", "gpugate.io/profile": "training"})
    assert not judge(workload("Deployment", skipped), "web-shop").allowed
    allowed = judge(workload("Deployment", skipped), "ml-team")
    assert allowed.allowed and not any("set " in w or "tolerations" in w for w in allowed.warnings)


def test_each_template_of_a_jobset_is_judged_and_named() -> None:
    obj = workload("JobSet", gpu_template(gpus=None))
    obj["spec"]["replicatedJobs"].append({"name": "trainers", "template": {"spec": {"template": gpu_template()}}})
    verdict = judge(obj, "web-shop")
    assert len(verdict.reasons) == 1 and verdict.reasons[0].startswith("JobSet 'shop': replicatedJob 'trainers': ")


@pytest.mark.parametrize(("operation", "change", "judged"), [
    ("CREATE", None, True),
    ("UPDATE", "annotation", False),   # the deployment controller's revision annotation
    ("UPDATE", "replicas", False),
    ("UPDATE", "template", True),
    ("DELETE", None, False),
])
def test_only_a_create_or_a_template_change_is_judged(operation: str, change: str | None, judged: bool) -> None:
    old = workload("Deployment", gpu_template())
    new = copy.deepcopy(old)
    if change == "annotation":
        new["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "2"}
    elif change == "replicas":
        new["spec"]["replicas"] = 5
    elif change == "template":
        new["spec"]["template"]["spec"]["containers"][0]["image"] = "shop:2"
    kind = workloads.kind_of_document(new)
    assert kind is not None
    assert workloads.needs_judging(kind, operation, new, old if operation == "UPDATE" else None) is judged


def test_only_the_listed_kinds_are_workloads() -> None:
    assert workloads.kind_of("apps", "Deployment") is not None
    assert workloads.kind_of("", "Pod") is None
    assert workloads.kind_of("apps", "ControllerRevision") is None
    assert workloads.kind_of("example.com", "Deployment") is None


# --- the validating route ------------------------------------------------------------------------

def review(obj: dict[str, Any], namespace: str, *, operation: str = "CREATE", old: dict[str, Any] | None = None,
           sub_resource: str = "") -> dict[str, Any]:
    kind = workloads.kind_of_document(obj)
    assert kind is not None
    gvk = {"group": kind.group, "version": kind.version, "kind": kind.kind}
    request = {"uid": str(uuid.uuid4()), "kind": gvk, "resource": {**gvk, "resource": kind.resource},
               "name": obj["metadata"]["name"], "namespace": namespace, "operation": operation, "object": obj,
               "oldObject": old, "subResource": sub_resource, "dryRun": False}
    return {"apiVersion": reviews.API_VERSION, "kind": reviews.KIND, "request": request}


@pytest.fixture(scope="module")
def app_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlaskClient]:
    folder = copy_policies(tmp_path_factory.mktemp("workloads") / "policies")
    yield routes.create_app(routes.ServerSettings(policy_dir=folder, reload_interval=0)).test_client()


def answer(client: FlaskClient, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    http = client.post(f"/{endpoint}", json=body)
    assert http.status_code == 200
    return http.get_json()["response"]


def test_validate_refuses_a_deployment_asking_gpus_in_a_web_namespace(app_client: FlaskClient) -> None:
    response = answer(app_client, "validate", review(workload("Deployment", gpu_template()), "web-shop"))
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert response["status"]["message"].startswith("Deployment 'shop': pod 'shop-' in namespace 'web-shop'")
    assert WEB in response["status"]["message"]
    assert response["auditAnnotations"]["policy"].startswith("web-no-gpus@")


def test_validate_answers_an_allowed_job_with_its_pods_warnings(app_client: FlaskClient) -> None:
    template = gpu_template({"gpugate.io/profile": "training", "gpugate.io/gpus": "2"}, gpus=None)
    response = answer(app_client, "validate", review(workload("Job", template), "ml-team"))
    assert response["allowed"] is True
    assert any("set nvidia.com/gpu: 2" in w for w in response["warnings"])


@pytest.mark.parametrize(("endpoint", "sub_resource"), [("mutate", ""), ("validate", "status"),
                                                        ("validate", "scale")])
def test_mutation_and_subresources_of_a_workload_pass_untouched(app_client: FlaskClient, endpoint: str,
                                                                  sub_resource: str) -> None:
    body = review(workload("Deployment", gpu_template()), "web-shop", sub_resource=sub_resource)
    response = answer(app_client, endpoint, body)
    assert response["allowed"] is True and "warnings" not in response and "auditAnnotations" not in response


def test_a_metadata_update_of_a_forbidden_workload_passes(app_client: FlaskClient) -> None:
    """A policy written after the Deployment must not block its controller's own writes."""
    old = workload("Deployment", gpu_template())
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "2"}
    assert answer(app_client, "validate", review(new, "web-shop", operation="UPDATE", old=old))["allowed"] is True
    new["spec"]["template"]["spec"]["containers"][0]["image"] = "shop:2"
    assert answer(app_client, "validate", review(new, "web-shop", operation="UPDATE", old=old))["allowed"] is False


def test_the_shipped_configuration_registers_exactly_the_judged_kinds() -> None:
    documents = list(yaml.safe_load_all((ROOT / "manifests/webhook/webhookconfigurations.yaml").read_text()))
    validating = next(d for d in documents if d["kind"] == "ValidatingWebhookConfiguration")
    registered = {(group, rule["apiVersions"][0], resource) for hook in validating["webhooks"]
                  for rule in hook["rules"] for group in rule["apiGroups"] for resource in rule["resources"]}
    assert {(k.group, k.version, k.resource) for k in workloads.WORKLOAD_KINDS} <= registered


def test_an_object_without_a_pod_template_is_not_judged() -> None:
    kind = workloads.kind_of("apps", "Deployment")
    assert kind is not None
    assert not workloads.needs_judging(kind, "CREATE", {"apiVersion": "apps/v1", "kind": "Deployment",
                                                        "metadata": {"name": "x"}, "spec": {}}, None)
