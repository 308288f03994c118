"""The whole GitOps rig of ``test_argocd.py``, started and stopped in one place.

On an e2e control plane (etcd, kube-apiserver, controller manager, scheduler; fake kubelets)
whose Service network is on loopback (see ``test_argocd.py``'s ``cluster``):

* four fake GPU nodes, two in the canary pool (label ``gpugate.io/driver-pool=canary``, the
  canary pool's nodeSelector in ``manifests/gpu-operator/stack.yaml``), all with the NFD label
  the GPU Operator finds GPU nodes by;
* NVIDIA's chart repository from ``../shared/upstream/charts`` over HTTP on loopback;
* a fork of the project (working tree included) served by ``git daemon`` on loopback and
  pointed at itself the way a user points Argo CD at a fork;
* Argo CD v3.2.11 (redis, repo server, application controller, API server) with the release's
  CRDs and default settings, ``argocd-cm`` patched with ``argocd/install/argocd-cm-health.yaml``
  exactly as docs/gitops.md says;
* NVIDIA's driver upgrade state machine (``argocd_upgrades``: k8s-operator-libs in
  ``gpu-upgrade-controller``), the GPU Operator stand-in for what the operator's other controllers
  write (``argocd_standin``), a record of every node state change, and the runner of the project's
  Job pods (``argocd_jobs``);
* the fake kubelet with a pod lifecycle (:data:`POD_LIFECYCLE`): pods take time to start, to turn
  Ready and to stop, and the driver image of :data:`BAD_DRIVER` crash-loops;
* a watch of every Application and the dashboard recorder.

:meth:`GitOpsRig.stop` stops every process and thread by PID; the control plane is thrown away.
:func:`serve_webhook_on_service` runs the real ``gpugate serve`` where the API server looks for
the webhook Argo CD deployed: its Service's ClusterIP, port 443.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.e2e import argocd_harness as harness
from tests.e2e.argocd_dashboard import Dashboard
from tests.e2e.argocd_gitops import GPUGATE, Fork, ForkOverride, applications_in_git, fork_of_worktree, point_at_fork
from tests.e2e.argocd_jobs import ProjectJobRunner
from tests.e2e.argocd_standin import NFD_GPU_LABEL, NFD_OS_ID, NFD_OS_VERSION, GPUOperatorStandIn
from tests.e2e.argocd_upgrades import NodeHistory, UpgradeController
from webhook.localcluster import processes
from webhook.localcluster.cluster import Cluster
from webhook.localcluster.fakekubelet import PodLifecycle

Obj = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT.parent / "shared" / "upstream" / "charts"
UPGRADE_CONTROLLER = "gpu-upgrade-controller"
BAD_DRIVER = "595.71.05"
"""A published driver whose image, in this e2e, never loads: its container crash-loops."""
POD_LIFECYCLE = PodLifecycle(
    creating_seconds=0.3, ready_seconds=0.7, honour_grace=True,
    # A driver pod keeps the default 30 s grace (the operator sets none); the tests' patience is 3 s.
    max_grace_seconds=3.0, crash_images=frozenset({f"driver:{BAD_DRIVER}-"}), restart_seconds=0.25)
ROOT_APP = "gpugate-root"
POOL_LABEL = "gpugate.io/driver-pool"
SYSTEM_NAMESPACE = "gpugate-system"
OPERATOR_NAMESPACE = "gpu-operator"
WEBHOOK = "gpugate-webhook"
MONITORING_CRDS = tuple(ROOT.parent / "shared" / "schemas" / f"monitoring.coreos.com_{plural}.yaml"
                        for plural in ("servicemonitors", "prometheusrules"))
"""The Prometheus Operator's CRDs as it publishes them: gpugate-observability's ServiceMonitors and
its PrometheusRule (the usage recording rules) are checked against their real schemas; nothing
runs the operator."""
CONTROLLER_ARGS = (
    # Every push is followed by the refresh a Git webhook makes, so the resync only matters for
    # health Argo CD does not recompute on its own: a CRD's health right after its creation (then
    # Degraded by Argo CD's built-in check, now Progressing by ours) was seen sticking on the app
    # until the next resync (default 120 s + up to 60 s jitter); 15 s without jitter keeps the
    # module short.
    "--app-resync", "15", "--app-resync-jitter", "0",
    # Self-heal as soon as drift is seen (defaults: 2 s, x3, capped at 300 s).
    "--self-heal-backoff-timeout-seconds", "1", "--self-heal-backoff-factor", "1",
    "--self-heal-backoff-cap-seconds", "2",
    "--status-processors", "4", "--operation-processors", "2",
    "--repo-server-timeout-seconds", "120",
    # Each managed resource's health in status.resources, so the Application watch sees which
    # resource made an app Degraded at the moment it was (v3 keeps it only in Redis by default:
    # cmd/argocd-application-controller/commands/argocd_application_controller.go
    # --persist-resource-health). Where it is stored changes nothing Argo CD decides.
    "--persist-resource-health",
)


def rig_binaries() -> dict[str, Path]:
    """What a GitOps rig runs: Argo CD's, helm, kustomize (``harness.rig_binaries``) and NVIDIA's upgrade
    library; a missing one skips (fails under CI) naming the command that builds it."""
    from tests.e2e import binaries
    from tests.prerequisites import missing, needed

    needed(CHARTS / "index.yaml", "a fresh clone has no ../shared: NVIDIA's chart cannot be served")
    found = harness.rig_binaries()
    controller = binaries.upgrade_controller()
    if controller is None:
        missing("gpu-upgrade-controller (NVIDIA's k8s-operator-libs) is not built; run "
                "`python -m tests.e2e.binaries build`")
        raise AssertionError("unreachable")
    return {**found, UPGRADE_CONTROLLER: controller}


def healthy(states: dict[str, harness.AppState], apps: Sequence[str], revision: str | None = None) -> bool:
    """Every app Synced and Healthy, no operation running (and synced to ``revision`` if given)."""
    for app in apps:
        state = states.get(app)
        if state is None or state.sync != "Synced" or state.health != "Healthy" or state.phase == "Running":
            return False
        if revision is not None and app != ROOT_APP and state.revision != revision:
            return False
    return True


@dataclass
class GitOpsRig:
    cluster: Cluster
    workdir: Path
    binaries: dict[str, Path]
    nodes: dict[str, str] = field(default_factory=dict)
    """node name -> pool (canary | default)."""
    layout: tuple[str, ...] = ("canary", "canary", "default", "default")
    """The pool of each GPU node to make, in order (a pool other than ``default`` is its
    ``gpugate.io/driver-pool`` label value, the pool's nodeSelector in stack.yaml)."""
    chart_repo: harness.ChartRepository | None = None
    daemon: harness.GitDaemon | None = None
    fork: Fork | None = None
    override: ForkOverride | None = None
    argocd: harness.ArgoCD | None = None
    watch: harness.ApplicationWatch | None = None
    standin: GPUOperatorStandIn | None = None
    upgrades: UpgradeController | None = None
    history: NodeHistory | None = None
    jobs: ProjectJobRunner | None = None
    dashboard: Dashboard | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds each start step took (for the report and a slow CI machine's post-mortem)."""
    degraded: list[str] = field(default_factory=list)
    """Every time an Application was seen Degraded (each also snapshotted on the dashboard)."""
    waves: dict[str, int] = field(default_factory=dict)
    """Child Application -> sync wave, as the root renders argocd/apps from the fork."""
    kubectl: harness.Kubectl = field(init=False)
    api: client.ApiClient = field(init=False)
    custom: client.CustomObjectsApi = field(init=False)

    def __post_init__(self) -> None:
        self.kubectl = harness.Kubectl(self.cluster.kubeconfig)
        self.api = self.cluster.api_client()
        self.custom = client.CustomObjectsApi(self.api)

    # -- start ---------------------------------------------------------------------------------

    def _step(self, name: str) -> None:
        now = time.monotonic()
        self.timings[name] = round(now - getattr(self, "_last", now), 2)
        self._last = now

    def start(self) -> GitOpsRig:
        self._last = time.monotonic()
        suffix = secrets.token_hex(2)
        self.cluster.kubelet.lifecycle = POD_LIFECYCLE
        for index, pool in enumerate(self.layout, start=1):
            # What NFD's worker would label: an NVIDIA PCI device, the OS (the driver's node pool).
            labels = {NFD_GPU_LABEL: "true", NFD_OS_ID: "ubuntu", NFD_OS_VERSION: "24.04"}
            if pool != "default":
                labels[POOL_LABEL] = pool
            name = self.cluster.add_gpu_node(f"argocd-{pool}-{suffix}-{index}", gpus=8, labels=labels)
            self.nodes[name] = pool
        self._step("nodes")

        self.chart_repo = harness.ChartRepository(CHARTS).start()
        (self.workdir / "git").mkdir(parents=True)
        self.daemon = harness.GitDaemon(self.workdir / "git", self.workdir).start()
        clone = fork_of_worktree(ROOT, self.workdir / "git" / "gpugate")
        self.override = point_at_fork(clone, self.daemon.url("gpugate"), self.chart_repo.url)
        self.fork = Fork(clone, self.cluster.kubeconfig, helm=self.binaries["helm"])
        self.waves = applications_in_git(clone)
        self._step("fork")

        harness.install_crds(self.kubectl)
        # The Prometheus Operator's kinds, which gpugate-observability expects the cluster to have
        # (docs/gitops.md).
        self.kubectl("apply", "--server-side", "-f", ",".join(str(p) for p in MONITORING_CRDS))
        harness.wait_established(self.cluster.kubeconfig, ["servicemonitors.monitoring.coreos.com",
                                                           "prometheusrules.monitoring.coreos.com"])
        harness.install_settings(self.kubectl)
        # docs/gitops.md, bootstrap step 2: the health checks before any Application exists.
        self.kubectl("-n", harness.NAMESPACE, "patch", "configmap", "argocd-cm", "--type", "merge",
                     "--patch-file", str(clone / "argocd" / "install" / "argocd-cm-health.yaml"))
        self._step("crds+settings")

        self.history = NodeHistory(self.cluster.api_client(), self.nodes).start()
        self.standin = GPUOperatorStandIn(self.cluster.api_client()).start()
        self.upgrades = UpgradeController(self.binaries[UPGRADE_CONTROLLER], self.cluster.kubeconfig,
                                          self.workdir / "upgrades", namespace=OPERATOR_NAMESPACE).start()
        self.standin.pause_others.append(self.upgrades.pause)
        self.jobs = ProjectJobRunner(self.cluster.api_client(), self.cluster.kubeconfig, self.workdir / "jobs",
                                     SYSTEM_NAMESPACE).start()
        self.argocd = harness.ArgoCD(kubeconfig=self.cluster.kubeconfig, workdir=self.workdir / "argocd",
                                     binaries=self.binaries, controller_args=CONTROLLER_ARGS, api_server=True).start()
        self._step("argocd")
        self.dashboard = Dashboard(self.argocd, self.workdir / "dashboard")
        self.watch = harness.ApplicationWatch(self.cluster.kubeconfig)
        self.watch.listeners.append(self._on_app_change)
        self.watch.start()
        return self

    def _on_app_change(self, name: str, state: harness.AppState | None) -> None:
        """An app turning Degraded is what a dashboard user would look at: snapshot it at once
        (the tree the API serves is the one of the controller's last refresh), in a thread."""
        if state is None or state.health != "Degraded" or self.dashboard is None:
            return
        label = f"{name} Degraded ({state.sync}, operation {state.phase})"

        def take() -> None:
            try:
                assert self.dashboard is not None
                self.dashboard.snapshot(label)
            except Exception as error:  # a diagnostic only
                self.degraded.append(f"{label}: snapshot failed: {error!r}")

        self.degraded.append(label)
        threading.Thread(target=take, name="degraded-snapshot", daemon=True).start()

    # -- what the tests do -----------------------------------------------------------------------

    def bootstrap(self) -> None:
        """docs/gitops.md bootstrap step 3: ``kubectl apply -k argocd/bootstrap`` from the fork."""
        assert self.fork is not None
        self.kubectl("apply", "-k", str(self.fork.path / "argocd" / "bootstrap"))

    @property
    def apps(self) -> tuple[str, ...]:
        """The root and every child Application."""
        return (ROOT_APP, *sorted(self.waves, key=lambda name: (self.waves[name], name)))

    def pushed(self) -> None:
        """After a commit: the refresh Argo CD's Git webhook handler requests for every app whose
        source is this repository (all of ours)."""
        for app in self.apps:
            harness.refresh(self.custom, app)

    def wait(self, predicate: Callable[[dict[str, harness.AppState]], bool], what: str, *, timeout: float = 180,
             stall: float | None = 75) -> dict[str, harness.AppState]:
        assert self.watch is not None
        return self.watch.wait(predicate, timeout=timeout, what=what, explain=self.explain, stall=stall)

    def explain(self) -> str:
        parts = []
        if self.standin is not None:
            parts.append(self.standin.explain())
        if self.upgrades is not None:
            parts.append(self.upgrades.tail(15))
        if self.history is not None and self.history.changes:
            parts.append("node changes (last 20):\n" + self.history.timeline(self.history.changes[-20:][0].at))
        if self.jobs is not None:
            parts.append(self.jobs.describe())
        try:
            for app in harness.applications(self.custom):
                operation = (app.get("status") or {}).get("operationState") or {}
                conditions = [c.get("message") for c in (app.get("status") or {}).get("conditions") or []]
                parts.append(f"{app['metadata']['name']}: operation {operation.get('phase')}: "
                             f"{operation.get('message')}; conditions {conditions}")
        except Exception as error:  # a diagnostic must not hide the failure it explains
            parts.append(f"(could not list Applications: {error!r})")
        if self.argocd is not None:
            parts.append(self.argocd.logs_tail(12))
        return "\n".join(parts)

    def app(self, name: str) -> Obj:
        response = self.custom.get_namespaced_custom_object(harness.GROUP, harness.VERSION, harness.NAMESPACE,
                                                            "applications", name, _preload_content=False)
        return dict(json.loads(response.data))

    def patch_app(self, name: str, body: Obj) -> None:
        self.custom.patch_namespaced_custom_object(harness.GROUP, harness.VERSION, harness.NAMESPACE,
                                                   "applications", name, body)

    def nvidia(self, plural: str, name: str) -> Obj:
        version = "v1" if plural == "clusterpolicies" else "v1alpha1"
        response = self.custom.get_cluster_custom_object("nvidia.com", version, plural, name, _preload_content=False)
        return dict(json.loads(response.data))

    def node_labels(self) -> dict[str, dict[str, str]]:
        core = client.CoreV1Api(self.api)
        return {name: dict(core.read_node(name).metadata.labels or {}) for name in self.nodes}

    def pool(self, pool: str) -> list[str]:
        return sorted(n for n, p in self.nodes.items() if p == pool)

    @contextmanager
    def automated_sync_off(self) -> Iterator[None]:
        """The break-glass of docs/deploy.md: automated sync off on ``gpugate-root`` and
        ``gpugate-webhook`` (or self-heal undoes a hand change to the webhook configurations),
        restored afterwards: the root's as ``argocd/bootstrap/root.yaml`` declares it, and the
        root's self-heal then restores the child's from Git."""
        assert self.fork is not None
        root = yaml.safe_load((self.fork.path / "argocd" / "bootstrap" / "root.yaml").read_text())
        automated = root["spec"]["syncPolicy"]["automated"]
        self.patch_app(ROOT_APP, {"spec": {"syncPolicy": {"automated": None}}})
        self.patch_app(WEBHOOK, {"spec": {"syncPolicy": {"automated": None}}})
        try:
            yield
        finally:
            self.patch_app(ROOT_APP, {"spec": {"syncPolicy": {"automated": automated}}})

    # -- stop ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every process and thread this rig started. Nothing in the cluster is deleted: the
        rig runs on a control plane of its own (test_argocd.py), thrown away afterwards."""
        for part in (self.watch, self.argocd, self.upgrades, self.standin, self.history, self.jobs, self.daemon,
                     self.chart_repo):
            if part is not None:
                try:
                    part.stop()
                except Exception:  # keep stopping the others
                    pass


def ca_bundles(stored: Obj) -> list[str]:
    return [str((hook.get("clientConfig") or {}).get("caBundle") or "") for hook in stored.get("webhooks") or []]


def with_loopback_url(stored: Obj, base_url: str, ca_pem: bytes) -> list[Obj]:
    """JSON patch ops replacing only each webhook's clientConfig with ``url`` + ``caBundle``
    (the path kept from the service reference Argo CD applied)."""
    ops = []
    for index, hook in enumerate(stored["webhooks"]):
        path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path", "")
        ops.append({"op": "replace", "path": f"/webhooks/{index}/clientConfig",
                    "value": {"url": base_url + path, "caBundle": base64.b64encode(ca_pem).decode()}})
    return ops


def restore_client_config(stored: Obj) -> list[Obj]:
    return [{"op": "replace", "path": f"/webhooks/{index}/clientConfig", "value": copy.deepcopy(hook["clientConfig"])}
            for index, hook in enumerate(stored["webhooks"])]



@contextmanager
def serve_webhook_on_service(rig: GitOpsRig) -> Iterator[str]:
    """``gpugate serve`` listening on the webhook Service's ClusterIP and port, with the Secret
    ``gpugate certs`` made and the policies ConfigMap Argo CD synced.

    The API server resolves a ``service`` clientConfig to ``https://<ClusterIP>:<port>`` (k8s.io/
    apiserver ``pkg/util/proxy`` ResolveCluster, the default resolver of kube-apiserver) and checks
    the name ``<svc>.<ns>.svc`` against the caBundle. On this control plane ClusterIPs are
    loopback addresses, so the webhook configurations exactly as Argo CD applied them, with the
    caBundle the certificate Job wrote, reach a real server here: nothing is patched. Yields the
    ClusterIP. Binding port 443 needs root or CAP_NET_BIND_SERVICE (PermissionError otherwise).
    """
    core = client.CoreV1Api(rig.api)
    service = core.read_namespaced_service(WEBHOOK, SYSTEM_NAMESPACE)
    port = next(p.port for p in service.spec.ports if p.name == "https")
    address = service.spec.cluster_ip
    workdir = rig.workdir / "webhook-on-service"
    policies = workdir / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    secret = core.read_namespaced_secret("gpugate-webhook-tls", SYSTEM_NAMESPACE).data
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (workdir / key).write_bytes(base64.b64decode(secret[key]))
    deployment = client.AppsV1Api(rig.api).read_namespaced_deployment(WEBHOOK, SYSTEM_NAMESPACE)
    maps = [v.config_map.name for v in deployment.spec.template.spec.volumes or []
            if v.config_map is not None and v.config_map.name.startswith("gpugate-policies")]
    assert len(maps) == 1, f"the webhook Deployment mounts policies from {maps}"
    for name, text in (core.read_namespaced_config_map(maps[0], SYSTEM_NAMESPACE).data or {}).items():
        (policies / name).write_text(text)
    with socket.socket() as probe:  # fail early and plainly when port 443 is not ours to bind
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((address, port))
    context = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
    server_name = f"{WEBHOOK}.{SYSTEM_NAMESPACE}.svc"

    def ready(_: object) -> bool:
        with socket.create_connection((address, port), timeout=2) as raw, \
                context.wrap_socket(raw, server_hostname=server_name) as tls:
            tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return tls.recv(64).startswith(b"HTTP/1.1 200")

    launch = processes.Launch(
        name="gpugate-serve", ports=0,
        command=lambda _: [str(GPUGATE), "serve", "--bind", f"{address}:{port}", "--cert", str(workdir / "tls.crt"),
                           "--key", str(workdir / "tls.key"), "--policies", str(policies), "--workers", "1",
                           "--drain-seconds", "0.5"],
        probe=ready, timeout=60)
    server = processes.start(launch, rig.workdir)
    try:
        yield address
    finally:
        server.stop()
