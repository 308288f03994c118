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

Caveat: argocd-application-controller v3.2 serves its metrics/healthz on ``0.0.0.0:<--metrics-port>``
(hard-coded); run the probe inside a network namespace (``unshare -n``, ``ip link set lo up``)
when nothing may listen beyond loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from pathlib import Path

from tests.e2e import gitops_binaries

ARGOCD_MODULE = "github.com/argoproj/argo-cd/v3"
# Application name -> (path in the git repo, ConfigMap it renders); "kustomize" and "helm" sources.
APPS = {"gpugate-probe": ("app", "gpugate-probe"), "gpugate-probe-helm": ("chart", "gpugate-probe-helm")}
TARGET_NAMESPACE = "gpugate-probe"
LABEL_PART_OF = {"app.kubernetes.io/part-of": "argocd"}
CRD_PLURALS = ("applications", "appprojects", "applicationsets")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float, procs: Processes) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.assert_alive()
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def tcp_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as r:  # plain http on loopback
        return r.status == 200


def redis_pong(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")


class Processes:
    """Started processes, stopped by PID in reverse order."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.items: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None):
        log = self.logdir / f"{name}.log"
        out = open(log, "wb")
        print(f"start {name}: {' '.join(cmd)}", flush=True)
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                stdin=subprocess.DEVNULL)
        out.close()
        self.items.append((name, proc, log))
        return proc

    def assert_alive(self) -> None:
        for name, proc, log in self.items:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} (pid {proc.pid}) exited with {proc.returncode}:\n{tail(log)}")

    def stop_all(self) -> None:
        for name, proc, _ in reversed(self.items):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            print(f"stopped {name} (pid {proc.pid}, exit {proc.returncode})", flush=True)

    def dump_logs(self, lines: int = 40) -> None:
        for name, _, log in self.items:
            print(f"----- {name}: last {lines} lines of {log}\n{tail(log, lines)}", flush=True)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run(cmd: list[str], **kw) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def argocd_crds() -> list[Path]:
    """The CRDs shipped in the pinned Argo CD module (same release as the binary)."""
    version = gitops_binaries.required_version(
        (gitops_binaries.TOOLCHAIN / "argocd" / "go.mod").read_text(), ARGOCD_MODULE)
    modcache = Path(run(["go", "env", "GOMODCACHE"]).strip())
    crds = modcache / f"{ARGOCD_MODULE}@{version}" / "manifests" / "crds"
    files = sorted(crds.glob("*-crd.yaml"))
    if not files:
        raise RuntimeError(f"no Argo CD CRDs in {crds}; run `python -m tests.e2e.gitops_binaries build`")
    return files


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
    run(git + ["init", "-q", "-b", "main", str(work)])
    run(git + ["-C", str(work), "add", "."])
    run(git + ["-C", str(work), "commit", "-q", "-m", "probe"])
    run(["git", "clone", "-q", "--bare", str(work), str(root / "probe.git")])


def argocd_objects(namespace: str) -> list[dict]:
    """What controller + repo server read: argocd-cm (required, and only found with the part-of label),
    argocd-secret (optional for these two; the API server needs it) and the `default` AppProject."""
    meta = lambda name: {"name": name, "namespace": namespace, "labels": dict(LABEL_PART_OF)}  # noqa: E731
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("argocd-cm"), "data": {}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": meta("argocd-secret"), "type": "Opaque"},
        {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": "default", "namespace": namespace},
            "spec": {
                "sourceRepos": ["*"],
                "destinations": [{"server": "*", "namespace": "*"}],
                "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
            },
        },
    ]


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    for sub in ("logs", "git", "tmp-repo", "tmp-ctrl", "tls", "ssh", "gpg", "home", "conf"):
        (work / sub).mkdir()
    procs = Processes(work / "logs")
    kubectl = ["kubectl", "--kubeconfig", str(kubeconfig)]

    def apply(objs: list[dict]) -> None:
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        run(kubectl + ["apply", "-f", "-"], input=doc)

    ok = False
    try:
        # --- cluster objects Argo CD needs before it starts
        run(kubectl + ["apply", "--server-side", "-f", ",".join(str(p) for p in argocd_crds())])

        def established() -> bool:  # `kubectl wait` fails while a fresh CRD has no conditions yet
            out = run(kubectl + ["get", "crd", "-o", "json"] + [f"{p}.argoproj.io" for p in CRD_PLURALS])
            conds = [c for crd in json.loads(out)["items"] for c in (crd.get("status") or {}).get("conditions") or []]
            return sum(c["type"] == "Established" and c["status"] == "True" for c in conds) == len(CRD_PLURALS)

        wait_for("Argo CD CRDs Established", established, 60, procs)
        apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])

        # --- redis
        redis_port = free_port()
        procs.start("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", str(work / "tmp-ctrl")])
        wait_for("redis", lambda: redis_pong(redis_port), 20, procs)

        # --- git daemon (run as git-daemon itself, so that the PID we stop is the listener)
        make_git_repo(work / "git")
        git_port = free_port()
        git_daemon = str(Path(run(["git", "--exec-path"]).strip()) / "git-daemon")
        procs.start("git-daemon", [git_daemon, "--reuseaddr", "--listen=127.0.0.1", f"--port={git_port}",
                                   f"--base-path={work / 'git'}", "--export-all", "--informative-errors",
                                   str(work / "git")])
        wait_for("git daemon", lambda: tcp_open(git_port), 20, procs)
        repo_url = f"git://127.0.0.1:{git_port}/probe.git"
        run(["git", "ls-remote", repo_url])

        apply(argocd_objects(ns))

        # --- environment shared by both Argo CD components
        base_env = {
            "PATH": os.pathsep.join([str(bins["helm"].parent), str(bins["kustomize"].parent),
                                     os.environ.get("PATH", "/usr/bin:/bin")]),
            "HOME": str(work / "home"),
            "ARGOCD_GPG_ENABLED": "false",
            "ARGOCD_TLS_DATA_PATH": str(work / "tls"),
            "ARGOCD_SSH_DATA_PATH": str(work / "ssh"),
            "ARGOCD_GNUPGHOME": str(work / "gpg"),
            "ARGOCD_APP_CONF_PATH": str(work / "conf"),
        }

        # --- repo server
        repo_port, repo_metrics = free_port(), free_port()
        procs.start("repo-server", [
            str(bins["argocd"]), "--loglevel", "info", "--logformat", "text",
            "--address", "127.0.0.1", "--port", str(repo_port),
            "--metrics-address", "127.0.0.1", "--metrics-port", str(repo_metrics),
            "--disable-tls", "--redis", f"127.0.0.1:{redis_port}",
        ], env=base_env | {
            "ARGOCD_BINARY_NAME": "argocd-repo-server",
            "TMPDIR": str(work / "tmp-repo"),
            "ARGOCD_ASK_PASS_SOCK": str(work / "askpass.sock"),
            "ARGOCD_EXEC_TIMEOUT": "90s",
        })
        wait_for("repo server", lambda: http_ok(f"http://127.0.0.1:{repo_metrics}/healthz?full=true"), 60, procs)

        # --- application controller
        ctrl_metrics = free_port()
        procs.start("application-controller", [
            str(bins["argocd"]), "--loglevel", "info", "--logformat", "text",
            "--kubeconfig", str(kubeconfig), "--namespace", ns,
            "--redis", f"127.0.0.1:{redis_port}",
            "--repo-server", f"127.0.0.1:{repo_port}", "--repo-server-plaintext",
            "--metrics-port", str(ctrl_metrics),
            "--app-resync", "30", "--self-heal-timeout-seconds", "2",
            "--status-processors", "2", "--operation-processors", "2",
        ], env=base_env | {
            "ARGOCD_BINARY_NAME": "argocd-application-controller",
            "ARGOCD_FAKE_IN_CLUSTER": "true",
            "KUBECONFIG": str(kubeconfig),
            "TMPDIR": str(work / "tmp-ctrl"),
        })
        wait_for("application controller", lambda: http_ok(f"http://127.0.0.1:{ctrl_metrics}/healthz"), 90, procs)
        print(f"Argo CD up after {time.monotonic() - t0:.1f} s", flush=True)

        # --- the Applications
        t_app = time.monotonic()
        apply([application(ns, repo_url, name, path) for name, (path, _) in APPS.items()])
        last = {}

        def synced_healthy() -> bool:
            out = run(kubectl + ["-n", ns, "get", "application", "-o", "json"] + list(APPS))
            for app in json.loads(out)["items"]:
                status = app.get("status") or {}
                last[app["metadata"]["name"]] = {
                    "sync": (status.get("sync") or {}).get("status"),
                    "health": (status.get("health") or {}).get("status"),
                    "operation": (status.get("operationState") or {}).get("phase"),
                    "source": status.get("sourceType"),
                    "conditions": [c.get("message") for c in status.get("conditions") or []],
                }
            return all(last.get(a, {}).get("sync") == "Synced" and last[a].get("health") == "Healthy" for a in APPS)

        try:
            wait_for("Applications Synced+Healthy", synced_healthy, args.timeout, procs)
        finally:
            print(f"application status: {json.dumps(last)}", flush=True)
        for _, cm_name in APPS.values():
            cm = json.loads(run(kubectl + ["-n", TARGET_NAMESPACE, "get", "configmap", cm_name, "-o", "json"]))
            tracking = cm["metadata"].get("annotations", {}).get("argocd.argoproj.io/tracking-id")
            print(f"ConfigMap {TARGET_NAMESPACE}/{cm_name} data={cm.get('data')} tracking-id={tracking}")
        print(f"PROBE OK: Synced+Healthy {time.monotonic() - t_app:.1f} s after apply, "
              f"{time.monotonic() - t0:.1f} s in total", flush=True)
        ok = True
        return 0
    except Exception as exc:  # report, dump logs, stop everything
        traceback.print_exc()
        print(f"PROBE FAILED: {exc}", file=sys.stderr, flush=True)
        procs.dump_logs()
        return 1
    finally:
        procs.stop_all()
        if args.keep or not ok:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
