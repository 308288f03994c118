"""Rules every rendered object and every container keep, in every variant."""

from __future__ import annotations

import re

import pytest

import webhook
from tests.manifests.helpers import VARIANTS, containers, pod_specs, render_variant

STANDARD_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/part-of", "app.kubernetes.io/component",
                   "app.kubernetes.io/version")
WORKLOAD_SELECTOR_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")
ALL = sorted(VARIANTS)


def _workloads(variant: str):
    for obj in render_variant(variant):
        yield from pod_specs(obj)


def test_every_variant_has_workloads() -> None:
    assert all(list(_workloads(v)) for v in ALL)


@pytest.mark.parametrize("variant", ALL)
def test_every_object_carries_the_standard_labels(variant: str) -> None:
    for obj in render_variant(variant):
        labels = obj["metadata"].get("labels") or {}
        missing = [key for key in STANDARD_LABELS if not labels.get(key)]
        assert not missing, f"{obj['kind']}/{obj['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/part-of"] == "gpugate"
        assert labels["app.kubernetes.io/version"] == webhook.__version__


@pytest.mark.parametrize("variant", ALL)
def test_selectors_never_name_the_version(variant: str) -> None:
    """A version bump must not change an immutable Deployment selector or orphan endpoints."""
    for obj in render_variant(variant):
        selectors = []
        if obj["kind"] in WORKLOAD_SELECTOR_KINDS:
            selectors.append(obj["spec"]["selector"]["matchLabels"])
            assert obj["spec"]["selector"]["matchLabels"].items() <= \
                obj["spec"]["template"]["metadata"]["labels"].items()
        if obj["kind"] == "Service":
            selectors.append(obj["spec"].get("selector") or {})
        for selector in selectors:
            assert "app.kubernetes.io/version" not in selector, f"{obj['kind']}/{obj['metadata']['name']}"


def resource_problems(container: dict) -> list[str]:
    resources = container.get("resources") or {}
    return [f"no {section}.{name}" for section in ("requests", "limits") for name in ("cpu", "memory")
            if name not in (resources.get(section) or {})]


def security_problems(pod: dict, container: dict) -> list[str]:
    """What breaks the restricted security context of must 1 (pod-level values count as defaults)."""
    pod_context = pod.get("securityContext") or {}
    context = container.get("securityContext") or {}
    problems = []
    if context.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation is not false")
    if context.get("readOnlyRootFilesystem") is not True:
        problems.append("readOnlyRootFilesystem is not true")
    if context.get("privileged"):
        problems.append("privileged")
    capabilities = context.get("capabilities") or {}
    if capabilities.get("drop") != ["ALL"] or capabilities.get("add"):
        problems.append("capabilities are not exactly drop [ALL]")
    if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
        problems.append("runAsNonRoot is not true")
    if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
        problems.append("runs as uid 0")
    seccomp = context.get("seccompProfile", pod_context.get("seccompProfile")) or {}
    if seccomp.get("type") != "RuntimeDefault":
        problems.append("seccompProfile is not RuntimeDefault")
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        problems.append("shares a host namespace")
    return problems


GOOD_CONTAINER = {
    "name": "c", "image": "a:1",
    "resources": {"requests": {"cpu": "1", "memory": "1Mi"}, "limits": {"cpu": "1", "memory": "1Mi"}},
    "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}},
}
GOOD_POD = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}}


@pytest.mark.parametrize(("pod_change", "context_change", "problem"), [
    ({}, {}, None),
    ({}, {"allowPrivilegeEscalation": True}, "allowPrivilegeEscalation is not false"),
    ({}, {"readOnlyRootFilesystem": False}, "readOnlyRootFilesystem is not true"),
    ({}, {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}, "capabilities are not exactly drop [ALL]"),
    ({}, {"runAsNonRoot": False}, "runAsNonRoot is not true"),
    ({}, {"runAsUser": 0}, "runs as uid 0"),
    ({"securityContext": {"runAsNonRoot": True}}, {}, "seccompProfile is not RuntimeDefault"),
    ({"hostNetwork": True}, {}, "shares a host namespace"),
])
def test_security_rule(pod_change: dict, context_change: dict, problem: str | None) -> None:
    pod = {**GOOD_POD, **pod_change}
    container = {**GOOD_CONTAINER, "securityContext": {**GOOD_CONTAINER["securityContext"], **context_change}}
    assert security_problems(pod, container) == ([problem] if problem else [])


def test_resource_rule() -> None:
    assert resource_problems(GOOD_CONTAINER) == []
    assert resource_problems({"resources": {"requests": {"cpu": "1"}}}) == [
        "no requests.memory", "no limits.cpu", "no limits.memory"]


@pytest.mark.parametrize("variant", ALL)
def test_every_container_has_requests_and_limits(variant: str) -> None:
    for label, pod in _workloads(variant):
        for container in containers(pod):
            assert resource_problems(container) == [], f"{label} container {container['name']}"


@pytest.mark.parametrize("variant", ALL)
def test_every_container_has_the_restricted_security_context(variant: str) -> None:
    for label, pod in _workloads(variant):
        for container in containers(pod):
            assert security_problems(pod, container) == [], f"{label} container {container['name']}"


def image_problem(image: str) -> str | None:
    """Why ``image`` is not pinned, or None: a digest, or a tag other than latest."""
    if "@sha256:" in image:
        return None
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return "has no tag"
    if tag == "latest":
        return "uses latest"
    if not re.search(r"\d", tag):
        return f"tag {tag!r} names no version"
    return None


@pytest.mark.parametrize(("image", "problem"), [
    ("ghcr.io/gpugate/gpugate", "has no tag"),
    ("localhost:5000/gpugate", "has no tag"),
    ("ghcr.io/gpugate/gpugate:latest", "uses latest"),
    ("ghcr.io/gpugate/gpugate:stable", "tag 'stable' names no version"),
    ("ghcr.io/gpugate/gpugate:0.1.0", None),
    ("registry.k8s.io/kube-scheduler:v1.36.3", None),
    ("localhost:5000/gpugate:1.2", None),
    ("ghcr.io/x/y@sha256:" + "0" * 64, None),
])
def test_image_rule(image: str, problem: str | None) -> None:
    assert image_problem(image) == problem


@pytest.mark.parametrize("variant", ALL)
def test_no_image_uses_latest_or_no_tag(variant: str) -> None:
    for label, pod in _workloads(variant):
        for container in containers(pod):
            assert image_problem(container["image"]) is None, f"{label}: {container['image']}"


def test_gpugate_images_carry_the_package_version() -> None:
    images = {c["image"] for _, pod in _workloads("all") for c in containers(pod) if "gpugate/gpugate" in c["image"]}
    assert images == {f"ghcr.io/gpugate/gpugate:{webhook.__version__}"}

