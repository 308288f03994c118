"""Argo CD for real: a Git commit upgrades the GPU stack, end to end, on the e2e cluster.

Argo CD v3.2.11 built from its Go module (redis, repo server, application controller, API
server on 127.0.0.1, ``argocd_harness``) syncs ``argocd/`` from a fork of this repository
(the working tree, pointed at a loopback git daemon and a loopback copy of NVIDIA's chart
repository through ``argocd/site/site.yaml``, ``argocd_gitops``), with ``argocd-cm`` patched by
``argocd/install/argocd-cm-health.yaml`` exactly as docs/gitops.md says. No GPU Operator runs
(its module is not served), but its driver upgrade state machine does: NVIDIA's
k8s-operator-libs ``pkg/upgrade`` in ``gpu-upgrade-controller`` (``argocd_upgrades``) writes the
node upgrade labels, cordons, drains and restarts driver pods; ``argocd_standin`` writes what the
operator's other controllers write (driver DaemonSets, ownership, ClusterPolicy and NVIDIADriver
status); the fake kubelet gives pods a lifecycle and crash-loops the bad driver's image
(``argocd_env.POD_LIFECYCLE``). The certificate Sync-hook Job runs the real ``gpugate certs`` as
its ServiceAccount (``argocd_jobs``).

The tests share one rig and run in order, each starting from where the previous one left the
stack:

1. first install: every wave in order, every child Synced and Healthy, the root too; the
   webhook (the real ``gpugate serve`` on the webhook Service's ClusterIP, as the API server
   dials it) shapes a GPU pod; no app is ever Degraded (test 1b);
2. ``gpugate stack upgrade --pool canary``: OutOfSync, Syncing, Progressing while the library
   rolls the pool one node at a time (GPU pods drained under a PDB and rescheduled), Healthy;
   ``gpugate stack canary --commit`` promotes; the default pool rolls within maxParallelUpgrades
   and an admin's cordon is kept; ``gpugate stack status --kube`` agrees with the cluster;
3. a driver that crash-loops: the library marks its canary node upgrade-failed, Argo CD shows
   Progressing, ``status --kube`` names the node, ``promote`` refuses, ``gpugate stack canary
   --commit`` rolls back, and the documented node retry brings the pool back to Healthy;
4. drift: a hand edit is reverted by self-heal, the caBundle written by ``gpugate certs`` is not
   drift;
5. the dashboard: the UI cannot be built here (reason asserted), so every step's application
   list and resource trees are rendered from argocd-server's API as Markdown.

What a real Argo CD showed that the Lua tests and schemas missed: a multi-source Application's
``status.sync.comparedTo`` always carries ``source: {repoURL: ""}`` (a Go struct is never
omitted), so our Application health check called gpu-operator stale forever and the root never
turned Healthy (fixed in argocd/health/argoproj.io/Application, fixture
``healthy_multiSourceZeroSource.yaml``); and Argo CD's built-in CRD health made gpu-operator
(and the root) Degraded on a first install while a new CRD was being established, until the next
resync (fixed by argocd/health/apiextensions.k8s.io/CustomResourceDefinition; test 1b).

Network: everything listens on 127.0.0.1 (the control plane, its loopback Service network,
redis, the repo server, argocd-server, git daemon, the chart repository, ``gpugate serve``)
except one listener we cannot move: argocd-application-controller serves its metrics and
healthz on ``0.0.0.0:<--metrics-port>`` (controller/appcontroller.go:319 in v3.2.11 formats
``"0.0.0.0:%d"``; there is no address flag). Accepted: a random port, metrics and health only,
for the few minutes the module runs (run it inside ``unshare -n`` where even that is not allowed).

Run: ``python -m pytest tests/e2e/test_argocd.py -q -n 0`` (needs ``python -m tests.e2e.binaries build``,
``python -m tests.e2e.gitops_binaries build``, ``redis-server``, ``git`` and ``kubectl``). The
rig's folder (``gpugate-argocd-*`` in the system temp folder, printed at the end) keeps every log,
the fork and the dashboard when a test failed or with ``GPUGATE_E2E_KEEP``; otherwise only the
dashboard.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e import argocd_harness as harness
from tests.e2e.argocd_dashboard import ui_unavailable_reason
from tests.e2e.argocd_env import (
    BAD_DRIVER,
    OPERATOR_NAMESPACE,
    POOL_LABEL,
    ROOT_APP,
    SYSTEM_NAMESPACE,
    WEBHOOK,
    GitOpsRig,
    ca_bundles,
    healthy,
    restore_client_config,
    rig_binaries,
    serve_webhook_on_service,
    with_loopback_url,
)
from tests.e2e.argocd_gitops import changed_files, driver_states, pool_counts, yaml_value
from tests.e2e.argocd_standin import DRIVER_VERSION_LABEL, STATE_LABEL
from tests.e2e.argocd_upgrades import (
    IN_PLACE_STEPS,
    NOT_UPGRADING,
    in_order,
    ready_workload_pods,
    start_gpu_workload,
)
from tests.e2e.local import own_control_plane
from tests.e2e.namespaces import has_default_account
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import (
    GpugateServer,
    ServingCerts,
    create_pod,
    gpu_tolerations,
    pod_manifest,
    policy_of,
)
from webhook.localcluster.cluster import Cluster

Obj = dict[str, Any]
OPERATOR = "v26.7.0"
CANARY_DRIVER = "610.57.04"  # validated for v26.7.0 (webhook/stack/data/matrix.yaml)
# BAD_DRIVER (argocd_env): published and in a branch v26.7.0 validated, but older than the canary's
# 610.57.04 after test 2 (no newer 610 driver is published): the commit takes --allow-driver-downgrade.
# Its image crash-loops in the fake kubelet (argocd_env.POD_LIFECYCLE).
RETRY_COMMAND = "kubectl label node {node} nvidia.com/gpu-driver-upgrade-state=upgrade-required --overwrite"


# --- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A control plane of this module's own, its Service network on loopback (a random
    ``127.x.y.0/24``): the webhook configurations Argo CD applies point at a Service, and the API
    server dials a Service's ClusterIP; on the session's plane that is a 10.x address, which is
    not on this machine (what answers there is whatever the network has: a proxy presented a
    certificate for archive.ubuntu.com). Here the webhook calls stay on loopback, and the real
    ``gpugate serve`` can take them on the ClusterIP (test 1). Overrides conftest's ``cluster``
    for this module, so its failure report still shows the control plane's logs."""
    cidr = f"127.{secrets.randbelow(180) + 64}.{secrets.randbelow(256)}.0/24"
    with own_control_plane("these tests need a control plane of their own (loopback Service network)",
                           service_cidr=cidr) as started:
        yield started


