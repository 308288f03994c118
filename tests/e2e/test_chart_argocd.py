"""Argo CD syncs gpugate's chart and stays Synced (issue 29): no permanent OutOfSync.

A real Argo CD v3.2.11 (``argocd_harness``: redis, repo server, application controller on
127.0.0.1) renders manifests/chart/gpugate from a fork of this working tree served by a loopback
git daemon, with ``helm template`` as its repo server runs it, applies it to the e2e control plane
and compares it with what the API server stored. Hard refreshes after the sync must find nothing
to sync: a field the chart renders that the API server or a controller rewrites (a defaulted
value written differently, a caBundle a controller fills, a render-time certificate) would show
here as OutOfSync. `helm test` hooks must not be applied (Argo CD ignores that hook kind).

Values: the webhook is reached by URL (``tls.mode: external``: the server runs on this machine and
nothing in this cluster runs containers); the balancer's certificate Job, an Argo CD Sync hook, is
completed by the fake kubelet (its pods carry the ``e2e.gpugate.io/complete-after`` label through
``tls.builtin.podLabels``), so the sync operation can finish.
"""

from __future__ import annotations

import base64
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
from tests.e2e.cluster import Cluster, Nodes
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import GpugateServer, ServingCerts
from tests.prerequisites import missing
from webhook.localcluster.fakekubelet import COMPLETE_AFTER

