"""The webhook's PodDisruptionBudget covers the webhook's pods and nothing else.

A pod that matches a PDB but belongs to a Job (no scale subresource) makes the disruption
controller refuse every eviction under that budget: node drains, including the GPU driver
upgrade's, would hang. The certificate Job must therefore never carry the webhook's labels.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.manifests.helpers import MANIFESTS, Obj, find, one, pod_specs, render_variant
from webhook.kube.affinity import Requirement
from webhook.policy import matching
from webhook.policy.model import LabelSelector
from webhook.stack import manifestcheck


def selector(raw: Obj) -> LabelSelector:
    return LabelSelector(
        match_labels=tuple(sorted((raw.get("matchLabels") or {}).items())),
        match_expressions=tuple(Requirement(e["key"], e["operator"], tuple(e.get("values") or ()))
                                for e in raw.get("matchExpressions") or ()))


def pods_matching_the_budget(objects: list[Obj] | tuple[Obj, ...]) -> list[str]:
    budget = one(objects, "PodDisruptionBudget", "gpugate-webhook")
    chosen = selector(budget["spec"]["selector"])
    out = []
    for obj in objects:
        for _ in pod_specs(obj):
            template_labels = _template_labels(obj)
            if obj["metadata"].get("namespace", "gpugate-system") == budget["metadata"]["namespace"] \
                    and matching.selector_matches(chosen, template_labels):
                out.append(f"{obj['kind']}/{obj['metadata']['name']}")
            break
    return out


def _template_labels(obj: Obj) -> dict[str, str]:
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["metadata"].get("labels") or {}


@pytest.mark.parametrize("variant", ["webhook-builtin-tls", "webhook+builtin-tls", "webhook+cert-manager", "all"])
def test_only_the_webhook_deployment_matches_its_disruption_budget(variant: str) -> None:
    assert pods_matching_the_budget(render_variant(variant)) == ["Deployment/gpugate-webhook"]


def test_components_inside_the_base_would_stamp_the_webhook_labels_on_the_certificate_job(tmp_path: Path) -> None:
    """Why Argo CD syncs manifests/webhook-builtin-tls instead of using kustomize.components."""
    copy = tmp_path / "manifests/webhook"
    shutil.copytree(MANIFESTS / "webhook", copy)
    shutil.copytree(MANIFESTS.parent / "policies", tmp_path / "policies")
    kustomization = yaml.safe_load((copy / "kustomization.yaml").read_text())
    kustomization["components"] = ["components/builtin-tls"]
    (copy / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    leaked = pods_matching_the_budget(manifestcheck.kustomize(copy))
    assert "Job/gpugate-certs" in leaked


def test_the_argocd_application_syncs_the_overlay() -> None:
    app = yaml.safe_load((MANIFESTS.parent / "argocd/apps/gpugate-webhook.yaml").read_text())
    assert app["spec"]["source"]["path"] == "manifests/webhook-builtin-tls"
    assert "kustomize" not in app["spec"]["source"]
    assert find(manifestcheck.kustomize(MANIFESTS / "webhook-builtin-tls"), "Job", "gpugate-certs")