@pytest.fixture(scope="module")
def rig(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[GitOpsRig]:
    """The rig, in a folder of its own under the system temp folder (not pytest's tmp_path: other
    pytest runs on a shared machine rotate those away). Kept when a test failed or with
    ``GPUGATE_E2E_KEEP``; otherwise only its ``dashboard/`` (the Markdown snapshots) is kept."""
    found = rig_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="gpugate-argocd-"))
    failed_before = request.session.testsfailed
    started = GitOpsRig(cluster, workdir, found)
    try:
        started.start()
        yield started
    finally:
        if started.dashboard is not None and started.dashboard.snapshots:
            started.dashboard.index()
        started.stop()
        keep = bool(os.environ.get("GPUGATE_E2E_KEEP")) or request.session.testsfailed > failed_before
        if not keep:
            for child in workdir.iterdir():
                if child.is_dir() and child.name != "dashboard":
                    shutil.rmtree(child, ignore_errors=True)
                elif child.is_file():
                    child.unlink()
        print(f"\nArgo CD rig: start steps {started.timings} s; "
              f"{'logs, fork and dashboard' if keep else 'dashboard'} kept in {workdir}", file=sys.stderr)


@dataclass
class Install:
    started: float
    seconds: float = 0.0
    error: str | None = None


@dataclass
class Findings:
    """What one test saw that a later one (or the report) reads."""

    notes: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def findings() -> Findings:
    return Findings()


def children_ready(rig: GitOpsRig, revision: str | None = None) -> Callable[[dict[str, harness.AppState]], bool]:
    """Every child Synced and Healthy and the root Synced with no operation running. The root's own
    health is asserted by test 1 only (it is the Application health check's verdict)."""
    def ready(states: dict[str, harness.AppState]) -> bool:
        root = states.get(ROOT_APP)
        return (healthy(states, tuple(rig.waves), revision) and root is not None and root.sync == "Synced"
                and root.phase != "Running")
    return ready


@pytest.fixture(scope="module")
def install(rig: GitOpsRig) -> Install:
    """docs/gitops.md bootstrap step 3, then wait for every child: the first install."""
    result = Install(started=time.monotonic())
    rig.bootstrap()
    try:
        rig.wait(children_ready(rig), "every child Application Synced and Healthy after bootstrap",
                 timeout=360, stall=100)
    except AssertionError as error:
        result.error = str(error)
    result.seconds = time.monotonic() - result.started
    rig.timings["install"] = round(result.seconds, 1)
    if result.error is None:  # argocd-server's informer lags the watch by a moment
        wait_until(lambda: api_agrees(rig), timeout=20, interval=0.3, what="argocd-server to show the same states")
    assert rig.dashboard is not None
    rig.dashboard.snapshot("first install" + (" (did not finish)" if result.error else ""))
    return result


def api_agrees(rig: GitOpsRig) -> bool:
    """argocd-server's application list says what the watch says (sync and health of every app)."""
    assert rig.argocd is not None and rig.watch is not None
    listed = {a["metadata"]["name"]: ((a.get("status") or {}).get("sync", {}).get("status"),
                                      (a.get("status") or {}).get("health", {}).get("status"))
              for a in rig.argocd.api_json("/api/v1/applications").get("items") or []}
    return listed == {name: (state.sync, state.health) for name, state in rig.watch.current().items()}


@pytest.fixture
def ready(rig: GitOpsRig, install: Install) -> GitOpsRig:
    """The stack as the previous test left it, all children Synced and Healthy."""
    if install.error:
        pytest.fail("the first install did not finish (test_first_install_* says why)")
    rig.wait(children_ready(rig), "every child Synced and Healthy before this test", timeout=120, stall=60)
    return rig


@pytest.fixture(scope="module")
def webhook_served(rig: GitOpsRig, install: Install) -> Iterator[str]:
    """The real ``gpugate serve`` on the webhook Service from the first test that creates GPU
    workloads to the module's end: validation fails closed and judges Deployments and their pods
    (a namespace's ``gpugate.io/skip`` turns shaping off, never judging), and the Deployment's pods
    are recreated by its ReplicaSet while the upgrades drain the nodes."""
    if install.error:
        pytest.fail("the first install did not finish (test_first_install_* says why)")
    with serve_webhook_on_service(rig) as address:
        yield address


# --- helpers ----------------------------------------------------------------------------------

def first(observations: list[harness.Observation], predicate: Callable[[harness.AppState], bool],
          after: float = 0.0) -> float | None:
    return next((o.at for o in observations if o.state is not None and o.at >= after and predicate(o.state)), None)


def assert_rollout_sequence(rig: GitOpsRig, app: str, since: float, revision: str) -> None:
    """The UI's sequence for ``app`` after a push: OutOfSync, Syncing (operation Running), Progressing,
    then Synced + Healthy at ``revision``."""
    assert rig.watch is not None
    seen = rig.watch.since(since, app)
    out_of_sync = first(seen, lambda s: s.sync == "OutOfSync")
    syncing = first(seen, lambda s: s.phase == "Running")
    progressing = first(seen, lambda s: s.health == "Progressing", after=syncing or since)
    done = first(seen, lambda s: s.sync == "Synced" and s.health == "Healthy" and s.phase != "Running"
                 and s.revision == revision, after=progressing or since)
    timeline = rig.watch.timeline(since, [app])
    assert None not in (out_of_sync, syncing, progressing, done), (
        f"{app}: expected OutOfSync, Syncing, Progressing, Healthy after the push; saw:\n{timeline}")
    assert out_of_sync is not None and syncing is not None and progressing is not None and done is not None
    assert out_of_sync <= progressing < done and syncing <= progressing, f"{app} out of order:\n{timeline}"


def wait_standin(rig: GitOpsRig, predicate: Callable[[dict[str, Any]], bool], what: str,
                 timeout: float = 90) -> dict[str, Any]:
    assert rig.standin is not None
    return wait_until(lambda: (lambda snap: snap if predicate(snap) else None)(rig.standin.snapshot()),
                      timeout=timeout, interval=0.2, what=what, explain=rig.explain)


