"""The chart's documented combinations render the same objects as the kustomize folders, object by
object: the kustomize bases stay, and a change to one that the other lacks fails here
with a diff per object.

Normalised, because they are legitimately different, and nothing else:

- helm's own labels (``app.kubernetes.io/managed-by``, ``app.kubernetes.io/instance``,
  ``helm.sh/chart``) on object metadata;
- generated names: kustomize's ConfigMap generator suffixes ``gpugate-policies`` and
  ``gpugate-scheduler-config`` with a content hash (and rewrites the references), the chart names
  them plainly and rolls the Deployments through ``checksum/policies`` and ``checksum/config``
  pod-template annotations instead (dropped here); the chart's certificate Jobs carry a hash of
  their spec (``helm upgrade`` cannot patch a Job's pod template), kustomize's are plain
  ``gpugate-certs`` / ``gpugate-balancer-certs``;
- the release namespace: helm does not own the namespace it installs into, so without
  ``namespace.create`` the chart renders no Namespace (kustomize's is then left out), and with it
  the chart's Namespace carries ``helm.sh/resource-policy: keep`` (dropped here);
- `helm test` hooks, which only `helm test` creates (kustomize has no equivalent).
"""

from __future__ import annotations

import copy
import difflib
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.chart import installed, render, values_file
from tests.manifests.helpers import MANIFESTS, write_overlay
from webhook.stack import manifestcheck

HELM_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart")
CHECKSUM_ANNOTATIONS = ("checksum/policies", "checksum/config")
HELM_ONLY_ANNOTATIONS = ("helm.sh/resource-policy",)
KUSTOMIZE_HASHED = re.compile(r"^(gpugate-policies|gpugate-scheduler-config)-[a-z0-9]{10}$")
CHART_HASHED = re.compile(r"^(gpugate-certs|gpugate-balancer-certs)-[0-9a-f]{8}$")

# chart ci/<name>-values.yaml -> (kustomize resources, components), relative to manifests/.
COMPARISONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": (("webhook-builtin-tls", "balancer"), ()),
    "cert-manager": (("webhook", "balancer"), ("webhook/components/cert-manager",)),
    "fail-open": (("webhook", "balancer"), ("webhook/components/builtin-tls", "webhook/components/fail-open")),
    "everything": (("webhook-builtin-tls", "balancer", "scheduler"), ("observability",)),
    "canary": (("webhook-builtin-tls", "balancer", "canary"), ()),
}

Obj = dict[str, Any]
Key = tuple[str, str, str | None, str]


def _unhash(value: Any) -> Any:
    if isinstance(value, str):
        for pattern in (KUSTOMIZE_HASHED, CHART_HASHED):
            if match := pattern.match(value):
                return match.group(1)
        return value
    if isinstance(value, dict):
        return {k: _unhash(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unhash(v) for v in value]
    return value


def _drop(mapping: dict | None, keys: tuple[str, ...]) -> None:
    if isinstance(mapping, dict):
        for key in keys:
            mapping.pop(key, None)


def normalise(obj: Obj) -> Obj:
    """The object with only the differences the module docstring lists taken out."""
    obj = _unhash(copy.deepcopy(obj))
    meta = obj["metadata"]
    _drop(meta.get("labels"), HELM_LABELS)
    _drop(meta.get("annotations"), HELM_ONLY_ANNOTATIONS)
    template = (obj.get("spec") or {}).get("template") if obj["kind"] == "Deployment" else None
    if template:
        _drop(template["metadata"].get("annotations"), CHECKSUM_ANNOTATIONS)
        if template["metadata"].get("annotations") == {}:
            del template["metadata"]["annotations"]
    for holder in (meta, (template or {}).get("metadata")):
        if isinstance(holder, dict) and holder.get("annotations") == {}:
            del holder["annotations"]
    return obj


def key(obj: Obj) -> Key:
    return (obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])


def kustomize_render(resources: tuple[str, ...], components: tuple[str, ...]) -> list[Obj]:
    with tempfile.TemporaryDirectory(prefix="gpugate-overlay-") as tmp:
        write_overlay(Path(tmp), resources=[MANIFESTS / r for r in resources],
                      components=[MANIFESTS / c for c in components])
        return manifestcheck.kustomize(Path(tmp))


def _dump(obj: Obj) -> list[str]:
    return yaml.safe_dump(obj, sort_keys=True, width=200).splitlines(keepends=True)


def differences(kustomize: list[Obj], chart: list[Obj]) -> list[str]:
    """One readable entry per object that is missing on a side or differs (a unified diff)."""
    left = {key(n): n for n in map(normalise, kustomize)}
    right = {key(n): n for n in map(normalise, chart)}
    found = []
    for k in sorted(set(left) | set(right), key=str):
        name = f"{k[1]}/{k[3]}" + (f" in {k[2]}" if k[2] else "")
        if k not in right:
            found.append(f"{name}: rendered by kustomize, not by the chart")
        elif k not in left:
            found.append(f"{name}: rendered by the chart, not by kustomize")
        elif left[k] != right[k]:
            diff = "".join(difflib.unified_diff(_dump(left[k]), _dump(right[k]), "kustomize", "chart"))
            found.append(f"{name} differs:\n{diff}")
    return found


@pytest.mark.parametrize("values", sorted(COMPARISONS))
def test_chart_renders_the_kustomize_objects(values: str) -> None:
    resources, components = COMPARISONS[values]
    chart_values = yaml.safe_load(values_file(values).read_text()) or {}
    kustomize = kustomize_render(resources, components)
    if not (chart_values.get("namespace") or {}).get("create"):
        kustomize = [o for o in kustomize if o["kind"] != "Namespace"]
    found = differences(kustomize, installed(render((values_file(values),))))
    assert not found, (f"ci/{values}-values.yaml and kustomize {'+'.join(resources + components)} differ "
                       f"(change the chart's templates with the kustomize files):\n\n" + "\n".join(found))


def test_the_comparison_sees_a_difference() -> None:
    """A changed field, a missing object and an extra one are each reported, with the field in the diff."""
    base = kustomize_render(("balancer",), ())
    changed = copy.deepcopy(base)
    deployment = next(o for o in changed if o["kind"] == "Deployment")
    deployment["spec"]["replicas"] = 7
    dropped = next(o for o in changed if o["kind"] == "Service")
    changed.remove(dropped)
    changed.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra", "namespace": "x"}})
    found = differences(base, changed)
    assert len(found) == 3
    assert any("Deployment/gpugate-balancer in gpugate-system differs" in f and "+  replicas: 7" in f for f in found)
    assert any(f.startswith("Service/gpugate-balancer in gpugate-system: rendered by kustomize") for f in found)
    assert any(f.startswith("ConfigMap/extra in x: rendered by the chart") for f in found)
