"""Every health state of the GPU stack, reached in a real Argo CD.

Argo CD v3.2.11 (``argocd_harness``: redis, repo server, application controller, argocd-server
with ``--disable-auth`` on 127.0.0.1), its ``argocd-cm`` patched with the project's
``argocd/install/argocd-cm-health.yaml`` as docs/gitops.md says, syncs one Application from a
loopback git daemon: the ClusterPolicy and two NVIDIADriver pools (``canary``, ``a100-pool``) as
real custom resources of the GPU Operator's CRDs (``../shared/schemas``). No operator runs; the
test writes each object's ``status`` through the status subresource exactly as a health fixture
under ``argocd/health`` records it (each fixture's header names the operator code that writes
it), and Argo CD, whose gopher-lua runs our scripts, must then show the fixture's verdict:

1. a cluster without GPU nodes (there is none): Healthy, with that message;
2. a ClusterPolicy reconcile failure: Degraded, with the operator's error;
3. two pools whose selectors overlap (``gpu-node-7`` carries both pools' labels): Degraded, with
   the conflict;
4. an NVIDIADriver not ready during a rollout: Progressing;
5. the rollout done: Healthy.

Each state is read twice: ``argocd app get -o json`` (the CLI, through argocd-server) and
``/api/v1/applications/<app>`` plus ``.../resource-tree`` (the API the web UI reads). With
``GPUGATE_PICTURES_DIR`` set, the ``argocd app list`` and ``argocd app get -o tree=detailed``
text of each state (the tree view prints each resource's health message) is written there
(``tools/telemetry_pictures.py --only argocd`` renders it for docs/).

Kept apart from test_argocd.py (the full GitOps rig): this needs only one Application, so it
runs in about a minute on a control plane of its own (no GPU node unless a step adds one).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import argocd_harness as harness
from tests.e2e.local import own_control_plane
from tests.e2e.waiting import wait_until
from tests.prerequisites import missing
from webhook.localcluster.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
HEALTH = ROOT / "argocd" / "health" / "nvidia.com"
CM_PATCH = ROOT / "argocd" / "install" / "argocd-cm-health.yaml"
SCHEMAS = ROOT.parent / "shared" / "schemas"
NVIDIA_CRDS = ("nvidia.com_clusterpolicies.yaml", "nvidia.com_nvidiadrivers.yaml")
APP = "gpu-stack"
NAMESPACE = harness.NAMESPACE
PICTURES_ENV = "GPUGATE_PICTURES_DIR"
CANARY_LABEL = "gpugate.io/pool"
A100 = "NVIDIA-A100-SXM4-80GB"
DRIVERS = {"canary": {CANARY_LABEL: "canary"}, "a100-pool": {"nvidia.com/gpu.product": A100}}
"""The two pools and their node selectors: a node carrying both labels is selected twice."""
Obj = dict[str, Any]


def fixture(kind: str, name: str) -> Obj:
    """A health fixture's object (``argocd/health/nvidia.com/<kind>/testdata/<name>.yaml``)."""
    return dict(yaml.safe_load((HEALTH / kind / "testdata" / f"{name}.yaml").read_text()))


def expected(kind: str, name: str) -> dict[str, str]:
    """The verdict ``health_test.yaml`` gives that fixture."""
    for case in yaml.safe_load((HEALTH / kind / "health_test.yaml").read_text())["tests"]:
        if case["inputPath"] == f"testdata/{name}.yaml":
            return dict(case["healthStatus"])
    raise AssertionError(f"{kind}: no case for {name}")


def desired(kind: str, name: str, source: str, **spec: Any) -> Obj:
    """What Git holds: a fixture's spec under our name, without status or server-written metadata."""
    obj = fixture(kind, source)
    return {"apiVersion": obj["apiVersion"], "kind": kind, "metadata": {"name": name},
            "spec": {**obj["spec"], **spec}}


