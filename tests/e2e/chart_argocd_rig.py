"""The Argo CD rig the chart's e2e modules share: Argo CD, a git fork of this tree, gpugate serving here.

``rig`` (module-scoped fixture) starts a real Argo CD v3.2.11 (``argocd_harness``) against the e2e
control plane, a loopback git daemon serving a fork of this working tree, and ``gpugate serve``
on 127.0.0.1; ``chart_application`` is the Application of manifests/chart/gpugate each module
varies (values, sync options, ignoreDifferences); ``apply_application`` applies it with the
``default`` AppProject, ``wait_synced`` waits for Synced and Healthy, ``hard_refresh`` compares again
(``hard_refreshes`` three times, with ``out_of_sync`` what differs).
Used by test_chart_argocd.py and test_chart_argocd_builtin.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.e2e import argocd_harness as harness
from tests.e2e import gitops_binaries
from tests.e2e.argocd_gitops import fork_of_worktree
from tests.e2e.local import require_local
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import GpugateServer, ServingCerts
from tests.prerequisites import missing
from webhook.localcluster.cluster import Cluster, Nodes

ROOT = Path(__file__).resolve().parents[2]
APP = "gpugate-chart"
DESTINATION = "gpugate-argo"
CONTROLLER_ARGS = ("--app-resync", "15", "--app-resync-jitter", "0",
                   "--self-heal-backoff-timeout-seconds", "1", "--self-heal-backoff-factor", "1")

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def rig(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_local(cluster)
    assert cluster.plane is not None
    found = gitops_binaries.paths()
    if found is None:
        missing("Argo CD, helm and kustomize are not built: `python -m tests.e2e.gitops_binaries build`")
    workdir = tmp_path_factory.mktemp("chart-argocd")
    nodes = Nodes(cluster)
    nodes.cpu()
    nodes.cpu()
    certs = ServingCerts(workdir / "certs")
    server = GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca, policies=ROOT / "policies",
                           log=cluster.plane.logs / "gpugate-chart-argocd-serve.log")
    server.start()
    kubectl = harness.Kubectl(cluster.kubeconfig)
    harness.install_crds(kubectl)
    harness.install_settings(kubectl)
    (workdir / "git").mkdir()
    daemon = harness.GitDaemon(workdir / "git", workdir).start()
    fork_of_worktree(ROOT, workdir / "git" / "gpugate")
    argocd = harness.ArgoCD(kubeconfig=cluster.kubeconfig, workdir=workdir / "argocd", binaries=found,
                            controller_args=CONTROLLER_ARGS)
    custom = client.CustomObjectsApi(cluster.api_client())
    try:
        argocd.start()
        yield {"cluster": cluster, "argocd": argocd, "custom": custom, "server": server,
               "repo": daemon.url("gpugate"), "kubectl": kubectl}
    finally:
        delete_app(custom)
        argocd.stop()
        daemon.stop()
        server.stop()
        nodes.remove_all()


def delete_app(custom: client.CustomObjectsApi) -> None:
    """Delete the Application; its finalizer makes Argo CD delete what it applied first."""
    try:
        custom.delete_namespaced_custom_object(harness.GROUP, harness.VERSION, harness.NAMESPACE, "applications", APP)
    except ApiException as error:
        if error.status != 404:
            raise
        return
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            custom.get_namespaced_custom_object(harness.GROUP, harness.VERSION, harness.NAMESPACE, "applications", APP)
        except ApiException as error:
            if error.status == 404:
                return
        time.sleep(0.5)


def chart_application(rig: dict[str, Any], *, values: Obj | None = None,
                      sync_options: list[str] | None = None, ignore: list[Obj] | None = None) -> Obj:
    """The Application of manifests/chart/gpugate from the rig's fork, synced automatically into DESTINATION."""
    helm: Obj = {"releaseName": "gpugate"}
    if values is not None:
        helm["valuesObject"] = values
    spec: Obj = {
        "project": "default",
        "source": {"repoURL": rig["repo"], "targetRevision": "HEAD", "path": "manifests/chart/gpugate",
                   "helm": helm},
        "destination": {"server": "https://kubernetes.default.svc", "namespace": DESTINATION},
        "syncPolicy": {"automated": {"prune": True, "selfHeal": True},
                       "syncOptions": sync_options if sync_options is not None else ["CreateNamespace=true"]},
    }
    if ignore is not None:
        spec["ignoreDifferences"] = ignore
    return {
        "apiVersion": f"{harness.GROUP}/{harness.VERSION}", "kind": "Application",
        "metadata": {"name": APP, "namespace": harness.NAMESPACE,
                     "finalizers": ["resources-finalizer.argocd.argoproj.io"]},
        "spec": spec,
    }


