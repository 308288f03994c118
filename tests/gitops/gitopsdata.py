"""Shared helpers for the GitOps tests: locating ../shared, loading Argo CD objects, rendering
an Application source the way Argo CD's repo server would, and CRD schemas made strict.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.prerequisites import needed
from webhook.stack import manifestcheck, site, verify

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
ARGOCD = REPO / "argocd"
# Whatever argocd/site/site.yaml says: a fork edits that file and these tests follow it.
SITE = site.load(REPO)
assert SITE is not None, f"{site.SITE_FILE} is missing"
REPO_URL = SITE.repo_url
CHART_REPO = SITE.chart_repo_url

KubeObject = dict[str, Any]


def shared_or_skip() -> Path:
    return needed(SHARED, "fresh clone: ../shared/schemas and ../shared/upstream are needed")


def yaml_documents(root: Path) -> Iterator[tuple[Path, KubeObject]]:
    """Every YAML document under ``root`` that is a Kubernetes-style object."""
    for path in sorted(root.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and "apiVersion" in document and "kind" in document:
                yield path, document


def argo_objects() -> list[tuple[Path, KubeObject]]:
    """Every Application, ApplicationSet and AppProject anywhere under argocd/."""
    return [(p, o) for p, o in yaml_documents(ARGOCD) if str(o["apiVersion"]).startswith("argoproj.io/")]


_RENDER_CACHE: dict[tuple[str, tuple[str, ...]], list[KubeObject]] = {}


def kustomize(path: Path, components: tuple[str, ...] = ()) -> list[KubeObject]:
    """``manifestcheck.kustomize`` once per (path, components) per test session; callers get
    copies, so a test that mutates what it got cannot leak into another test."""
    key = (str(path), components)
    if key not in _RENDER_CACHE:
        _RENDER_CACHE[key] = _render(path, components)
    return copy.deepcopy(_RENDER_CACHE[key])


def deployed_applications() -> list[KubeObject]:
    """The Applications that really get applied: the root (bootstrap) and what it renders."""
    apps = [o for o in kustomize(ARGOCD / "bootstrap") if o["kind"] == "Application"]
    apps += [o for o in kustomize(ARGOCD / "apps") if o["kind"] == "Application"]
    return apps


def app_named(name: str) -> KubeObject:
    for app in deployed_applications():
        if app["metadata"]["name"] == name:
            return app
    raise AssertionError(f"no Application {name} is deployed")


def sources(app: KubeObject) -> list[dict[str, Any]]:
    spec = app["spec"]
    return list(spec["sources"]) if spec.get("sources") else [spec["source"]]


def render_source(source: dict[str, Any]) -> list[KubeObject]:
    """Render a Git source with a path like Argo CD does for kustomize: the path, plus any
    ``kustomize.components`` (Argo CD adds them with `kustomize edit add component`; we add
    them through a temporary overlay, which renders the same objects)."""
    components = tuple((source.get("kustomize") or {}).get("components") or ())
    return kustomize(REPO / source["path"], components)


def _render(path: Path, components: tuple[str, ...]) -> list[KubeObject]:
    if not components:
        return manifestcheck.kustomize(path)
    with tempfile.TemporaryDirectory() as tmp:
        overlay = Path(tmp)
        rel = lambda p: os.path.relpath(p, overlay)  # noqa: E731 - kustomize refuses absolute paths
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [rel(path)],
            "components": [rel(path / c) for c in components],
        }))
        return manifestcheck.kustomize(overlay)


def strict_crd_schema(crd_file: Path) -> dict[str, Any]:
    """The CRD's first version as strict JSON Schema: the same conversion `gpugate stack` validates with."""
    crd = yaml.safe_load(crd_file.read_text())
    return verify.strict_crd_schema(crd, crd["spec"]["versions"][0]["name"])


def dig(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's values merge: maps merge key by key, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
