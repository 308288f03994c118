"""``argocd/site/site.yaml``: the per-installation settings every Argo CD object derives from.

A fork points Argo CD at itself by editing this one file; kustomize replacements
(``argocd/site/kustomization.yaml``) copy its values into the Applications and the AppProject.
``gpugate stack`` reads it too, so the chart it renders before a commit comes from the same Helm
repository Argo CD will pull from. Parsed once here (``Site.from_yaml``) with errors that name the
key; ``load`` is the only file read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.errors import GpugateError
from webhook.kube import yamlload

SITE_FILE = "argocd/site/site.yaml"
SITE_NAME = "gpugate-site"
_KEYS = {
    "repoURL": "repo_url",
    "revision": "revision",
    "chartRepoURL": "chart_repo_url",
    "grafanaURL": "grafana_url",
    "runbookURL": "runbook_url",
    "notifyRecipients": "notify_recipients",
}


@dataclass(frozen=True, kw_only=True)
class Site:
    """Where this installation's sources live and where its links and notifications go."""

    repo_url: str
    """The Git repository holding this tree (every Git source of every Application)."""
    revision: str
    """The branch or tag Argo CD follows in it."""
    chart_repo_url: str
    """The Helm repository serving NVIDIA's gpu-operator chart (NVIDIA's, a mirror, a test server)."""
    grafana_url: str
    runbook_url: str
    notify_recipients: str

    @classmethod
    def from_yaml(cls, text: str, *, where: str = SITE_FILE) -> Site:
        try:
            doc: Any = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise GpugateError(f"{where}{yamlload.describe_error(err)}") from err
        if not isinstance(doc, dict) or doc.get("kind") != "ConfigMap" \
                or (doc.get("metadata") or {}).get("name") != SITE_NAME:
            raise GpugateError(f"{where}: expected the ConfigMap {SITE_NAME} (a kustomize local-config object)")
        data = doc.get("data") or {}
        missing = [key for key in _KEYS if not isinstance(data.get(key), str) or not data[key].strip()]
        if missing:
            raise GpugateError(f"{where}: data.{', data.'.join(missing)} missing or empty "
                               f"(every key is copied into the Argo CD objects)")
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise GpugateError(f"{where}: unknown key(s) data.{', data.'.join(unknown)} "
                               f"(known: {', '.join(_KEYS)})")
        return cls(**{field: data[key].strip() for key, field in _KEYS.items()})


def load(repo: Path) -> Site | None:
    """The site settings of the repository at ``repo``; None when the file is absent (an old tree)."""
    path = Path(repo) / SITE_FILE
    if not path.is_file():
        return None
    return Site.from_yaml(path.read_text(encoding="utf-8"), where=str(path))
