"""Argo CD syncs gpugate's chart and stays Synced: no permanent OutOfSync.

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
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.e2e.chart_argocd_rig import (
    DESTINATION,
    apply_application,
    chart_application,
    explain,
    get_app,
    hard_refreshes,
    rig,
    wait_synced,
)
from tests.e2e.webhook_fixture import GpugateServer
from webhook.localcluster.fakekubelet import COMPLETE_AFTER

__all__ = ["rig"]  # the module-scoped Argo CD rig (tests/e2e/chart_argocd_rig.py), used here as a fixture

Obj = dict[str, Any]


def _application(rig: dict[str, Any]) -> Obj:
    server: GpugateServer = rig["server"]
    values = {
        "tls": {"mode": "external", "builtin": {"podLabels": {COMPLETE_AFTER: "1"}}},
        "webhook": {"url": server.base_url, "caBundle": base64.b64encode(server.ca.read_bytes()).decode()},
    }
    return chart_application(rig, values=values)


@pytest.fixture(scope="module")
def synced(rig: dict[str, Any]) -> Obj:
    """The Application applied (with the `default` AppProject) and its first sync done."""
    apply_application(rig, _application(rig))
    return wait_synced(rig, timeout=300)


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
    seen = [(state.sync, out) for state, out in hard_refreshes(rig, pause=5)]
    assert seen == [("Synced", [])] * 3, f"{seen}\n{explain(rig)}"
    # No self-heal sync happened meanwhile: the last operation is still the first sync.
    assert get_app(rig)["status"]["operationState"]["startedAt"] == synced["status"]["operationState"]["startedAt"]