def pool_states(rig: GitOpsRig, snapshot: dict[str, Any], pool: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in rig.pool(pool):
        state = snapshot[node]["state"] or "(none)"
        counts[state] = counts.get(state, 0) + 1
    return counts


def assert_status_tells_the_truth(rig: GitOpsRig, *, git: dict[str, str], failed: bool = False) -> dict[str, Any]:
    """``gpugate stack status --kube`` against the API, the stand-in frozen so nothing moves between
    the two reads: pools' upgrade-state counts, NVIDIADriver and ClusterPolicy states, the drivers
    Git pins per pool, and exit code 1 exactly when a node failed its upgrade."""
    assert rig.standin is not None and rig.fork is not None
    with rig.standin.frozen():
        code, status = rig.fork.status()
        labels = rig.node_labels()
        truth_drivers = {name: rig.nvidia("nvidiadrivers", name).get("status", {}).get("state", "(no status)")
                         for name in ("default", "canary")}
        truth_policy = rig.nvidia("clusterpolicies", "cluster-policy").get("status", {}).get("state")
    truth_pools: dict[str, dict[str, int]] = {}
    for node, pool in rig.nodes.items():
        state = labels[node].get(STATE_LABEL) or "(none)"
        truth_pools.setdefault(pool, {})
        truth_pools[pool][state] = truth_pools[pool].get(state, 0) + 1
    counts = pool_counts(status)
    assert {p: counts[p] for p in truth_pools} == truth_pools, f"status says {counts}, nodes say {truth_pools}"
    assert {k: v for k, v in driver_states(status).items() if k in truth_drivers} == truth_drivers
    assert [c["state"] for c in status["cluster"]["clusterPolicies"]] == [truth_policy]
    assert {p["name"]: p["driver"] for p in status["git"]["pools"]} == git
    assert code == (1 if failed else 0), f"stack status --kube exited {code} (upgradeFailed: {failed})"
    return status


def tree_health(rig: GitOpsRig, app: str, kind: str, name: str) -> dict[str, str]:
    assert rig.argocd is not None
    tree = rig.argocd.api_json(f"/api/v1/applications/{app}/resource-tree")
    for node in tree.get("nodes") or []:
        if node.get("kind") == kind and node.get("name") == name:
            return dict(node.get("health") or {})
    raise AssertionError(f"{kind} {name} is not in {app}'s resource tree")


def first_healthy(rig: GitOpsRig, app: str) -> float | None:
    assert rig.watch is not None
    return first(rig.watch.since(0.0, app), lambda s: s.sync == "Synced" and s.health == "Healthy"
                 and s.phase != "Running")


def event_time(rig: GitOpsRig, text: str) -> float | None:
    assert rig.standin is not None
    return next((e.at for e in rig.standin.events if text in e.text), None)


# --- 1. first install ---------------------------------------------------------------------------

def test_first_install_syncs_every_wave_in_order_and_the_webhook_shapes_a_gpu_pod(
        rig: GitOpsRig, install: Install) -> None:
    """Bootstrap as documented; the root applies its children wave by wave, each wave only once
    the previous one is Healthy (Argo CD's rule: gitops-engine ``pkg/sync/sync_context.go`` Sync,
    a wave's tasks stay running until Healthy; the root sees a child's health through the
    Application health check in argocd-cm). The GPU Operator's app turns Healthy only after the
    stand-in reported the drivers and the ClusterPolicy ready. This is the test that fails on the
    sync-wave deadlock (NVIDIADrivers in a wave after a ClusterPolicy that waits for them)."""
    assert rig.watch is not None and rig.standin is not None and rig.jobs is not None
    assert install.error is None, f"the first install did not finish:\n{install.error}"

    # Wave order: every Application of wave N+1 was created after all of wave N were Healthy.
    waves = sorted(set(rig.waves.values()))
    for earlier, later in zip(waves, waves[1:], strict=False):
        ready_at = [first_healthy(rig, a) for a, w in rig.waves.items() if w == earlier]
        assert None not in ready_at
        for app in (a for a, w in rig.waves.items() if w == later):
            created = rig.watch.created[app]
            assert created > max(t for t in ready_at if t is not None), (
                f"{app} (wave {later}) was created before wave {earlier} was Healthy:\n"
                f"{rig.watch.timeline(install.started)}")

    # The operator's app was Healthy only once the operator (stand-in) said so.
    operator_healthy = first_healthy(rig, "gpu-operator")
    for event in ("NVIDIADriver default: ready", "NVIDIADriver canary: ready", "ClusterPolicy cluster-policy: ready"):
        at = event_time(rig, event)
        assert at is not None and operator_healthy is not None and at <= operator_healthy, (
            f"gpu-operator Healthy before '{event}'\n{rig.standin.explain()}")

    # Webhook, balancer and scheduler run (as the e2e cluster runs pods: fake kubelet).
    apps = client.AppsV1Api(rig.api)
    deployments = {d.metadata.name: d for d in apps.list_namespaced_deployment(SYSTEM_NAMESPACE).items}
    for name in ("gpugate-webhook", "gpugate-balancer", "gpugate-scheduler"):
        found = [d for n, d in deployments.items() if n.startswith(name)]
        assert found, f"no Deployment {name}* in {SYSTEM_NAMESPACE}: {sorted(deployments)}"
        for deployment in found:
            assert (deployment.status.available_replicas or 0) == deployment.spec.replicas, deployment.status
    operator = apps.read_namespaced_deployment("gpu-operator", OPERATOR_NAMESPACE)
    assert (operator.status.available_replicas or 0) >= 1

    # The certificate hook ran the real `gpugate certs`: Secret made, both caBundles set.
    assert any(r.returncode == 0 and "caBundle patched" in r.output for r in rig.jobs.runs), rig.jobs.describe()
    admission = client.AdmissionregistrationV1Api(rig.api)
    stored = [json.loads(read(WEBHOOK, _preload_content=False).data) for read in
              (admission.read_mutating_webhook_configuration, admission.read_validating_webhook_configuration)]
    assert all(bundle for s in stored for bundle in ca_bundles(s)), "caBundle not set by the certificate Job"

    try:
        with serve_webhook_on_service(rig):
            shaped = _create_gpu_pod(rig)
    except PermissionError:  # port 443 is not ours to bind: the break-glass way instead
        shaped = _webhook_shapes_a_gpu_pod_through_a_url(rig, stored)
        rig.wait(children_ready(rig), "every child Synced and Healthy after the break-glass", timeout=120, stall=60)
        assert rig.app(WEBHOOK)["spec"]["syncPolicy"].get("automated", {}).get("selfHeal") is True
    assert policy_of(shaped) and policy_of(shaped).startswith("training@"), shaped["metadata"]
    limits = shaped["spec"]["containers"][0]["resources"]["limits"]
    assert limits.get("nvidia.com/gpu") == "2", limits
    assert gpu_tolerations(shaped), shaped["spec"].get("tolerations")

    # Last: the root itself Healthy, as the Application health check sees its children.
    try:
        rig.wait(lambda s: healthy(s, rig.apps), "the root Application Healthy too", timeout=30, stall=None)
    except AssertionError as error:
        assert rig.argocd is not None
        tree = rig.argocd.api_json(f"/api/v1/applications/{ROOT_APP}/resource-tree")
        views = "\n".join(f"  {n['kind']} {n['name']}: {n.get('health')}" for n in tree.get("nodes") or [])
        raise AssertionError(f"{error}\nthe root's view of its children (argocd-cm Application health):\n{views}") \
            from None


def _create_gpu_pod(rig: GitOpsRig) -> Obj:
    """A training pod asking for 2 GPUs by label, created in an ``ml-*`` namespace (the training
    policy's); returns it as stored."""
    core = client.CoreV1Api(rig.api)
    namespace = f"ml-argocd-{secrets.token_hex(3)}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    wait_until(lambda: has_default_account(core, namespace), timeout=30, what="the default ServiceAccount")
    pod = pod_manifest("shaped", labels={"gpugate.io/profile": "training", "gpugate.io/gpus": "2"})
    # The API server's configuration informer may lag the caBundle by a moment: dry-run until shaped.
    wait_until(lambda: policy_of(create_pod(core, namespace, pod, dry_run=True)), timeout=30, interval=0.3,
               what="the API server to call the webhook and get the pod shaped", explain=rig.explain)
    return create_pod(core, namespace, pod)


def _webhook_shapes_a_gpu_pod_through_a_url(rig: GitOpsRig, stored: list[Obj]) -> Obj:
    """Without the right to bind the Service's port: ``gpugate serve`` on 127.0.0.1 and the webhook
    configurations Argo CD applied with only their clientConfig switched to its URL. That hand
    change is drift, so first the break-glass of docs/deploy.md (automated sync off on the root and
    the webhook app); the configurations are put back and sync restored after, the root's
    self-heal restoring the child's sync policy from Git."""
    admission = client.AdmissionregistrationV1Api(rig.api)
    core = client.CoreV1Api(rig.api)
    workdir = rig.workdir / "webhook-by-url"
    policies = workdir / "policies"
    policies.mkdir(parents=True)
    deployment = client.AppsV1Api(rig.api).read_namespaced_deployment("gpugate-webhook", SYSTEM_NAMESPACE)
    maps = [v.config_map.name for v in deployment.spec.template.spec.volumes or []
            if v.config_map is not None and v.config_map.name.startswith("gpugate-policies")]
    for name, text in (core.read_namespaced_config_map(maps[0], SYSTEM_NAMESPACE).data or {}).items():
        (policies / name).write_text(text)
    certs = ServingCerts(workdir / "tls")
    server = GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca, policies=policies,
                           log=rig.workdir / "gpugate-serve.log")
    patches = (admission.patch_mutating_webhook_configuration, admission.patch_validating_webhook_configuration)
    with rig.automated_sync_off():
        server.start()
        try:
            for patch, live in zip(patches, stored, strict=True):
                patch(WEBHOOK, with_loopback_url(live, server.base_url, certs.bundle.ca_cert))
            return _create_gpu_pod(rig)
        finally:
            for patch, live in zip(patches, stored, strict=True):
                patch(WEBHOOK, restore_client_config(live))
            server.stop()


