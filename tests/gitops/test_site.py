"""One file points Argo CD at a fork: argocd/site/site.yaml.

The Applications and the AppProject carry markers; the kustomize replacements of argocd/site copy
the site's repository, branch, chart repository, links and notification recipients into them, in
both top-level builds (argocd/bootstrap, applied by hand, and argocd/apps, synced by the root).
A fork, or the Argo CD e2e tests pointing at a loopback git daemon and Helm repository, edits that
file and nothing else; these tests read the URLs from it, so they pass for any site.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.gitops.gitopsdata import ARGOCD, REPO, SITE, kustomize, sources
from webhook.errors import GpugateError
from webhook.stack import manifestcheck, site

MARKER = "replaced-by-argocd-site"
LOOPBACK = {
    "repoURL": "git://127.0.0.1:9418/gpugate.git",
    "revision": "e2e",
    "chartRepoURL": "http://127.0.0.1:8879",
    "grafanaURL": "http://127.0.0.1:3000/d/gpugate-overview/gpugate",
    "runbookURL": "http://127.0.0.1:8080/docs/gitops.md",
    "notifyRecipients": "e2e-channel",
}


def _render(root: Path) -> list[dict]:
    return manifestcheck.kustomize(root / "bootstrap") + manifestcheck.kustomize(root / "apps")


def _assert_follows(objects: list[dict], values: dict[str, str]) -> None:
    text = yaml.safe_dump_all(objects)
    assert MARKER not in text, "a marker was not replaced"
    for obj in objects:
        annotations = obj["metadata"].get("annotations", {})
        subscriptions = {k: v for k, v in annotations.items() if k.startswith("notifications.argoproj.io/")}
        assert subscriptions and set(subscriptions.values()) == {values["notifyRecipients"]}, obj["metadata"]["name"]
        assert all(k.endswith(".gpugate") for k in subscriptions), "the notification service is `gpugate`"
        if obj["kind"] == "AppProject":
            assert obj["spec"]["sourceRepos"] == [values["repoURL"], values["chartRepoURL"]]
            continue
        assert annotations["link.argocd.argoproj.io/grafana"] == values["grafanaURL"]
        for source in sources(obj):
            if source.get("chart"):
                assert source["repoURL"] == values["chartRepoURL"] and source["targetRevision"].startswith("v")
            else:
                assert (source["repoURL"], source["targetRevision"]) == (values["repoURL"], values["revision"])
    [operator] = [o for o in objects if o["metadata"]["name"] == "gpu-operator"]
    assert operator["metadata"]["annotations"]["link.argocd.argoproj.io/runbook"] == values["runbookURL"]


def _site_values(loaded: site.Site) -> dict[str, str]:
    return {"repoURL": loaded.repo_url, "revision": loaded.revision, "chartRepoURL": loaded.chart_repo_url,
            "grafanaURL": loaded.grafana_url, "runbookURL": loaded.runbook_url,
            "notifyRecipients": loaded.notify_recipients}


def test_every_argo_object_takes_its_urls_from_the_site_file():
    _assert_follows(_render(ARGOCD), _site_values(SITE))


def test_the_raw_application_files_hold_markers_not_urls():
    """Nothing to search and replace: the old `grep | xargs sed` also rewrote health-check fixtures."""
    for path in sorted((ARGOCD / "apps").glob("*.yaml")) + [ARGOCD / "bootstrap" / "root.yaml",
                                                           ARGOCD / "project" / "gpugate-project.yaml"]:
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") not in ("Application", "AppProject"):
            continue
        text = yaml.safe_dump(doc)
        assert MARKER in text and "example" not in text and "nvidia.com/nvidia" not in text, path.name


def test_a_fork_changes_one_file_and_everything_follows(tmp_path):
    """The Argo CD e2e tests' way: a loopback git daemon and Helm repository, set in site.yaml only."""
    root = tmp_path / "argocd"
    shutil.copytree(ARGOCD, root)
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    site_file = root / "site" / "site.yaml"
    doc = yaml.safe_load(site_file.read_text())
    doc["data"].update(LOOPBACK)
    site_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert site.load(tmp_path) == site.Site(repo_url=LOOPBACK["repoURL"], revision="e2e",
                                            chart_repo_url=LOOPBACK["chartRepoURL"],
                                            grafana_url=LOOPBACK["grafanaURL"], runbook_url=LOOPBACK["runbookURL"],
                                            notify_recipients="e2e-channel")
    objects = _render(root)
    _assert_follows(objects, LOOPBACK)
    text = yaml.safe_dump_all(objects)
    for old in _site_values(SITE).values():
        if old not in LOOPBACK.values() and old != "main":
            assert old not in text, old


def test_the_stack_tool_renders_the_chart_from_the_site_chart_repository(tmp_path, monkeypatch):
    from webhook.stack import chartrender, upgrade

    monkeypatch.delenv(chartrender.CHART_REPO_ENV, raising=False)
    (tmp_path / "argocd" / "site").mkdir(parents=True)
    doc = yaml.safe_load((ARGOCD / "site" / "site.yaml").read_text())
    doc["data"]["chartRepoURL"] = "http://127.0.0.1:8879"
    (tmp_path / "argocd" / "site" / "site.yaml").write_text(yaml.safe_dump(doc))
    settings = upgrade.chart_settings(tmp_path, helm=None, chart_repo=None, skip=True)
    assert settings.repo_url == "http://127.0.0.1:8879" and settings.skip_reason == "--skip-chart-render"
    assert upgrade.chart_settings(tmp_path, helm=None, chart_repo="file:///charts", skip=True).repo_url == \
        "file:///charts"


@pytest.mark.parametrize(("change", "says"), [
    (lambda d: d["data"].pop("repoURL"), "data.repoURL missing"),
    (lambda d: d["data"].update(repoUrl="x"), "unknown key(s) data.repoUrl"),
    (lambda d: d["metadata"].update(name="other"), "expected the ConfigMap gpugate-site"),
])
def test_a_broken_site_file_is_refused_with_the_key_named(change, says):
    doc = yaml.safe_load((ARGOCD / "site" / "site.yaml").read_text())
    change(doc)
    with pytest.raises(GpugateError, match=None) as err:
        site.Site.from_yaml(yaml.safe_dump(doc))
    assert says in str(err.value)


def test_the_site_object_never_reaches_the_cluster():
    """A kustomize local-config object: it steers the build and is not in its output."""
    assert not [o for o in kustomize(ARGOCD / "apps") + kustomize(ARGOCD / "bootstrap") if o["kind"] == "ConfigMap"]
