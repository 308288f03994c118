"""The namespaces the webhook configurations never send are the ones the docs name.

docs/deploy.md and the README left out ``gpu-operator``, which both configurations exclude.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def excluded() -> set[str]:
    names: set[str] = set()
    for document in yaml.safe_load_all((ROOT / "manifests" / "webhook" / "webhookconfigurations.yaml").read_text()):
        for hook in (document or {}).get("webhooks", []):
            for expression in hook["namespaceSelector"].get("matchExpressions", []):
                if expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn":
                    names |= set(expression["values"])
    return names


def test_every_excluded_namespace_is_named_in_deploy_md_and_the_readme() -> None:
    names = excluded()
    assert {"gpu-operator", "gpugate-system", "kube-system"} <= names
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    never = deploy[deploy.index("Never sent to the webhook"):][:400]
    assert all(f"`{name}`" in never for name in names), (names, never)
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if "namespaces never sent" in line)
    assert all(f"`{name}`" in line or (name.startswith("kube-") and "`kube-*`" in line) for name in names), line