CRD_HEALTH_CHECK = "resource.customizations.health.apiextensions.k8s.io_CustomResourceDefinition"
"""The argocd-cm key of our CRD check (argocd/health/apiextensions.k8s.io/CustomResourceDefinition),
which replaces Argo CD's built-in one (argo-cd util/lua/lua.go GetHealthScript: an argocd-cm script
first, the built-in resource_customizations/ script only without one)."""


def test_first_install_is_never_degraded(rig: GitOpsRig, install: Install, findings: Findings) -> None:
    """A Degraded pages (the catalog trigger on-health-degraded is subscribed on every child), so
    no app may be Degraded at any moment of a first install that ends Healthy. Argo CD v3.2.11's
    built-in CRD health (resource_customizations/apiextensions.k8s.io/CustomResourceDefinition/
    health.lua) calls a chart CRD Degraded ("CRD is not established") while the API server has it
    at Established=False/Installing, and the root passes the child's Degraded on
    (argocd/health/argoproj.io/Application): here gpu-operator and gpugate-root were Degraded on
    first installs, up to ~40 s (until the app's next resync). argocd-cm now carries our CRD check,
    Progressing until Established. Whether Argo CD sees a CRD before it is established is a race,
    so this fails on the old check only when the race happens; the test records what it saw: each
    app's health as it changed during the install, and every Degraded with the resources that made
    it (``--persist-resource-health``). The chart's CRDs end Healthy by our check's verdict (its
    message, not the built-in one's)."""
    assert rig.watch is not None and rig.argocd is not None
    if install.error:
        pytest.fail("the first install did not finish (test_first_install_* says why)")
    ended = install.started + install.seconds
    during = [o for o in rig.watch.since(install.started) if o.at <= ended and o.state is not None]
    healths: dict[str, list[str]] = {}
    for o in during:
        assert o.state is not None
        seen = healths.setdefault(o.app, [])
        if not seen or seen[-1] != str(o.state.health):
            seen.append(str(o.state.health))
    findings.notes["install-health"] = healths
    degraded = [o for o in during if o.state is not None and o.state.health == "Degraded"]
    findings.notes["install-degraded"] = sorted({f"{o.app}: {c}" for o in degraded if o.state is not None
                                                 for c in o.state.degraded or ("(no resource named)",)})
    print("\nfirst install, health as it changed: "
          + "; ".join(f"{app}: {' -> '.join(h)}" for app, h in sorted(healths.items())), file=sys.stderr)
    assert not degraded, ("Degraded during the first install:\n"
                          + "\n".join(f"{o.at - install.started:6.1f}s {o.app}: {o.state}" for o in degraded))
    now = rig.watch.current()
    assert not [a for a, state in now.items() if state.health == "Degraded"], now

    argocd_cm = client.CoreV1Api(rig.api).read_namespaced_config_map("argocd-cm", harness.NAMESPACE)
    assert CRD_HEALTH_CHECK in (argocd_cm.data or {}), "argocd-cm does not carry the CRD health check"
    crd = tree_health(rig, "gpu-operator", "CustomResourceDefinition", "nvidiadrivers.nvidia.com")
    assert crd == {"status": "Healthy", "message": "CRD is established"}, crd


