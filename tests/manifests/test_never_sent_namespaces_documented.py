"""The namespaces the webhook configurations never send are the ones the docs name.

docs/deploy.md and the README once left out ``gpu-operator``, which both configurations exclude.
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


def test_every_excluded_namespace_is_named_where_the_docs_list_them() -> None:
    """deploy.md's registration section names each; every shorter mention ("namespaces never sent",
    in the README or any page of the manual) names each too, or ``kube-*`` for the kube- ones."""
    names = excluded()
    assert {"gpu-operator", "gpugate-system", "kube-system"} <= names
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    never = deploy[deploy.index("Never sent to the webhook"):][:400]
    assert all(f"`{name}`" in never for name in names), (names, never)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    lines = [line for page in pages for line in page.read_text().splitlines() if "namespaces never sent" in line]
    assert lines, "no short mention left: drop this half of the test"
    for line in lines:
        assert all(f"`{name}`" in line or (name.startswith("kube-") and "`kube-*`" in line) for name in names), line
