"""Render NVIDIA's gpu-operator chart the way Argo CD's repo server does: ``helm template``.

The edge around ``webhook.stack.chartcheck``: a helm subprocess and a temporary Helm home. Argo CD
runs ``helm template <chart> --name-template <release> --namespace <ns> --include-crds
--values <file>`` (argo-cd util/helm/cmd.go ``template()``); the same call here, against the same
Helm repository (``argocd/site/site.yaml`` chartRepoURL), is how ``gpugate stack upgrade`` sees
the objects a commit would make Argo CD apply before it makes the commit.

helm is not a Python dependency: it is looked up as ``--helm``, then ``$GPUGATE_HELM``, then on
``PATH``. Without it the caller skips the render and says so.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook.errors import GpugateError
from webhook.stack import rendering

HELM_ENV = "GPUGATE_HELM"
CHART_REPO_ENV = "GPUGATE_CHART_REPO"
RELEASE_NAME = "gpu-operator"
NAMESPACE = "gpu-operator"
# Fetching the chart (about 60 KB) and rendering it take well under a second on loopback; a
# slow mirror may take longer, a hang is a bug.
HELM_TIMEOUT_SECONDS = 180

KubeObject = dict[str, Any]


def find_helm(explicit: str | None = None) -> Path | None:
    """``explicit`` (a path or a name on PATH), else ``$GPUGATE_HELM``, else ``helm`` on PATH."""
    for candidate in (explicit, os.environ.get(HELM_ENV), "helm"):
        if not candidate:
            continue
        found = shutil.which(candidate)
        if found:
            return Path(found)
        if candidate in (explicit, os.environ.get(HELM_ENV)):
            raise GpugateError(f"helm {candidate!r} (from --helm or ${HELM_ENV}) is not an executable")
    return None


def _local_folder(repo_url: str) -> Path | None:
    """``file:///path`` (or a plain existing folder) names a folder of chart packages, not a Helm server."""
    if repo_url.startswith("file://"):
        return Path(repo_url.removeprefix("file://"))
    if "://" not in repo_url and Path(repo_url).is_dir():
        return Path(repo_url)
    return None


@dataclass(frozen=True, kw_only=True)
class ChartSource:
    """One chart version in one Helm repository (what an Application's Helm source names)."""

    repo_url: str
    chart: str
    version: str

    def __str__(self) -> str:
        return f"{self.chart} {self.version} from {self.repo_url}"


def render(helm: Path, source: ChartSource, *, values: bytes, kube_version: str | None = None,
           release: str = RELEASE_NAME, namespace: str = NAMESPACE) -> list[KubeObject]:
    """Every object ``helm template`` renders for ``source`` with ``values``, CRDs included, in order.

    ``kube_version`` (``1.33``) stands in for the cluster version Argo CD would pass. Helm keeps its
    caches in a temporary home, so nothing is written to the user's Helm configuration.
    """
    with tempfile.TemporaryDirectory(prefix="gpugate-helm-") as tmp:
        home = Path(tmp)
        values_file = home / "values.yaml"
        values_file.write_bytes(values)
        env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
               "HELM_DATA_HOME": str(home / "data")}
        local = _local_folder(source.repo_url)
        if local is not None:
            # A folder of packaged charts (e.g. a mirror, ../shared/upstream/charts): no server needed.
            package = local / f"{source.chart}-{source.version}.tgz"
            if not package.is_file():
                raise GpugateError(f"{package} not found: the chart folder {local} has no {source.chart} "
                                   f"{source.version}")
            chart_args = [str(package)]
        else:
            chart_args = [source.chart, "--repo", source.repo_url, "--version", source.version]
        args = [str(helm), "template", release, *chart_args, "--namespace", namespace, "--include-crds",
                "--values", str(values_file)]
        if kube_version:
            args += ["--kube-version", kube_version]
        documents = rendering.rendered_documents(args, what=f"helm template {source}", timeout=HELM_TIMEOUT_SECONDS,
                                                 env=env)
    return [d for d in documents if isinstance(d, dict)]