# --- 2. a commit upgrades the stack ----------------------------------------------------------------

def upgrade_events(rig: GitOpsRig, node: str) -> list[str]:
    """The GPUDriverUpgrade events the library recorded on ``node`` (k8s-operator-libs util.go logEvent)."""
    events = client.CoreV1Api(rig.api).list_event_for_all_namespaces(
        field_selector=f"involvedObject.kind=Node,involvedObject.name={node}").items
    return [e.message or "" for e in events if e.reason == "GPUDriverUpgrade"]


def unschedulable(rig: GitOpsRig, node: str) -> bool:
    return bool(client.CoreV1Api(rig.api).read_node(node).spec.unschedulable)


def assert_walked_the_library(rig: GitOpsRig, nodes: list[str], since: float) -> dict[str, list[str]]:
    assert rig.history is not None
    walks = {n: rig.history.states_walked(n, since) for n in nodes}
    for node, walked in walks.items():
        assert in_order(walked, IN_PLACE_STEPS), (
            f"{node} did not walk NVIDIA's states {IN_PLACE_STEPS}:\n{rig.history.timeline(since)}")
    return walks


def test_a_commit_upgrades_the_canary_pool_then_canary_promotes_every_pool(ready: GitOpsRig, findings: Findings,
                                                                            webhook_served: str) -> None:
    """``gpugate stack upgrade --pool canary`` commits; Argo CD syncs it; NVIDIA's state machine
    (k8s-operator-libs, run per reconcile as the operator's upgrade controller does) walks each
    canary node through its states one at a time (the canary's upgradePolicy: maxParallelUpgrades
    1, maxUnavailable 1): cordon, pod deletion of the GPU pods (refused: they have an emptyDir,
    podDeletion.deleteEmptyDir is false), so drain (drain.deleteEmptyDir true), with real
    evictions under a PodDisruptionBudget, the driver pod deleted and recreated by the DaemonSet
    controller at the new revision, validation, uncordon. The GPU pods are rescheduled. Then
    ``gpugate stack canary --commit`` sees every canary node done at the driver and makes the
    promote commit; the default pool rolls with at most maxParallelUpgrades nodes upgrading at any
    instant of the node watch; a node an admin cordoned before the upgrade is still cordoned after
    it (the library's initial-state annotation), and, since the library counts that cordon against
    maxUnavailable, the other node waits until the admin uncordons it."""
    rig = ready
    assert rig.fork is not None and rig.standin is not None and rig.dashboard is not None
    assert rig.history is not None and rig.upgrades is not None
    old = yaml_value(rig.fork.file("manifests/gpu-operator/drivers/default.yaml"), "version")
    assert old and old != CANARY_DRIVER
    canary, default = rig.pool("canary"), rig.pool("default")
    started = rig.upgrades.reconciles()
    _delete_bare_pods(rig)
    namespace = start_gpu_workload(rig.api, {POOL_LABEL: "canary"}, explain=rig.explain,
                                   namespace_labels={"gpugate.io/skip": "true"})
    before = ready_workload_pods(rig.api, namespace)

    # Canary.
    rig.fork.stack("upgrade", "--operator", OPERATOR, "--driver", CANARY_DRIVER, "--pool", "canary")
    revision = rig.fork.head()
    assert "canary" in rig.fork.subject() and set(changed_files(rig.fork.path, revision)) >= {
        "manifests/gpu-operator/drivers/canary.yaml", "manifests/gpu-operator/stack.yaml"}
    pushed = time.monotonic()
    rig.pushed()
    wait_standin(rig, lambda s: any(s[n]["state"] not in (None, "upgrade-done") for n in canary),
                 "a canary node to leave upgrade-done")
    rig.wait(lambda s: s["gpu-operator"].health == "Progressing" and s["gpu-operator"].revision == revision,
             "gpu-operator Progressing at the canary commit")
    assert tree_health(rig, "gpu-operator", "NVIDIADriver", "canary")["status"] == "Progressing"
    rig.dashboard.snapshot("canary pool rolling (gpugate stack upgrade --pool canary)")
    rig.wait(children_ready(rig, revision), "the canary rollout to finish", timeout=240)
    assert_rollout_sequence(rig, "gpu-operator", pushed, revision)
    assert_status_tells_the_truth(rig, git={"default": old, "canary": CANARY_DRIVER})
    walks = assert_walked_the_library(rig, canary, pushed)
    most, at_once = rig.history.most_upgrading(canary, pushed)
    assert most == 1, f"the canary pool upgraded {at_once} at once:\n{rig.history.timeline(pushed)}"
    assert any("drain-required" in w for w in walks.values()), (
        f"no canary node drained its GPU pods (emptyDir: pod deletion refuses, drain evicts):\n{walks}")
    assert not rig.history.since(pushed, default), "the canary commit moved a default-pool node"
    labels = rig.node_labels()
    assert {labels[n].get(DRIVER_VERSION_LABEL) for n in canary} == {CANARY_DRIVER}
    assert {labels[n].get(DRIVER_VERSION_LABEL) for n in default} == {old}, "the canary commit reached the default pool"
    after = ready_workload_pods(rig.api, namespace)
    assert len(after) == 2 and not set(after) & set(before), (
        f"the GPU pods were not all evicted and rescheduled: before {before}, after {after}")
    assert any("drain" in m.lower() for n in canary for m in upgrade_events(rig, n)), \
        {n: upgrade_events(rig, n) for n in canary}
    findings.notes["canary-walks"] = walks
    rig.dashboard.snapshot("canary pool upgraded")

    # An admin cordons a default node before the promotion.
    cordoned, other = default
    rig.kubectl("cordon", cordoned)
    canary_out = rig.fork.stack("canary", "--commit", "--window", "2", "--timeout", "60")
    promoted = rig.fork.head()
    assert "promote" in rig.fork.subject() and promoted != revision, canary_out
    assert "promote" in canary_out and "upgrade-done" in canary_out, canary_out
    pushed = time.monotonic()
    rig.pushed()
    rig.wait(lambda s: s["gpu-operator"].health == "Progressing" and s["gpu-operator"].revision == promoted,
             "gpu-operator Progressing at the promote commit")
    wait_until(lambda: rig.standin is not None and rig.standin.snapshot()[cordoned]["state"] == "upgrade-done"
               and rig.standin.snapshot()[cordoned]["driver"] == CANARY_DRIVER, timeout=180,
               what=f"{cordoned} (cordoned by an admin) upgraded", explain=rig.explain)
    rig.upgrades.wait_reconciles(5)
    assert unschedulable(rig, cordoned), f"{cordoned} was cordoned by an admin and the upgrade uncordoned it"
    assert rig.standin.snapshot()[other]["state"] == "upgrade-required", (
        "with maxUnavailable 1 the library counts the admin's cordon: the other node must wait\n"
        + rig.history.timeline(pushed))
    rig.dashboard.snapshot("default pool: the admin-cordoned node upgraded, still cordoned; the other waits")
    rig.kubectl("uncordon", cordoned)
    rig.wait(children_ready(rig, promoted), "the promotion to finish", timeout=240)
    assert_rollout_sequence(rig, "gpu-operator", pushed, promoted)
    assert_walked_the_library(rig, [other], pushed)
    # The admin's node: validation-required -> upgrade-done, never uncordon-required (the library's
    # node-initial-state annotation, common_manager.go updateNodeToUncordonOrDoneState).
    kept = rig.history.states_walked(cordoned, pushed)
    assert in_order(kept, tuple(s for s in IN_PLACE_STEPS if s != "uncordon-required")), kept
    assert "uncordon-required" not in kept, kept
    policy = yaml.safe_load(rig.fork.file("manifests/gpu-operator/stack.yaml"))
    parallel = next(p["upgradePolicy"]["maxParallelUpgrades"] for p in policy["pools"] if p["name"] == "default")
    most, at_once = rig.history.most_upgrading(default, pushed)
    assert 1 <= most <= parallel, f"{at_once} upgrading at once (maxParallelUpgrades {parallel}):\n" \
        + rig.history.timeline(pushed)
    status = assert_status_tells_the_truth(rig, git={"default": CANARY_DRIVER, "canary": CANARY_DRIVER})
    assert pool_counts(status) == {"default": {"upgrade-done": 2}, "canary": {"upgrade-done": 2}}
    labels = rig.node_labels()
    assert {labels[n].get(DRIVER_VERSION_LABEL) for n in rig.nodes} == {CANARY_DRIVER}
    assert_no_partial_applies(rig, started)
    findings.notes["upgraded"] = True
    # Gone before test 3: there a failed canary node stays cordoned, and had the workload's PDB to
    # drain onto it, the retry of the other canary node would wait out its drain timeout.
    client.CoreV1Api(rig.api).delete_namespace(namespace)


