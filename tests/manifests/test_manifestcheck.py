"""manifestcheck itself: the real kubectl renders, strict validation catches what it must."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.manifests.helpers import KUBERNETES_VERSION, SCHEMA_ROOT, require_schemas
from webhook.errors import GpugateError
from webhook.stack import manifestcheck


def validate(objs: list[dict], *, schema_root: Path | None) -> list[str]:
    """validate_objects for the cluster the manifests target (stack.yaml cluster.kubernetesVersion)."""
    return manifestcheck.validate_objects(objs, kubernetes_version=KUBERNETES_VERSION, schema_root=schema_root)


def _write(directory: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def test_kustomize_returns_the_rendered_objects(tmp_path: Path) -> None:
    _write(tmp_path, {
        "kustomization.yaml": "resources: [cm.yaml]\nnamespace: demo\n",
        "cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: one}\ndata: {a: b}\n",
    })
    objects = manifestcheck.kustomize(tmp_path)
    assert [(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"]) for o in objects] == [
        ("ConfigMap", "one", "demo")
    ]


def test_kustomize_error_carries_kubectls_message(tmp_path: Path) -> None:
    _write(tmp_path, {"kustomization.yaml": "resources: [missing.yaml]\n"})
    with pytest.raises(GpugateError, match="missing.yaml"):
        manifestcheck.kustomize(tmp_path)


def test_unknown_field_in_a_builtin_kind_is_a_problem() -> None:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}, "datum": {}}
    problems = validate([obj], schema_root=None)
    assert len(problems) == 1 and problems[0].startswith("ConfigMap/x: ") and "datum" in problems[0]


def test_nested_type_error_names_the_path() -> None:
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
           "spec": {"replicas": "two", "selector": {}, "template": {}}}
    problems = validate([obj], schema_root=None)
    assert any(p.startswith("Deployment/d: spec.replicas: ") for p in problems), problems


def test_a_builtin_kind_at_a_removed_api_version_is_a_problem() -> None:
    obj = {"apiVersion": "extensions/v1beta1", "kind": "Ingress", "metadata": {"name": "old"}}
    assert validate([obj], schema_root=None) == [
        f"Ingress/old: Kubernetes {KUBERNETES_VERSION} serves no Ingress in extensions/v1beta1 "
        "(wrong apiVersion or kind)"
    ]


def test_valid_objects_give_no_problems() -> None:
    obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
           "spec": {"ports": [{"port": 443, "targetPort": 8443}], "selector": {"a": "b"}}}
    assert validate([obj], schema_root=None) == []


def test_custom_resource_is_checked_against_its_json_schema() -> None:
    require_schemas()
    cert = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "c"},
            "spec": {"secretName": "s", "issuerRef": {"name": "i"}, "dnsName": "typo"}}
    problems = validate([cert], schema_root=SCHEMA_ROOT)
    assert problems and all(p.startswith("Certificate/c: spec: ") for p in problems)
    assert "dnsName" in problems[0]


def test_unknown_top_level_field_of_a_custom_resource_is_a_problem() -> None:
    require_schemas()
    cert = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "c"},
            "spec": {"secretName": "s", "issuerRef": {"name": "i"}}, "specs": {}}
    problems = validate([cert], schema_root=SCHEMA_ROOT)
    assert len(problems) == 1 and "specs" in problems[0]


def test_custom_resource_without_schema_is_reported_only_when_schemas_exist(tmp_path: Path) -> None:
    crd = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert validate([crd], schema_root=None) == []
    assert validate([crd], schema_root=tmp_path / "absent") == []
    (tmp_path / "json").mkdir()
    problems = validate([crd], schema_root=tmp_path)
    assert len(problems) == 1 and problems[0].startswith("Widget/w: no schema for example.com/v1 Widget")


def test_object_without_kind_is_a_problem() -> None:
    assert validate([{"metadata": {"name": "n"}}], schema_root=None) == [
        "?/n: apiVersion and kind are required"
    ]
