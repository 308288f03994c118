"""Paths, rendered variants and small readers shared by the manifest tests.

Components cannot be rendered alone, so each deployable variant is a throwaway overlay in a
temporary folder that names the real bases and components by relative path (kustomize refuses
absolute ones), rendered once per test session with the real ``kubectl kustomize``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests import kubeversion
from tests.prerequisites import needed
from webhook.stack import manifestcheck

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
POLICIES = REPO / "policies"
# The shared research folder sits next to the checkout, never inside it.
SHARED = REPO.parent / "shared"
SCHEMA_ROOT = SHARED / "schemas"

# The cluster the manifests target: stack.yaml cluster.kubernetesVersion (tests/kubeversion.py).
KUBERNETES_VERSION = kubeversion.KUBERNETES_VERSION
NAMESPACE = "gpugate-system"
OWN_ROOTS = ("webhook", "webhook-builtin-tls", "balancer", "scheduler", "observability")

# Every deployable combination: (resources, components), relative to manifests/.
VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "webhook": (("webhook",), ()),
    "webhook+builtin-tls": (("webhook",), ("webhook/components/builtin-tls",)),
    "webhook+cert-manager": (("webhook",), ("webhook/components/cert-manager",)),
    "webhook+builtin-tls+audit": (("webhook",), ("webhook/components/builtin-tls", "webhook/components/audit")),
    "webhook+builtin-tls+fail-open": (("webhook",), ("webhook/components/builtin-tls",
                                                       "webhook/components/fail-open")),
    "webhook+cert-manager+fail-open": (("webhook",), ("webhook/components/cert-manager",
                                                        "webhook/components/fail-open")),
    # What the Argo CD Application syncs (the base composed with builtin-tls in a sibling overlay).
    "webhook-builtin-tls": (("webhook-builtin-tls",), ()),
    "balancer": (("balancer",), ()),
    "scheduler": (("scheduler",), ()),
    "canary": (("canary",), ()),
    "webhook+balancer+observability": (("webhook", "balancer"), ("observability",)),
    "webhook+balancer+rebalance": (("webhook", "balancer"), ("balancer/components/rebalance",)),
    # Everything at once: also proves no two parts define the same object.
    "all": (("webhook", "balancer", "scheduler", "canary"), ("webhook/components/builtin-tls",
                                                   "webhook/components/fail-open", "observability")),
}

# Each component and the variant that renders it (a new component must be added here).
COMPONENT_VARIANTS: dict[str, str] = {
    "webhook/components/builtin-tls": "webhook+builtin-tls",
    "webhook/components/cert-manager": "webhook+cert-manager",
    "webhook/components/fail-open": "webhook+builtin-tls+fail-open",
    "webhook/components/audit": "webhook+builtin-tls+audit",
    "observability": "webhook+balancer+observability",
    "balancer/components/rebalance": "webhook+balancer+rebalance",
}

Obj = dict[str, Any]


BUILTIN_GROUPS_SUFFIX = ".k8s.io"


def is_custom(obj: Obj) -> bool:
    """A custom resource (validated by its CRD's JSON schema), not a built-in kind."""
    group = obj["apiVersion"].rpartition("/")[0]
    return "." in group and not group.endswith(BUILTIN_GROUPS_SUFFIX)


def require_schemas() -> None:
    """Skip (with the reason) when ../shared/schemas is absent, as in a fresh clone."""
    needed(SCHEMA_ROOT / "json", "fresh clone without ../shared: custom-resource schemas not checked; "
           "the built-in kinds are still validated")


def kustomization_dirs() -> list[Path]:
    """Every folder under our manifest roots that holds a kustomization, base or component."""
    found = []
    for root in OWN_ROOTS:
        for path in sorted((MANIFESTS / root).rglob("kustomization.yaml")):
            found.append(path.parent)
    return found


def kustomization_kind(directory: Path) -> str:
    return yaml.safe_load((directory / "kustomization.yaml").read_text()).get("kind", "Kustomization")


@cache
def render_variant(name: str) -> tuple[Obj, ...]:
    """Render a variant through a throwaway overlay; cached for the session (treat as read-only)."""
    resources, components = VARIANTS[name]
    with tempfile.TemporaryDirectory(prefix="gpugate-overlay-") as tmp:
        overlay = Path(tmp)
        write_overlay(overlay, resources=[MANIFESTS / r for r in resources],
                      components=[MANIFESTS / c for c in components])
        return tuple(manifestcheck.kustomize(overlay))


def write_overlay(directory: Path, *, resources: list[Path], components: list[Path]) -> None:
    text = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(path, directory) for path in resources],
    }
    if components:
        text["components"] = [os.path.relpath(path, directory) for path in components]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(text, sort_keys=False))


def find(objs: tuple[Obj, ...] | list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: tuple[Obj, ...] | list[Obj], kind: str, name: str | None = None) -> Obj:
    matches = find(objs, kind, name)
    assert len(matches) == 1, f"expected one {kind}/{name or '*'}, found {len(matches)}"
    return matches[0]


def pod_specs(obj: Obj) -> Iterator[tuple[str, Obj]]:
    """(label, pod spec) of every pod template a workload object carries."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    spec = obj.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield f"{kind}/{name}", spec["template"]["spec"]
    elif kind == "CronJob":
        yield f"{kind}/{name}", spec["jobTemplate"]["spec"]["template"]["spec"]
    elif kind == "Pod":
        yield f"{kind}/{name}", spec


def containers(pod_spec: Obj) -> Iterator[Obj]:
    yield from pod_spec.get("initContainers") or []
    yield from pod_spec.get("containers") or []


def arg_value(container: Obj, flag: str) -> str | None:
    """The value of ``--flag=value`` or ``--flag value`` in a container's command + args."""
    words = list(container.get("command") or []) + list(container.get("args") or [])
    for index, word in enumerate(words):
        if word.startswith(f"{flag}="):
            return word.split("=", 1)[1]
        if word == flag and index + 1 < len(words):
            return words[index + 1]
    return None


def rule_allows(rules: list[Obj], *, verb: str, group: str, resource: str, name: str | None) -> bool:
    """Whether RBAC ``rules`` allow the request, the way the RBAC authorizer decides it."""
    for rule in rules:
        if group not in rule.get("apiGroups", []) and "*" not in rule.get("apiGroups", []):
            continue
        if resource not in rule.get("resources", []) and "*" not in rule.get("resources", []):
            continue
        if verb not in rule.get("verbs", []) and "*" not in rule.get("verbs", []):
            continue
        names = rule.get("resourceNames") or []
        if names and (name is None or name not in names):
            continue
        return True
    return False