def _delete_bare_pods(rig: GitOpsRig) -> None:
    """Test 1's shaped pod has no controller: kubectl drain semantics (the library's pod deletion
    and drain, Force false) refuse such a pod, and its node would end upgrade-failed. Gone first."""
    core = client.CoreV1Api(rig.api)
    for pod in core.list_pod_for_all_namespaces().items:
        if pod.metadata.namespace.startswith("ml-argocd-") and not pod.metadata.owner_references:
            core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)


def assert_no_partial_applies(rig: GitOpsRig, after: int) -> None:
    """No reconcile after serial ``after`` ran ApplyState on a state lacking one of a pool's nodes. Such
    a state (BuildState skips a driver pod not bound to a node yet, upgrade_state.go) counts the
    missing node neither in progress nor unavailable, so GetUpgradesAvailable hands its slot to the
    next node; gpu-upgrade-controller holds such a pool (main.go), and this names it if one slips."""
    assert rig.upgrades is not None
    sizes = {pool: len(rig.pool(pool)) for pool in ("canary", "default")}
    slipped = rig.upgrades.partial_applies(sizes, after)
    assert not slipped, ("ApplyState ran on a state missing a pool's node (in-progress undercounted):\n"
                         + "\n".join(f"  {s.pool} {s}" for s in slipped))