ROOT = Path(__file__).resolve().parents[2]
APP = "gpugate-chart"
DESTINATION = "gpugate-argo"
CONTROLLER_ARGS = ("--app-resync", "15", "--app-resync-jitter", "0",
                   "--self-heal-backoff-timeout-seconds", "1", "--self-heal-backoff-factor", "1")

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def rig(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if cluster.plane is None:
        pytest.skip("the webhook runs on this machine's 127.0.0.1; an attached cluster cannot call it")
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
        _delete_app(custom)
        argocd.stop()
        daemon.stop()
        server.stop()
        nodes.remove_all()


def _delete_app(custom: client.CustomObjectsApi) -> None:
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


def _application(rig: dict[str, Any]) -> Obj:
    server: GpugateServer = rig["server"]
    values = {
        "tls": {"mode": "external", "builtin": {"podLabels": {COMPLETE_AFTER: "1"}}},
        "webhook": {"url": server.base_url, "caBundle": base64.b64encode(server.ca.read_bytes()).decode()},
    }
    return {
        "apiVersion": f"{harness.GROUP}/{harness.VERSION}", "kind": "Application",
        "metadata": {"name": APP, "namespace": harness.NAMESPACE,
                     "finalizers": ["resources-finalizer.argocd.argoproj.io"]},
        "spec": {
            "project": "default",
            "source": {"repoURL": rig["repo"], "targetRevision": "HEAD", "path": "manifests/chart/gpugate",
                       "helm": {"releaseName": "gpugate", "valuesObject": values}},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": DESTINATION},
            "syncPolicy": {"automated": {"prune": True, "selfHeal": True}, "syncOptions": ["CreateNamespace=true"]},
        },
    }


def _app(rig: dict[str, Any]) -> Obj:
    return rig["custom"].get_namespaced_custom_object(harness.GROUP, harness.VERSION, harness.NAMESPACE,
                                                      "applications", APP)


def _explain(rig: dict[str, Any]) -> str:
    try:
        app = _app(rig)
    except ApiException as error:
        return f"no Application: {error.status}"
    status = app.get("status") or {}
    unsynced = [f"{r.get('kind')}/{r.get('name')}: {r.get('status')} {(r.get('health') or {}).get('status')}"
                for r in status.get("resources") or [] if not r.get("hook") and r.get("status") != "Synced"
                or (r.get("health") or {}).get("status") not in (None, "Healthy")]
    return (f"{harness.AppState.of(app)}\nconditions: {json.dumps(status.get('conditions'))}\n"
            f"not synced or not healthy: {unsynced}\n{rig['argocd'].logs_tail()}")


@pytest.fixture(scope="module")
def synced(rig: dict[str, Any]) -> Obj:
    """The AppProject Argo CD's install makes (argocd-server creates `default`; no server runs here),
    the Application, and its first sync done."""
    rig["kubectl"].apply_objects([{
        "apiVersion": f"{harness.GROUP}/{harness.VERSION}", "kind": "AppProject",
        "metadata": {"name": "default", "namespace": harness.NAMESPACE},
        "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}],
                 "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]},
    }, _application(rig)])

    def done() -> Obj | None:
        app = _app(rig)
        state = harness.AppState.of(app)
        return app if (state.sync, state.health, state.phase) == ("Synced", "Healthy", "Succeeded") else None

    return wait_until(done, timeout=300, interval=1, what="Argo CD to sync the chart to Synced and Healthy",
                      explain=lambda: _explain(rig))


def hard_refresh(rig: dict[str, Any]) -> Obj:
    """Ask for a hard refresh (re-render with no cache, compare again) and return the Application
    once the controller has reconciled it."""
    before = (_app(rig).get("status") or {}).get("reconciledAt")
    hard = {"metadata": {"annotations": {harness.REFRESH_ANNOTATION: "hard"}}}
    rig["custom"].patch_namespaced_custom_object(harness.GROUP, harness.VERSION, harness.NAMESPACE, "applications",
                                                 APP, hard)

    def reconciled() -> Obj | None:
        app = _app(rig)
        pending = harness.REFRESH_ANNOTATION in (app["metadata"].get("annotations") or {})
        return app if not pending and (app.get("status") or {}).get("reconciledAt") != before else None

    return wait_until(reconciled, timeout=120, interval=0.5, what="the hard refresh to be reconciled",
                      explain=lambda: _explain(rig))


def test_argo_cd_syncs_the_chart_to_synced_and_healthy(synced: Obj, rig: dict[str, Any]) -> None:
    kinds = {(r["kind"], r["name"]) for r in synced["status"]["resources"]}
    assert {("Deployment", "gpugate-webhook"), ("Deployment", "gpugate-balancer"),
            ("MutatingWebhookConfiguration", "gpugate-webhook"),
            ("ValidatingWebhookConfiguration", "gpugate-webhook")} <= kinds
    stored = client.AdmissionregistrationV1Api(rig["cluster"].api_client()).read_mutating_webhook_configuration(
        "gpugate-webhook")
    assert stored.webhooks[0].client_config.url == rig["server"].base_url + "/mutate"


def test_helm_test_hooks_are_not_applied(synced: Obj, rig: dict[str, Any]) -> None:
    core = rig["cluster"].core()
    for read in (lambda: core.read_namespace("gpugate-smoke"), lambda: core.read_namespaced_pod("gpugate-smoke",
                                                                                                 DESTINATION)):
        with pytest.raises(ApiException) as error:
            read()
        assert error.value.status == 404
    assert not [r for r in synced["status"]["resources"] if r["name"].startswith("gpugate-smoke")]


def test_hard_refreshes_after_the_sync_find_nothing_out_of_sync(synced: Obj, rig: dict[str, Any]) -> None:
    """Each hard refresh re-renders the chart (no cache) and compares again; three in a row, and a
    resync period in between, stay Synced with no resource OutOfSync."""
    seen = []
    for _ in range(3):
        app = hard_refresh(rig)
        state = harness.AppState.of(app)
        # Sync hooks (the certificate Job) are run, not compared: Argo CD lists them without a sync status.
        out = [f"{r['kind']}/{r['name']}" for r in app["status"]["resources"]
               if not r.get("hook") and r.get("status") != "Synced"]
        seen.append((state.sync, out))
        time.sleep(5)
    assert seen == [("Synced", [])] * 3, f"{seen}\n{_explain(rig)}"
    # No self-heal sync happened meanwhile: the last operation is still the first sync.
    assert _app(rig)["status"]["operationState"]["startedAt"] == synced["status"]["operationState"]["startedAt"]