def apply_application(rig: dict[str, Any], application: Obj) -> None:
    """The AppProject Argo CD's install makes (argocd-server creates `default`; no server runs here),
    and the Application."""
    rig["kubectl"].apply_objects([{
        "apiVersion": f"{harness.GROUP}/{harness.VERSION}", "kind": "AppProject",
        "metadata": {"name": "default", "namespace": harness.NAMESPACE},
        "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}],
                 "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]},
    }, application])


def wait_synced(rig: dict[str, Any], *, timeout: float) -> Obj:
    """The Application once its sync operation succeeded and it is Synced and Healthy."""

    def done() -> Obj | None:
        app = get_app(rig)
        state = harness.AppState.of(app)
        return app if (state.sync, state.health, state.phase) == ("Synced", "Healthy", "Succeeded") else None

    return wait_until(done, timeout=timeout, interval=1, what="Argo CD to sync the chart to Synced and Healthy",
                      explain=lambda: explain(rig))


def get_app(rig: dict[str, Any]) -> Obj:
    return rig["custom"].get_namespaced_custom_object(harness.GROUP, harness.VERSION, harness.NAMESPACE,
                                                      "applications", APP)


def explain(rig: dict[str, Any]) -> str:
    try:
        app = get_app(rig)
    except ApiException as error:
        return f"no Application: {error.status}"
    status = app.get("status") or {}
    unsynced = [f"{r.get('kind')}/{r.get('name')}: {r.get('status')} {(r.get('health') or {}).get('status')}"
                for r in status.get("resources") or [] if not r.get("hook") and r.get("status") != "Synced"
                or (r.get("health") or {}).get("status") not in (None, "Healthy")]
    return (f"{harness.AppState.of(app)}\nconditions: {json.dumps(status.get('conditions'))}\n"
            f"not synced or not healthy: {unsynced}\n{rig['argocd'].logs_tail()}")


def hard_refresh(rig: dict[str, Any]) -> Obj:
    """Ask for a hard refresh (re-render with no cache, compare again) and return the Application
    once the controller has reconciled it."""
    before = (get_app(rig).get("status") or {}).get("reconciledAt")
    hard = {"metadata": {"annotations": {harness.REFRESH_ANNOTATION: "hard"}}}
    rig["custom"].patch_namespaced_custom_object(harness.GROUP, harness.VERSION, harness.NAMESPACE, "applications",
                                                 APP, hard)

    def reconciled() -> Obj | None:
        app = get_app(rig)
        pending = harness.REFRESH_ANNOTATION in (app["metadata"].get("annotations") or {})
        return app if not pending and (app.get("status") or {}).get("reconciledAt") != before else None

    return wait_until(reconciled, timeout=120, interval=0.5, what="the hard refresh to be reconciled",
                      explain=lambda: explain(rig))


def out_of_sync(app: Obj) -> list[str]:
    """``Kind/name`` of each compared resource that is not Synced. Sync hooks (the certificate Jobs)
    are run, not compared: Argo CD lists them without a sync status, so they are left out."""
    return [f"{r['kind']}/{r['name']}" for r in app["status"]["resources"]
            if not r.get("hook") and r.get("status") != "Synced"]


def hard_refreshes(rig: dict[str, Any], *, times: int = 3, pause: float) -> list[tuple[harness.AppState, list[str]]]:
    """The Application's state and its out-of-sync resources after each of ``times`` hard refreshes,
    ``pause`` seconds apart (a resync period may pass in between)."""
    seen = []
    for _ in range(times):
        app = hard_refresh(rig)
        seen.append((harness.AppState.of(app), out_of_sync(app)))
        time.sleep(pause)
    return seen
