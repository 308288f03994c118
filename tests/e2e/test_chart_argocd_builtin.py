"""Argo CD syncs gpugate's chart with its DEFAULT TLS (``tls.mode: builtin``) and stays Synced.

The chart's default lets the webhook's certificate Job (an Argo CD Sync hook) run ``gpugate certs
--patch-webhooks``, which writes both webhook configurations' caBundle in the cluster: a field
Git never holds. The Application carries the ``ignoreDifferences`` rule and
``RespectIgnoreDifferences=true`` that docs/deploy.md and the chart README prescribe, read from the
project's own Application for the webhook (argocd/apps/gpugate-webhook.yaml), not retyped.

Nothing in this cluster runs containers, so each certificate Job's pod is run on this machine as its kubelet
would (tests/e2e/hostpod.py): its own command and args, with a token bound to the pod for its
ServiceAccount, so gpugate's own code and the chart's RBAC write the caBundle. Then hard refreshes
must find the Application Synced and Healthy with no self-heal sync and the caBundle kept. Without
the rule the same state is still Synced (see the last test: the rule guards, it is not required).
Argo CD's rig, the Git fork and the helpers are tests/e2e/chart_argocd_rig.py's.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e import argocd_harness as harness
from tests.e2e import hostpod
from tests.e2e.chart_argocd_rig import (
    APP,
    DESTINATION,
    ROOT,
    apply_application,
    chart_application,
    explain,
    get_app,
    hard_refresh,
    hard_refreshes,
    out_of_sync,
    rig,
    wait_synced,
)
from tests.e2e.waiting import wait_until

__all__ = ["rig"]  # the module-scoped Argo CD rig, used here as a fixture

WEBHOOK_APP = ROOT / "argocd" / "apps" / "gpugate-webhook.yaml"
CONFIGURATION = "gpugate-webhook"

Obj = dict[str, Any]


def shipped_rule() -> tuple[list[Obj], list[str]]:
    """The caBundle rule and the sync options as the project ships them for the webhook's Application."""
    spec = yaml.safe_load(WEBHOOK_APP.read_text())["spec"]
    assert "RespectIgnoreDifferences=true" in spec["syncPolicy"]["syncOptions"]
    return list(spec["ignoreDifferences"]), list(spec["syncPolicy"]["syncOptions"])


def _application(rig: dict[str, Any]) -> Obj:
    """The chart with its default values (builtin TLS), and the shipped caBundle rule."""
    ignore, options = shipped_rule()
    return chart_application(rig, sync_options=options, ignore=ignore)


def _ca_bundles(cluster: Any) -> dict[str, bytes | None]:
    api = client.AdmissionregistrationV1Api(cluster.api_client())
    found: dict[str, bytes | None] = {}
    for kind, read in (("Mutating", api.read_mutating_webhook_configuration),
                       ("Validating", api.read_validating_webhook_configuration)):
        for hook in read(CONFIGURATION).webhooks or []:
            bundle = hook.client_config.ca_bundle
            found[f"{kind}/{hook.name}"] = base64.b64decode(bundle) if bundle else None
    return found


def _running_pod(rig: dict[str, Any], name: str) -> Obj:
    """The started pod of the Sync-hook Job whose pods carry ``app.kubernetes.io/name: name``."""
    core = rig["cluster"].core()

    def running() -> Obj | None:
        pods = core.list_namespaced_pod(DESTINATION, label_selector=f"app.kubernetes.io/name={name}").items
        started = [p for p in pods if p.status.phase == "Running"]
        return rig["cluster"].api_client().sanitize_for_serialization(started[0]) if started else None

    return wait_until(running, timeout=120, interval=0.5, what=f"the {name} Job's pod to be started",
                      explain=lambda: explain(rig))


@pytest.fixture(scope="module")
def builtin_synced(rig: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Obj:
    """The first sync, with the certificate Job's pod run here; the Application once it is done."""
    apply_application(rig, _application(rig))
    # Both Sync hooks run `gpugate certs` (the webhook's patches the caBundles; the balancer's makes its Secret).
    for job in ("gpugate-certs", "gpugate-balancer-certs"):
        ran = hostpod.run(rig["cluster"], _running_pod(rig, job), Path(tmp_path_factory.mktemp(job)))
        assert ran.exit_code == 0, ran.output

    return wait_synced(rig, timeout=120)


def test_hard_refreshes_keep_the_certs_jobs_ca_bundle_synced(builtin_synced: Obj, rig: dict[str, Any]) -> None:
    """gpugate certs wrote the Secret's CA into both configurations; three hard refreshes stay
    Synced and Healthy, no self-heal sync runs, and the caBundle is never reverted."""
    core = rig["cluster"].core()
    ca = base64.b64decode(core.read_namespaced_secret("gpugate-webhook-tls", DESTINATION).data["ca.crt"])
    written = _ca_bundles(rig["cluster"])
    assert set(written) == {"Mutating/mutate.gpugate.io", "Validating/validate.gpugate.io"}
    assert set(written.values()) == {ca}, written
    seen = [(state.sync, state.health, out) for state, out in hard_refreshes(rig, pause=2)]
    assert seen == [("Synced", "Healthy", [])] * 3, f"{seen}\n{explain(rig)}"
    assert get_app(rig)["status"]["operationState"]["startedAt"] == builtin_synced["status"]["operationState"][
        "startedAt"], "a self-heal sync ran"
    assert _ca_bundles(rig["cluster"]) == written


def test_without_the_rule_the_same_state_is_still_synced(builtin_synced: Obj, rig: dict[str, Any]) -> None:
    """Found, not assumed: compared without ``ignoreDifferences`` (automated sync off, so nothing
    rewrites it) the same live state is still Synced. The chart renders no caBundle, and a field
    absent from the render and written by another field manager (`gpugate certs`) is not drift for
    Argo CD v3.2.11, with the shipped sync options (ServerSideApply=true) as with the default
    three-way diff (checked by hand). The rule is a guard, not what keeps the chart Synced; this
    fails the day Argo CD starts flagging the caBundle, and the rule then becomes required."""
    rig["custom"].patch_namespaced_custom_object(
        harness.GROUP, harness.VERSION, harness.NAMESPACE, "applications", APP,
        {"spec": {"ignoreDifferences": None, "syncPolicy": {"automated": None}}})
    app = hard_refresh(rig)
    assert not get_app(rig)["spec"].get("ignoreDifferences")
    out = sorted(out_of_sync(app))
    assert (harness.AppState.of(app).sync, out) == ("Synced", []), explain(rig)
    assert set(_ca_bundles(rig["cluster"]).values()) != {None}
