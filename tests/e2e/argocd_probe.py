"""Manual probe, not a pytest test: does a real Argo CD sync an Application against this cluster?

Given the kubeconfig of a running kube-apiserver (admin credentials), it starts, as plain local
processes on 127.0.0.1:

* ``redis-server`` (Debian package ``redis-server``), no persistence;
* ``git daemon`` serving a throw-away repository with a kustomization and a Helm chart (one ConfigMap each);
* ``argocd-repo-server`` (plaintext gRPC, helm and kustomize from the e2e cache on its PATH);
* ``argocd-application-controller`` (``ARGOCD_FAKE_IN_CLUSTER=true``: the in-cluster destination
  ``https://kubernetes.default.svc`` is the cluster named by ``KUBECONFIG``);

installs the Argo CD CRDs of the pinned release, the ConfigMap/Secret/AppProject the controller
reads, applies two Applications with automated sync (kustomize and helm sources), and waits until
both are Synced and Healthy and their ConfigMaps exist. Every process is stopped by its PID at the end, also on failure.

    python -m tests.e2e.argocd_probe --kubeconfig /path/to/admin.kubeconfig [--keep] [--timeout 300]

The processes, flags and environment are :mod:`tests.e2e.argocd_harness`'s, shared with
``test_argocd.py``. Caveat: argocd-application-controller v3.2 serves its metrics/healthz on
``0.0.0.0:<--metrics-port>`` (hard-coded); run the probe inside a network namespace
(``unshare -n``, ``ip link set lo up``) when nothing may listen beyond loopback.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tests.e2e import argocd_harness as harness
from tests.e2e import gitops_binaries

# Application name -> (path in the git repo, ConfigMap it renders); "kustomize" and "helm" sources.
APPS = {"gpugate-probe": ("app", "gpugate-probe"), "gpugate-probe-helm": ("chart", "gpugate-probe-helm")}
TARGET_NAMESPACE = "gpugate-probe"


def make_git_repo(root: Path) -> None:
    """root/probe.git: a bare repository whose main branch has a kustomization (app/) and a chart (chart/)."""
    work = root / "work"
    (work / "app").mkdir(parents=True)
    (work / "app" / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- configmap.yaml\n")
    (work / "app" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpugate-probe\ndata:\n  hello: argocd\n")
    (work / "chart" / "templates").mkdir(parents=True)
    (work / "chart" / "Chart.yaml").write_text("apiVersion: v2\nname: gpugate-probe\nversion: 0.1.0\n")
    (work / "chart" / "values.yaml").write_text("greeting: helm\n")
    (work / "chart" / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n"
        "data:\n  hello: {{ .Values.greeting | quote }}\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n")
    git = ["git", "-c", "user.name=probe", "-c", "user.email=probe@localhost", "-c", "commit.gpgsign=false"]
    harness.run(git + ["init", "-q", "-b", "main", str(work)])
    harness.run(git + ["-C", str(work), "add", "."])
    harness.run(git + ["-C", str(work), "commit", "-q", "-m", "probe"])
    harness.run(["git", "clone", "-q", "--bare", str(work), str(root / "probe.git")])


def default_project(namespace: str) -> dict:
    """The `default` AppProject (argocd-server creates it on start; the probe runs no server)."""
    return {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": {
            "sourceRepos": ["*"],
            "destinations": [{"server": "*", "namespace": "*"}],
            "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
        },
    }


def application(namespace: str, repo_url: str, name: str, path: str) -> dict:
    return {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "project": "default",
            "source": {"repoURL": repo_url, "targetRevision": "main", "path": path},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": TARGET_NAMESPACE},
            "syncPolicy": {"automated": {"prune": True, "selfHeal": True},
                           "syncOptions": ["CreateNamespace=true"]},
        },
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--kubeconfig", required=True, type=Path)
    ap.add_argument("--namespace", default="argocd", help="namespace Argo CD runs in (created)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, repo)")
    args = ap.parse_args(argv)
    kubeconfig = args.kubeconfig.resolve()
    ns = args.namespace

    for tool in ("redis-server", "git", "kubectl"):
        if shutil.which(tool) is None:
            print(f"missing {tool} on PATH (apt-get install -y redis-server git; kubectl)", file=sys.stderr)
            return 2
    t0 = time.monotonic()
    bins = gitops_binaries.paths() or gitops_binaries.build()
    print(f"binaries: {json.dumps({k: str(v) for k, v in bins.items()})}", flush=True)

    work = Path(tempfile.mkdtemp(prefix="gg-argocd-"))
    (work / "git").mkdir()
    kubectl = harness.Kubectl(kubeconfig)
    daemon = harness.GitDaemon(work / "git", work)
    argocd = harness.ArgoCD(kubeconfig=kubeconfig, workdir=work / "argocd", binaries=bins, namespace=ns,
                            controller_args=("--app-resync", "30", "--self-heal-timeout-seconds", "2",
                                             "--status-processors", "2", "--operation-processors", "2"))
    ok = False
    try:
        harness.install_crds(kubectl)
        harness.install_settings(kubectl, ns)
        kubectl.apply_objects([default_project(ns)])
        make_git_repo(work / "git")
        daemon.start()
        repo_url = daemon.url("probe.git")
        harness.run(["git", "ls-remote", repo_url])
        argocd.start()
        print(f"Argo CD up after {time.monotonic() - t0:.1f} s (logs in {argocd.logs})", flush=True)

        t_app = time.monotonic()
        kubectl.apply_objects([application(ns, repo_url, name, path) for name, (path, _) in APPS.items()])
        watch = harness.ApplicationWatch(kubeconfig, ns).start()
        try:
            watch.wait(lambda states: all(states.get(a) is not None and states[a].sync == "Synced"
                                          and states[a].health == "Healthy" for a in APPS),
                       timeout=args.timeout, what="Applications Synced+Healthy", explain=argocd.logs_tail)
        finally:
            watch.stop()
            print(f"application status:\n{watch.timeline(t_app)}", flush=True)
        for _, cm_name in APPS.values():
            cm = kubectl.json("-n", TARGET_NAMESPACE, "get", "configmap", cm_name)
            tracking = cm["metadata"].get("annotations", {}).get("argocd.argoproj.io/tracking-id")
            print(f"ConfigMap {TARGET_NAMESPACE}/{cm_name} data={cm.get('data')} tracking-id={tracking}")
        print(f"PROBE OK: Synced+Healthy {time.monotonic() - t_app:.1f} s after apply, "
              f"{time.monotonic() - t0:.1f} s in total", flush=True)
        ok = True
        return 0
    except Exception as exc:  # report, dump logs, stop everything
        traceback.print_exc()
        print(f"PROBE FAILED: {exc}", file=sys.stderr, flush=True)
        print(argocd.logs_tail(40), flush=True)
        return 1
    finally:
        argocd.stop()
        daemon.stop()
        if args.keep or not ok:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