@dataclass
class Rig:
    cluster: Cluster
    kubectl: harness.Kubectl
    argocd: harness.ArgoCD
    binary: Path
    workdir: Path

    def cli(self, *args: str) -> str:
        """The argocd CLI against argocd-server (plaintext, no auth: the server runs --disable-auth)."""
        done = harness.run([str(self.binary), *args, "--server", f"{harness.LOOPBACK}:{self.argocd.server_port}",
                            "--plaintext", "--config", str(self.workdir / "cli-config")],
                           env={**os.environ, "ARGOCD_BINARY_NAME": "argocd", "HOME": str(self.workdir / "home")},
                           check=False, timeout=60)
        assert done.returncode == 0, f"argocd {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        return str(done.stdout)

    def write_status(self, kind: str, name: str, source: str) -> None:
        status = fixture(kind, source)["status"]
        self.kubectl("patch", kind.lower(), name, "--subresource=status", "--type=merge",
                     "-p", json.dumps({"status": status}))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A control plane of this module's own: 'a cluster without GPU nodes' must be one."""
    with own_control_plane("this module needs a control plane of its own (no GPU nodes)") as started:
        yield started


def _git_repo(base: Path) -> None:
    work = base / "stack"
    work.mkdir(parents=True)
    objects = [desired("ClusterPolicy", "cluster-policy", "healthy_ready"),
               *[desired("NVIDIADriver", name, "healthy_ready", default=False, nodeSelector=selector)
                 for name, selector in DRIVERS.items()]]
    for obj in objects:
        (work / f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml").write_text(yaml.safe_dump(obj))
    git = ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@localhost", "-c", "commit.gpgsign=false"]
    harness.run([*git, "init", "-q", "-b", "main", str(work)])
    harness.run([*git, "-C", str(work), "add", "."])
    harness.run([*git, "-C", str(work), "commit", "-q", "-m", "GPU stack"])


@pytest.fixture(scope="module")
def rig(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    if not all((SCHEMAS / f).is_file() for f in NVIDIA_CRDS):
        missing(f"{SCHEMAS} lacks the GPU Operator CRDs {NVIDIA_CRDS} (a fresh clone has no ../shared)")
    found = harness.rig_binaries()
    workdir = tmp_path_factory.mktemp("argocd-health")
    kubectl = harness.Kubectl(cluster.kubeconfig)
    harness.install_crds(kubectl)
    harness.install_settings(kubectl, NAMESPACE)
    kubectl("-n", NAMESPACE, "patch", "configmap", "argocd-cm", "--type", "merge", "--patch-file", str(CM_PATCH))
    kubectl("apply", "--server-side", "-f", ",".join(str(SCHEMAS / f) for f in NVIDIA_CRDS))
    harness.wait_established(cluster.kubeconfig, ["clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com"])
    (workdir / "git").mkdir()
    _git_repo(workdir / "git")
    daemon = harness.GitDaemon(workdir / "git", workdir).start()
    argocd = harness.ArgoCD(kubeconfig=cluster.kubeconfig, workdir=workdir / "argocd", binaries=found,
                            api_server=True, controller_args=("--app-resync", "30", "--self-heal-timeout-seconds", "2",
                                                              "--status-processors", "2",
                                                              "--operation-processors", "2"))
    try:
        argocd.start()
        kubectl.apply_objects([{
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": APP, "namespace": NAMESPACE},
            "spec": {"project": "default",
                     "source": {"repoURL": daemon.url("stack"), "targetRevision": "main", "path": "."},
                     "destination": {"server": "https://kubernetes.default.svc", "namespace": "gpu-operator"},
                     "syncPolicy": {"automated": {"prune": True, "selfHeal": True}}}}])
        yield Rig(cluster, kubectl, argocd, found["argocd"], workdir)
    finally:
        argocd.stop()
        daemon.stop()


@dataclass(frozen=True)
class View:
    """One reading of the Application: its health and each GPU object's health."""

    health: str | None
    resources: dict[str, dict[str, str]]

    @classmethod
    def of_app(cls, app: Obj) -> View:
        status = app.get("status") or {}
        return cls((status.get("health") or {}).get("status"),
                   {f"{r['kind']}/{r['name']}": {k: v for k, v in (r.get("health") or {}).items()
                                                 if k in ("status", "message")}
                    for r in status.get("resources") or [] if r.get("group") == "nvidia.com"})


def tree(rig: Rig) -> dict[str, dict[str, str]]:
    nodes = rig.argocd.api_json(f"/api/v1/applications/{APP}/resource-tree").get("nodes") or []
    return {f"{n['kind']}/{n['name']}": {k: v for k, v in (n.get("health") or {}).items()
                                         if k in ("status", "message")}
            for n in nodes if n.get("group") == "nvidia.com"}


STEPS: list[tuple[str, dict[str, str], str]] = [
    ("a cluster without GPU nodes", {"ClusterPolicy/cluster-policy": "healthy_noGPUNodes",
                                     "NVIDIADriver/canary": "healthy_ready", "NVIDIADriver/a100-pool": "healthy_ready"},
     "Healthy"),
    ("a ClusterPolicy reconcile failure", {"ClusterPolicy/cluster-policy": "degraded_reconcileFailed"}, "Degraded"),
    ("two pools whose selectors overlap", {"ClusterPolicy/cluster-policy": "healthy_ready",
                                           "NVIDIADriver/canary": "degraded_conflictingNodeSelector",
                                           "NVIDIADriver/a100-pool": "degraded_conflictingNodeSelector"},
     "Degraded"),
    ("an NVIDIADriver not ready during a rollout", {"NVIDIADriver/canary": "progressing_driverNotReady",
                                                    "NVIDIADriver/a100-pool": "healthy_ready"}, "Progressing"),
    ("the rollout done", {"NVIDIADriver/canary": "healthy_ready"}, "Healthy"),
]


def cli_view(rig: Rig) -> View:
    return View.of_app(json.loads(rig.cli("app", "get", APP, "-o", "json")))


def wait_for_view(rig: Rig, want: View, state: str) -> None:
    """Until ``argocd app get -o json`` shows ``want``, then argocd-server's API the same (its
    informer may lag the controller by a moment)."""
    wait_until(lambda: cli_view(rig) == want, timeout=60, interval=0.5, what=f"argocd app get showing {state}",
               explain=lambda: f"want {want}\ngot  {cli_view(rig)}\n{rig.argocd.logs_tail()}")
    wait_until(lambda: View.of_app(rig.argocd.api_json(f"/api/v1/applications/{APP}")) == want, timeout=20,
               interval=0.3, what=f"/api/v1/applications showing {state}")


def test_every_gpu_stack_health_state_shows_in_argocd_app_get_and_in_the_ui_api(rig: Rig) -> None:
    pictures = Path(os.environ[PICTURES_ENV]) if os.environ.get(PICTURES_ENV) else None
    why = rig.argocd.logs_tail
    objects = {"ClusterPolicy/cluster-policy", *(f"NVIDIADriver/{name}" for name in DRIVERS)}
    wait_until(lambda: cli_view(rig).resources.keys() == objects,
               timeout=180, interval=1.0, what="the Application synced with the GPU objects", explain=why)
    fixtures: dict[str, str] = {}
    timings: dict[str, float] = {}
    for index, (state, writes, app_health) in enumerate(STEPS, start=1):
        if state == "two pools whose selectors overlap":
            # The node both pools select, as the operator's validator found it.
            rig.cluster.add_gpu_node("gpu-node-7", product=A100, labels={CANARY_LABEL: "canary"})
        if state == "a cluster without GPU nodes":
            gpu_nodes = [n.metadata.name for n in rig.cluster.core().list_node().items
                         if "nvidia.com/gpu" in (n.status.capacity or {})]
            assert gpu_nodes == [], gpu_nodes
        started = time.monotonic()
        for key, source in writes.items():
            kind, name = key.split("/")
            rig.write_status(kind, name, source)
        fixtures.update(writes)
        want = View(app_health, {key: expected(key.split("/")[0], source) for key, source in fixtures.items()})
        wait_for_view(rig, want, state)
        timings[state] = round(time.monotonic() - started, 1)
        assert tree(rig) == want.resources, state
        listed = {a["metadata"]["name"]: a["status"]["health"]["status"]
                  for a in rig.argocd.api_json("/api/v1/applications").get("items") or []}
        assert listed == {APP: app_health}
        # What a person reads: the tree view prints each resource's health message as its REASON.
        detailed = rig.cli("app", "get", APP, "-o", "tree=detailed")
        assert all(h["message"] in detailed for h in want.resources.values() if h.get("message")), detailed
        if pictures is not None:
            pictures.mkdir(parents=True, exist_ok=True)
            (pictures / f"{index}.txt").write_text(
                f"# {state}\n$ argocd app list\n{rig.cli('app', 'list')}\n"
                f"$ argocd app get {APP} -o tree=detailed\n{detailed}")
    print(f"\nArgo CD showed each state this long after its status was written (s): {timings}")
