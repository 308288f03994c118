"""Every kustomization and component renders with the real kubectl, and what it renders is valid.

Built-in kinds go through kubernetes-validate in strict mode for the cluster's Kubernetes version
(stack.yaml's cluster.kubernetesVersion; unknown or misspelt fields fail); custom resources through
the strict JSON schemas in ../shared/schemas.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.manifests.helpers import (
    COMPONENT_VARIANTS,
    KUBERNETES_VERSION,
    MANIFESTS,
    SCHEMA_ROOT,
    VARIANTS,
    is_custom,
    kustomization_dirs,
    kustomization_kind,
    render_variant,
    require_schemas,
)
from webhook.stack import manifestcheck

_is_custom = is_custom


def _rel(path: Path) -> str:
    return str(path.relative_to(MANIFESTS))


BASES = [d for d in kustomization_dirs() if kustomization_kind(d) == "Kustomization"]
COMPONENTS = [d for d in kustomization_dirs() if kustomization_kind(d) == "Component"]


@pytest.mark.parametrize("directory", BASES, ids=_rel)
def test_kustomization_renders_on_its_own(directory: Path) -> None:
    objects = manifestcheck.kustomize(directory)
    assert objects, f"{_rel(directory)} rendered nothing"


@pytest.mark.parametrize("directory", COMPONENTS, ids=_rel)
def test_every_component_is_rendered_by_a_variant(directory: Path) -> None:
    """A component cannot render alone: a variant composes it into a throwaway overlay."""
    variant = COMPONENT_VARIANTS.get(_rel(directory))
    assert variant is not None, f"add {_rel(directory)} to COMPONENT_VARIANTS in tests/manifests/helpers.py"
    assert _rel(directory) in VARIANTS[variant][1]
    assert render_variant(variant)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_has_no_duplicate_objects(variant: str) -> None:
    keys = [(o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
            for o in render_variant(variant)]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_builtin_objects_pass_strict_validation_for_1_33(variant: str) -> None:
    builtins = [o for o in render_variant(variant) if not _is_custom(o)]
    assert builtins
    assert manifestcheck.validate_objects(builtins, kubernetes_version=KUBERNETES_VERSION, schema_root=None) == []


CR_VARIANTS = ["webhook+cert-manager", "webhook+cert-manager+fail-open", "webhook+balancer+observability", "all"]


@pytest.mark.parametrize("variant", CR_VARIANTS)
def test_custom_resources_pass_their_strict_json_schemas(variant: str) -> None:
    require_schemas()
    customs = [o for o in render_variant(variant) if _is_custom(o)]
    assert customs, f"{variant} is expected to carry custom resources"
    assert manifestcheck.validate_objects(customs, kubernetes_version=KUBERNETES_VERSION,
                                          schema_root=SCHEMA_ROOT) == []


def test_cert_manager_variant_carries_the_issuers_and_certificates() -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in render_variant("webhook+cert-manager")
                   if _is_custom(o))
    assert kinds == [("Certificate", "gpugate-ca"), ("Certificate", "gpugate-webhook"),
                     ("Issuer", "gpugate-ca"), ("Issuer", "gpugate-selfsigned")]


@pytest.mark.parametrize("components", [["components/builtin-tls"],
                                        ["components/cert-manager", "components/fail-open"]])
def test_components_render_when_listed_in_the_base_itself(tmp_path: Path, components: list[str]) -> None:
    """Argo CD's spec.source.kustomize.components adds them to manifests/webhook's own kustomization."""
    copy = tmp_path / "manifests/webhook"
    shutil.copytree(MANIFESTS / "webhook", copy)
    shutil.copytree(MANIFESTS.parent / "policies", tmp_path / "policies")
    kustomization = yaml.safe_load((copy / "kustomization.yaml").read_text())
    kustomization["components"] = components
    (copy / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    objects = manifestcheck.kustomize(copy)
    secret_makers = [o for o in objects if o["kind"] in ("Job", "Certificate")]
    assert secret_makers