@contextmanager
def scheduler_paused(rig: GitOpsRig) -> Iterator[None]:
    """The control plane's kube-scheduler stopped (SIGSTOP by its PID) and continued after: a pod the
    DaemonSet controller makes meanwhile stays Pending with no node."""
    plane = rig.cluster.plane
    assert plane is not None, "this module's control plane is its own (own_control_plane)"
    scheduler = next(p for p in plane.processes if p.name == "kube-scheduler")
    os.kill(scheduler.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(scheduler.pid, signal.SIGCONT)


def unbound_driver_pod(rig: GitOpsRig, node: str) -> str | None:
    """The driver pod the DaemonSet controller made for ``node`` and no scheduler bound yet (the
    controller pins it with a matchFields metadata.name term), or None."""
    listing = json.loads(client.CoreV1Api(rig.api).list_namespaced_pod(
        OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/component=nvidia-driver", _preload_content=False).data)
    for pod in listing["items"]:
        if pod["spec"].get("nodeName") or pod["status"].get("phase") != "Pending" \
                or pod["metadata"].get("deletionTimestamp"):
            continue
        required = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        for term in required.get("nodeSelectorTerms") or []:
            if any(f["key"] == "metadata.name" and node in (f.get("values") or [])
                   for f in term.get("matchFields") or []):
                return str(pod["metadata"]["name"])
    return None


# --- 3. a failed upgrade and its rollback ----------------------------------------------------------

def test_a_failed_canary_upgrade_blocks_promote_and_canary_rolls_it_back(ready: GitOpsRig, findings: Findings,
                                                                       webhook_served: str) -> None:
    """The next canary commit pins a driver whose container crash-loops (the fake kubelet's bad
    image): the library sees its restart count pass 10 and marks the first canary node
    ``upgrade-failed`` (common_manager.go ProcessPodRestartNodes / isDriverPodFailing); the other
    canary node waits (a failed node counts as in progress). Argo CD shows Progressing (what the
    operator's status says), ``gpugate stack status --kube`` names the failed node and exits 1,
    ``gpugate stack promote`` refuses naming it, and ``gpugate stack canary --commit`` decides
    rollback and makes the rollback commit. Argo CD syncs it; the failed node stays failed (its
    crash-looping pod is at the reverted revision's predecessor, never in sync:
    ProcessUpgradeFailedNodes) until the retry the operator documents relabels it; then the
    library brings the pool back to the old driver and Healthy.

    The first canary node's driver pod, deleted by the library and re-created by the DaemonSet
    controller, is held unbound (kube-scheduler stopped) for five reconciles: BuildState leaves that
    node out of the pool's state (upgrade_state.go, "Driver Pod has no NodeName, skipping"), and
    counted without it, in progress is 0 and an upgrade slot is free. The other node must still
    wait: gpu-upgrade-controller holds a pool whose state lacks a node (main.go), and its report
    must name the node. Left to chance, that window started the second node in one CI run."""
    rig = ready
    assert rig.fork is not None and rig.standin is not None and rig.dashboard is not None and rig.watch is not None
    assert rig.history is not None and rig.upgrades is not None
    if not findings.notes.get("upgraded"):
        pytest.fail("test 2's upgrade did not finish (both pools on the canary driver); its failure says why")
    canary, default = rig.pool("canary"), rig.pool("default")

    started = rig.upgrades.reconciles()
    rig.fork.stack("upgrade", "--operator", OPERATOR, "--driver", BAD_DRIVER, "--pool", "canary",
                   "--allow-driver-downgrade")
    revision = rig.fork.head()
    pushed = time.monotonic()
    rig.pushed()
    history = rig.history
    first_node: str = wait_until(
        lambda: next((c.node for c in history.since(pushed, canary) if c.state not in NOT_UPGRADING), ""),
        timeout=180, interval=0.1, what="a canary node to start its driver upgrade", explain=rig.explain)
    waiting = next(n for n in canary if n != first_node)

    def explain_canary() -> str:
        assert rig.upgrades is not None and rig.history is not None
        return rig.history.timeline(pushed) + "\n" + rig.upgrades.pool_timeline("canary", started)

    with scheduler_paused(rig):
        unbound: str = wait_until(lambda: unbound_driver_pod(rig, first_node) or "", timeout=90, interval=0.2,
                                  what=f"{first_node}'s re-created driver pod, unbound while kube-scheduler is stopped",
                                  explain=explain_canary)
        rig.upgrades.wait_reconciles(5)
        assert rig.node_labels()[waiting].get(STATE_LABEL) == "upgrade-required", (
            f"{waiting} started while {first_node}'s driver pod {unbound} was unbound:\n" + explain_canary())
        held = [r for r in rig.upgrades.pool_reconciles("canary", started) if any(first_node in h for h in r.held)]
        assert held, f"no reconcile held the canary pool for {first_node}:\n" + explain_canary()
        assert unbound in held[-1].held[0] and held[-1].managed == 1, held[-1]
    findings.notes["held-reconciles"] = len(held)
    snapshot = wait_standin(rig, lambda s: any(s[n]["state"] == "upgrade-failed" for n in canary),
                            "a canary node to fail its driver upgrade", timeout=180)
    broken = next(n for n in canary if snapshot[n]["state"] == "upgrade-failed")
    assert broken == first_node, explain_canary()
    assert snapshot[broken]["restarts"] > 10 and snapshot[broken]["ready"] is False, snapshot[broken]
    rig.wait(lambda s: s["gpu-operator"].revision == revision and s["gpu-operator"].sync == "Synced"
             and s["gpu-operator"].phase != "Running", "gpu-operator synced to the broken canary commit")
    rig.upgrades.wait_reconciles(5)
    assert rig.standin.snapshot()[waiting]["state"] == "upgrade-required", explain_canary()
    assert_no_partial_applies(rig, started)
    states = rig.watch.current()
    findings.notes["failed-health"] = states["gpu-operator"].health
    assert states["gpu-operator"].health == "Progressing", states["gpu-operator"]
    assert not [o for o in rig.watch.since(pushed, "gpu-operator") if o.state and o.state.health == "Degraded"], \
        rig.watch.timeline(pushed, ["gpu-operator"])
    driver = tree_health(rig, "gpu-operator", "NVIDIADriver", "canary")
    assert driver["status"] == "Progressing" and "DriverNotReady" in driver.get("message", ""), driver
    policy = tree_health(rig, "gpu-operator", "ClusterPolicy", "cluster-policy")
    assert policy["status"] == "Progressing" and "failed" in policy.get("message", ""), policy
    status = assert_status_tells_the_truth(rig, git={"default": CANARY_DRIVER, "canary": BAD_DRIVER}, failed=True)
    assert [p["upgradeFailed"] for p in status["cluster"]["pools"] if p["name"] == "canary"] == [[broken]]
    assert not rig.history.since(pushed, default), "a default-pool node moved during the canary's failed upgrade"
    rig.dashboard.snapshot("canary driver upgrade failed")

    # The gate: no promotion of a failed canary.
    head = rig.fork.head()
    refused = rig.fork.stack("promote", "--from", "canary", "--to", "all", exit_codes=(1,))
    assert rig.fork.head() == head, "promote committed over a failed canary"
    assert "canary-gate" in refused and f"{broken} is upgrade-failed" in refused, refused

    # The canary command decides and commits the rollback.
    decided = rig.fork.stack("canary", "--commit", "--timeout", "60", exit_codes=(1,))
    rolled_back = rig.fork.head()
    assert "rollback" in decided and broken in decided and rolled_back != head, decided
    assert yaml_value(rig.fork.file("manifests/gpu-operator/drivers/canary.yaml"), "version") == CANARY_DRIVER
    rig.pushed()
    rig.wait(lambda s: s["gpu-operator"].revision == rolled_back and s["gpu-operator"].sync == "Synced"
             and s["gpu-operator"].phase != "Running", "gpu-operator synced to the rollback commit")
    assert rig.nvidia("nvidiadrivers", "canary")["spec"]["version"] == CANARY_DRIVER
    rig.upgrades.wait_reconciles(10)
    snapshot = rig.standin.snapshot()
    findings.notes["rollback-alone"] = (snapshot[broken]["state"], rig.watch.current()["gpu-operator"].health)
    assert snapshot[broken]["state"] == "upgrade-failed", snapshot
    rig.dashboard.snapshot("rolled back in Git; the failed node still upgrade-failed")

    # The retry the operator documents (and `gpugate stack status` prints).
    retried = time.monotonic()
    rig.kubectl(*RETRY_COMMAND.format(node=broken).split()[1:])
    rig.wait(children_ready(rig, rolled_back), "Healthy after the rollback and the node retry", timeout=240)
    status = assert_status_tells_the_truth(rig, git={"default": CANARY_DRIVER, "canary": CANARY_DRIVER})
    assert pool_counts(status) == {"default": {"upgrade-done": 2}, "canary": {"upgrade-done": 2}}
    labels = rig.node_labels()
    assert {labels[n].get(DRIVER_VERSION_LABEL) for n in rig.nodes} == {CANARY_DRIVER}
    assert_walked_the_library(rig, [broken], retried)
    assert not any(unschedulable(rig, n) for n in rig.nodes), "a node is left cordoned"
    rig.dashboard.snapshot("rolled back: Healthy")


# --- 4. drift ------------------------------------------------------------------------------------------

def test_self_heal_reverts_a_hand_edit_but_not_the_cabundle_gpugate_certs_wrote(ready: GitOpsRig) -> None:
    """A hand edit of the MutatingWebhookConfiguration (``timeoutSeconds``) is drift: the app goes
    OutOfSync and self-heal puts Git's value back. Its caBundle, set at run time by ``gpugate
    certs``, is excluded by the app's ``ignoreDifferences``: present and the app Synced, and a
    hand edit of it is not reverted (RespectIgnoreDifferences keeps syncs off it too)."""
    rig = ready
    assert rig.watch is not None
    admission = client.AdmissionregistrationV1Api(rig.api)

    def mutating() -> Obj:
        return dict(json.loads(admission.read_mutating_webhook_configuration(WEBHOOK, _preload_content=False).data))

    original = mutating()
    bundle = ca_bundles(original)[0]
    assert bundle, "no caBundle: the certificate Job did not run"
    webhook_app = rig.app(WEBHOOK)
    assert webhook_app["status"]["sync"]["status"] == "Synced"
    resources = {(r["kind"], r["name"]): r.get("status") for r in webhook_app["status"].get("resources") or []}
    assert resources[("MutatingWebhookConfiguration", WEBHOOK)] == "Synced", resources

    # The caBundle edited by hand: ignored, so no OutOfSync and not reverted.
    other = base64.b64encode(ServingCerts(rig.workdir / "other-ca").bundle.ca_cert).decode()
    admission.patch_mutating_webhook_configuration(
        WEBHOOK, [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": other}])
    since = time.monotonic()
    reconciled = webhook_app["status"].get("reconciledAt")
    harness.refresh(rig.custom, WEBHOOK)
    wait_until(lambda: rig.app(WEBHOOK)["status"].get("reconciledAt") != reconciled
               and rig.app(WEBHOOK)["metadata"].get("annotations", {}).get(harness.REFRESH_ANNOTATION) is None,
               timeout=60, interval=0.3, what="Argo CD to compare the webhook app again")
    time.sleep(2.0)
    assert not [o for o in rig.watch.since(since, WEBHOOK) if o.state and o.state.sync == "OutOfSync"]
    assert ca_bundles(mutating())[0] == other
    admission.patch_mutating_webhook_configuration(
        WEBHOOK, [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}])

    # A hand edit of a managed field: OutOfSync, then self-heal back to Git's value.
    timeout_seconds = original["webhooks"][0]["timeoutSeconds"]
    since = time.monotonic()
    admission.patch_mutating_webhook_configuration(
        WEBHOOK, [{"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": timeout_seconds + 20}])
    wait_until(lambda: mutating()["webhooks"][0]["timeoutSeconds"] == timeout_seconds, timeout=60, interval=0.3,
               what="self-heal to put timeoutSeconds back", explain=rig.explain)
    rig.wait(children_ready(rig), "the webhook app Synced again after self-heal", timeout=90)
    seen = rig.watch.since(since, WEBHOOK)
    assert first(seen, lambda s: s.sync == "OutOfSync") is not None, rig.watch.timeline(since, [WEBHOOK])
    assert first(seen, lambda s: s.phase == "Running") is not None, rig.watch.timeline(since, [WEBHOOK])
    # The sync re-ran the certificate hook; the caBundle is still the Secret's CA, untouched by the sync.
    assert ca_bundles(mutating())[0] == bundle


# --- 5. the dashboard -----------------------------------------------------------------------------------

def test_the_dashboard_states_read_from_the_api(rig: GitOpsRig, install: Install) -> None:
    """Argo CD's web UI does not come built in its Go module and cannot be built from the package
    registries (the reason is asserted, from the module's own files); argocd-server serves no UI.
    What it would show is recorded instead: at every step above, the application list and each
    application's resource tree (health of every node, operator-created children included) as
    argocd-server's API returns them, rendered as Markdown (``argocd_dashboard``)."""
    assert rig.argocd is not None and rig.dashboard is not None
    reason = ui_unavailable_reason()
    assert reason is not None, "the module ships a built UI now: serve it and take screenshots instead"
    assert "argo-ui" in reason
    status, body = rig.argocd.api("/applications")
    assert status != 200 or b"<script" not in body, "argocd-server serves a UI after all"

    final = rig.dashboard.snapshot("end of the Argo CD tests")
    labels = [s.label for s in rig.dashboard.snapshots]
    index = rig.dashboard.index()
    assert index.is_file() and set(final.apps) >= set(rig.apps)
    if install.error:
        return  # the install's own snapshot says where it stopped
    installed = next(s.markdown for s in rig.dashboard.snapshots if s.label.startswith("first install"))
    assert "| gpu-operator | Synced | Healthy |" in installed, installed
    rolling = [s for s in rig.dashboard.snapshots if s.label.startswith("canary pool rolling")]
    if rolling:
        assert "NVIDIADriver canary [Synced / Progressing]" in rolling[0].markdown, rolling[0].markdown
    failed = [s for s in rig.dashboard.snapshots if s.label == "canary driver upgrade failed"]
    if failed:
        assert "DriverNotReady" in failed[0].markdown and "Degraded" not in failed[0].markdown.split("### ")[0]
    print(f"\ndashboard snapshots: {labels} in {index.parent}", file=sys.stderr)
