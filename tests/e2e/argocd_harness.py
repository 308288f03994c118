"""A real Argo CD (built from its Go module) as local processes on 127.0.0.1, plus the Git and Helm
repositories it reads from, against a kubeconfig.

Why a module of its own: ``argocd_probe.py`` (by hand) and ``test_argocd.py`` (CI) run the same
Argo CD, and the flags and environment that make it work without a cluster to run in are facts
learnt once (v3.2.11):

* one multi-call binary; ``ARGOCD_BINARY_NAME`` picks the component
  (argo-cd ``cmd/main.go``);
* ``ARGOCD_FAKE_IN_CLUSTER=true`` + ``KUBECONFIG``: the in-cluster destination
  ``https://kubernetes.default.svc`` is the cluster the kubeconfig names
  (argo-cd ``util/db/cluster.go`` ``getLocalCluster`` / ``util/kube`` in-cluster fallback);
* ``--repo-server-plaintext`` on the clients, ``--disable-tls`` on the repo server, no Dex;
* ``ARGOCD_ASK_PASS_SOCK`` per instance (the repo server's git askpass socket, default
  ``/tmp/reposerver-ask-pass.sock``, would collide between two runs);
* ``ARGOCD_GPG_ENABLED=false`` (no gpg-agent), data paths under a temp folder;
* ``argocd-cm`` must carry the label ``app.kubernetes.io/part-of=argocd`` or the settings
  manager does not find it (argo-cd ``util/settings/settings.go`` informer selector);
* the CRDs of the same release, applied server-side (the ApplicationSet CRD is too large for
  client-side apply's last-applied annotation);
* the application controller's metrics/healthz listener binds ``0.0.0.0:<--metrics-port>``:
  ``controller/appcontroller.go`` (v3.2.11, line 319) formats ``"0.0.0.0:%d"`` and there is no
  flag for the address. Accepted: it serves only metrics and health, on a random port, for the
  few minutes a test runs (run inside ``unshare -n`` when even that must not happen).

Every process is started through :mod:`webhook.localcluster.processes` (free ports on 127.0.0.1, retried on a
port race, its own session, stopped by PID with SIGTERM then SIGKILL).
"""

from __future__ import annotations

import functools
import http.client
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config

from tests.e2e import gitops_binaries
from tests.e2e.waiting import WatchThread
from tests.prerequisites import missing
from webhook.localcluster import processes
from webhook.localcluster.fakekubelet import json_lines

Obj = dict[str, Any]

ARGOCD_MODULE = "github.com/argoproj/argo-cd/v3"
NAMESPACE = "argocd"
GROUP, VERSION = "argoproj.io", "v1alpha1"
CRD_PLURALS = ("applications", "appprojects", "applicationsets")
REFRESH_ANNOTATION = "argocd.argoproj.io/refresh"
LOOPBACK = "127.0.0.1"


# --- small process and HTTP helpers ----------------------------------------------------------

def run(cmd: Sequence[str], *, input: str | None = None, env: Mapping[str, str] | None = None,
        cwd: Path | None = None, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; a failure raises with its output (what a test report needs)."""
    result = subprocess.run(list(cmd), input=input, capture_output=True, text=True, env=dict(env) if env else None,
                            cwd=cwd, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result


def http_ok(url: str, timeout: float = 2.0) -> bool:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # plain http on loopback only
        return bool(response.status == 200)


def tcp_open(port: int) -> bool:
    with socket.create_connection((LOOPBACK, port), timeout=1):
        return True


def redis_pong(port: int) -> bool:
    with socket.create_connection((LOOPBACK, port), timeout=1) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")


class Kubectl:
    """The real kubectl with one kubeconfig, for what is simplest said in kubectl's words
    (``apply --server-side``, ``patch --patch-file``, ``apply -k``)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, input: str | None = None, check: bool = True,
                 timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["KUBECONFIG"] = str(self.kubeconfig)
        return run(["kubectl", *args], input=input, env=env, timeout=timeout, check=check)

    def apply_objects(self, objects: Sequence[Obj], *args: str) -> None:
        self("apply", *args, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))

    def json(self, *args: str) -> Obj:
        return dict(json.loads(self(*args, "-o", "json").stdout))


# --- what Argo CD needs in the cluster -------------------------------------------------------

def module_dir() -> Path:
    """The pinned Argo CD module in the Go module cache (same release as the binary)."""
    version = gitops_binaries.required_version(
        (gitops_binaries.TOOLCHAIN / "argocd" / "go.mod").read_text(), ARGOCD_MODULE)
    modcache = Path(run(["go", "env", "GOMODCACHE"]).stdout.strip())
    return modcache / f"{ARGOCD_MODULE}@{version}"


def crd_files() -> list[Path]:
    files = sorted((module_dir() / "manifests" / "crds").glob("*-crd.yaml"))
    if not files:
        raise RuntimeError(f"no Argo CD CRDs under {module_dir()}; run `python -m tests.e2e.gitops_binaries build`")
    return files


def install_crds(kubectl: Kubectl, timeout: float = 60.0) -> None:
    """Apply the release's CRDs server-side and wait until each is Established."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", ",".join(str(p) for p in crd_files()))
    wait_established(kubectl.kubeconfig, [f"{plural}.{GROUP}" for plural in CRD_PLURALS], timeout)


def wait_established(kubeconfig: Path, names: Sequence[str], timeout: float = 60.0) -> None:
    """Until every named CRD is Established (``kubectl wait`` fails while a fresh CRD has no
    conditions yet, so read them)."""
    api = client.ApiextensionsV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    deadline = time.monotonic() + timeout
    while True:
        established = 0
        for name in names:
            try:
                crd = api.read_custom_resource_definition(name)
            except client.ApiException as error:
                if error.status != 404:
                    raise
                continue
            established += any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])
        if established == len(names):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRDs {list(names)} not Established after {timeout:.0f}s")
        time.sleep(0.2)


def install_settings(kubectl: Kubectl, namespace: str = NAMESPACE) -> None:
    """The namespace and the release's own default settings objects (``manifests/base/config``:
    argocd-cm with its ignoreResourceUpdates and exclusions, argocd-secret, argocd-rbac-cm, ...),
    as ``kubectl apply -k`` of Argo CD's install would create them."""
    kubectl.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    rendered = kubectl("kustomize", str(module_dir() / "manifests" / "base" / "config")).stdout
    kubectl("apply", "-n", namespace, "-f", "-", input=rendered)


# --- Git and Helm repositories on loopback ---------------------------------------------------

class GitDaemon:
    """``git daemon`` exporting every repository under ``base`` as ``git://127.0.0.1:PORT/<name>``.

    Started as ``git-daemon`` itself (not through ``git daemon``), so the PID we stop is the
    listener. A non-bare repository is served too (git daemon tries ``<name>/.git``), so commits
    made in a working clone are visible at once.
    """

    def __init__(self, base: Path, logs: Path) -> None:
        self.base, self.logs = base, logs
        self.process: processes.Process | None = None

    def start(self) -> GitDaemon:
        daemon = str(Path(run(["git", "--exec-path"]).stdout.strip()) / "git-daemon")
        launch = processes.Launch(
            name="git-daemon", ports=1,
            command=lambda ports: [daemon, "--reuseaddr", f"--listen={LOOPBACK}", f"--port={ports[0]}",
                                   f"--base-path={self.base}", "--export-all", "--informative-errors",
                                   str(self.base)],
            probe=lambda ports: tcp_open(ports[0]), timeout=20)
        self.process = processes.start(launch, self.logs)
        return self

    def url(self, name: str) -> str:
        assert self.process is not None, "start the daemon first"
        return f"git://{LOOPBACK}:{self.process.ports[0]}/{name}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class ChartRepository:
    """A folder served over plain HTTP on 127.0.0.1 (a Helm repository: index.yaml + .tgz files).

    In this process (a ThreadingHTTPServer), not a child: nothing to leak, stopped with the test.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.requests: list[str] = []
        self._server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> ChartRepository:
        owner = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                owner.requests.append(f"{self.command} {self.path} {args[1] if len(args) > 1 else ''}")

        handler = functools.partial(Handler, directory=str(self.directory))
        self._server = http.server.ThreadingHTTPServer((LOOPBACK, 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="chart-repo", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None, "start the repository first"
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


# --- Argo CD itself --------------------------------------------------------------------------

@dataclass
class ArgoCD:
    """Redis, repo server, application controller and (optionally) API server, started in order.

    ``controller_args`` are added to the controller's command line (resync and self-heal
    timings for tests). The API server runs ``--insecure --disable-auth`` on 127.0.0.1: it is
    the REST API the web UI reads (``/api/v1/applications``, ``.../resource-tree``).
    """

    kubeconfig: Path
    workdir: Path
    binaries: Mapping[str, Path]
    namespace: str = NAMESPACE
    controller_args: Sequence[str] = ()
    api_server: bool = False
    started: list[processes.Process] = field(default_factory=list)
    redis_port: int = 0
    repo_port: int = 0
    server_port: int = 0

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    def _env(self, binary_name: str, **extra: str) -> dict[str, str]:
        tools = [str(self.binaries["helm"].parent), str(self.binaries["kustomize"].parent)]
        return {
            "PATH": os.pathsep.join([*tools, os.environ.get("PATH", "/usr/bin:/bin")]),
            "HOME": str(self.workdir / "home"),
            "ARGOCD_BINARY_NAME": binary_name,
            "ARGOCD_GPG_ENABLED": "false",
            "ARGOCD_TLS_DATA_PATH": str(self.workdir / "tls"),
            "ARGOCD_SSH_DATA_PATH": str(self.workdir / "ssh"),
            "ARGOCD_GNUPGHOME": str(self.workdir / "gpg"),
            "ARGOCD_APP_CONF_PATH": str(self.workdir / "conf"),
            "TMPDIR": str(self.workdir / f"tmp-{binary_name}"),
            **extra,
        }

    def start(self) -> ArgoCD:
        for sub in ("logs", "home", "tls", "ssh", "gpg", "conf", "redis", "static", "tmp-argocd-repo-server",
                    "tmp-argocd-application-controller", "tmp-argocd-server"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start_redis()
            self._start_repo_server()
            # The controller and the API server each take seconds to become ready (informers,
            # cluster cache); start them side by side.
            with ThreadPoolExecutor(2) as pool:
                waits = [pool.submit(self._start_controller)]
                if self.api_server:
                    waits.append(pool.submit(self._start_server))
                for wait in waits:
                    wait.result()
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, launch: processes.Launch, env: dict[str, str] | None = None) -> int:
        """Start one component and record it for :meth:`stop` (the last started stops first); its first port."""
        process = processes.start(launch, self.logs, env=env)
        self.started.append(process)
        return process.ports[0]

    def _start_redis(self) -> None:
        launch = processes.Launch(
            name="redis", ports=1,
            command=lambda ports: ["redis-server", "--port", str(ports[0]), "--bind", LOOPBACK, "--save", "",
                                   "--appendonly", "no", "--dir", str(self.workdir / "redis")],
            probe=lambda ports: redis_pong(ports[0]), timeout=20)
        self.redis_port = self._launch(launch)

    def _start_repo_server(self) -> None:
        launch = processes.Launch(
            name="argocd-repo-server", ports=2,
            command=lambda ports: [
                str(self.binaries["argocd"]), "--loglevel", "info", "--logformat", "text",
                "--address", LOOPBACK, "--port", str(ports[0]),
                "--metrics-address", LOOPBACK, "--metrics-port", str(ports[1]),
                "--disable-tls", "--redis", f"{LOOPBACK}:{self.redis_port}"],
            probe=lambda ports: http_ok(f"http://{LOOPBACK}:{ports[1]}/healthz?full=true"), timeout=90)
        env = self._env("argocd-repo-server", ARGOCD_ASK_PASS_SOCK=str(self.workdir / "repo-askpass.sock"),
                        ARGOCD_EXEC_TIMEOUT="90s")
        self.repo_port = self._launch(launch, env)

    def _start_controller(self) -> None:
        # Metrics and healthz on 0.0.0.0:<port>: hard-coded in v3.2 (controller/appcontroller.go:319).
        launch = processes.Launch(
            name="argocd-application-controller", ports=1,
            command=lambda ports: [
                str(self.binaries["argocd"]), "--loglevel", "info", "--logformat", "text",
                "--kubeconfig", str(self.kubeconfig), "--namespace", self.namespace,
                "--redis", f"{LOOPBACK}:{self.redis_port}",
                "--repo-server", f"{LOOPBACK}:{self.repo_port}", "--repo-server-plaintext",
                "--metrics-port", str(ports[0]), *self.controller_args],
            probe=lambda ports: http_ok(f"http://{LOOPBACK}:{ports[0]}/healthz"), timeout=120)
        env = self._env("argocd-application-controller", ARGOCD_FAKE_IN_CLUSTER="true",
                        KUBECONFIG=str(self.kubeconfig))
        self._launch(launch, env)

    def _server_command(self, ports: Sequence[int]) -> list[str]:
        return [str(self.binaries["argocd"]), "--loglevel", "info", "--logformat", "text",
                "--kubeconfig", str(self.kubeconfig), "--namespace", self.namespace,
                "--insecure", "--disable-auth", "--address", LOOPBACK, "--port", str(ports[0]),
                "--metrics-address", LOOPBACK, "--metrics-port", str(ports[1]),
                "--redis", f"{LOOPBACK}:{self.redis_port}",
                "--repo-server", f"{LOOPBACK}:{self.repo_port}", "--repo-server-plaintext",
                "--staticassets", str(self.workdir / "static")]

    def _start_server(self) -> None:
        launch = processes.Launch(
            name="argocd-server", ports=2, command=self._server_command,
            probe=lambda ports: http_ok(f"http://{LOOPBACK}:{ports[0]}/healthz"), timeout=120)
        env = self._env("argocd-server", ARGOCD_FAKE_IN_CLUSTER="true", KUBECONFIG=str(self.kubeconfig),
                        ARGOCD_ASK_PASS_SOCK=str(self.workdir / "server-askpass.sock"))
        self.server_port = self._launch(launch, env)

    def stop(self) -> None:
        """Stop every component by PID, the last started first."""
        for process in reversed(self.started):
            process.stop()
        self.started.clear()

    def assert_alive(self) -> None:
        for process in self.started:
            if not process.running():
                raise RuntimeError(f"{process.name} (pid {process.pid}) exited with "
                                   f"{process.popen.returncode}:\n{process.tail(40)}")

    def logs_tail(self, lines: int = 30) -> str:
        return "\n".join(f"----- {p.name} (pid {p.pid}): last {lines} lines of {p.log}\n{p.tail(lines)}"
                         for p in self.started)

    # -- the REST API (only with api_server=True) ------------------------------------------

    def api(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """GET a path of argocd-server's API (no auth: --disable-auth)."""
        assert self.server_port, "started without the API server"
        return processes.http_get(http.client.HTTPConnection(LOOPBACK, self.server_port, timeout=timeout), path)

    def api_json(self, path: str) -> Obj:
        status, body = self.api(path)
        if status != 200:
            raise RuntimeError(f"GET {path} answered {status}: {body[:500]!r}")
        return dict(json.loads(body))


# --- reading and nudging Applications --------------------------------------------------------

def custom_api(kubeconfig: Path) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))


def applications(api: client.CustomObjectsApi, namespace: str = NAMESPACE) -> list[Obj]:
    response = api.list_namespaced_custom_object(GROUP, VERSION, namespace, "applications", _preload_content=False)
    return list(json.loads(response.data)["items"])


def refresh(api: client.CustomObjectsApi, name: str, namespace: str = NAMESPACE) -> None:
    """What Argo CD's Git webhook handler does for each app whose source is the pushed repository:
    a merge patch of the ``argocd.argoproj.io/refresh: normal`` annotation (argo-cd
    ``util/webhook/webhook.go`` HandleEvent -> ``util/argo/argo.go`` RefreshApp). The controller
    then compares with a forced revision resolution (``CompareWithLatestForceResolve``), so the new
    commit is seen at once instead of after the resync period and the revision cache."""
    api.patch_namespaced_custom_object(GROUP, VERSION, namespace, "applications", name,
                                       {"metadata": {"annotations": {REFRESH_ANNOTATION: "normal"}}})


@dataclass(frozen=True, slots=True)
class AppState:
    """What the UI's application tile shows: sync, health, the operation and its message."""

    sync: str | None
    health: str | None
    phase: str | None
    message: str | None
    revision: str | None
    """The sync revision (the first one for a multi-source app)."""
    operation_revision: str | None
    degraded: tuple[str, ...] = ()
    """``Kind name: message`` of every managed resource whose health is Degraded, as the controller
    persists it in ``status.resources`` (what the UI's red node badges show)."""

    @classmethod
    def of(cls, app: Obj) -> AppState:
        status = app.get("status") or {}
        sync = status.get("sync") or {}
        operation = status.get("operationState") or {}
        revisions = sync.get("revisions") or [sync.get("revision")]
        result = operation.get("syncResult") or {}
        op_revisions = result.get("revisions") or [result.get("revision")]
        degraded = tuple(sorted(f"{r.get('kind')} {r.get('name')}: {(r.get('health') or {}).get('message') or ''}"
                                for r in status.get("resources") or []
                                if (r.get("health") or {}).get("status") == "Degraded"))
        return cls(sync=sync.get("status"), health=(status.get("health") or {}).get("status"),
                   phase=operation.get("phase"), message=operation.get("message"),
                   revision=_git_revision(revisions), operation_revision=_git_revision(op_revisions),
                   degraded=degraded)

    def __str__(self) -> str:
        text = f"{self.sync}/{self.health} op={self.phase} ({self.message or ''}) rev={(self.revision or '')[:8]}"
        return text + (f" degraded: {'; '.join(self.degraded)}" if self.degraded else "")


def _git_revision(revisions: Sequence[str | None]) -> str | None:
    """The first revision that looks like a Git SHA (a multi-source app also lists the chart version)."""
    for revision in revisions:
        if revision and len(revision) == 40:
            return revision
    return next((r for r in revisions if r), None)


@dataclass(frozen=True, slots=True)
class Observation:
    at: float
    """time.monotonic() of this process when the watch delivered the change."""
    app: str
    state: AppState | None
    """None: the Application was deleted."""


class ApplicationWatch(WatchThread):
    """Every change of every Application's :class:`AppState`, from one list+watch.

    A watch, not polling: an app can be OutOfSync for a few milliseconds before auto-sync
    starts; the watch sees each status write the controller makes, in order.
    """

    def __init__(self, kubeconfig: Path, namespace: str = NAMESPACE) -> None:
        super().__init__("argocd-app-watch")
        self.api = custom_api(kubeconfig)
        self.namespace = namespace
        self.observations: list[Observation] = []
        self.created: dict[str, float] = {}
        self.errors: list[str] = []
        self.listeners: list[Callable[[str, AppState | None], None]] = []
        """Called (from the watch thread, holding no lock) with every change; must not block."""
        self._current: dict[str, AppState] = {}
        self._lock = threading.Condition()

    def current(self) -> dict[str, AppState]:
        with self._lock:
            return dict(self._current)

    def since(self, moment: float, app: str | None = None) -> list[Observation]:
        with self._lock:
            return [o for o in self.observations if o.at >= moment and (app is None or o.app == app)]

    def wait(self, predicate: Callable[[dict[str, AppState]], bool], *, timeout: float, what: str,
             explain: Callable[[], str] | None = None, stall: float | None = None) -> dict[str, AppState]:
        """Until ``predicate(current states)``; fails after ``timeout``, or after ``stall`` seconds
        without any change (a deadlock says so sooner than a long timeout). The stall counts from the
        later of the last change and the wait's start: Applications that sat still while the test did
        other work (a long ``gpugate stack canary``) are not a stall of what this wait awaits."""
        started = time.monotonic()
        deadline = started + timeout
        with self._lock:
            while True:
                states = dict(self._current)
                if predicate(states):
                    return states
                now = time.monotonic()
                last = max(self.observations[-1].at if self.observations else now, started)
                reason = None
                if now > deadline:
                    reason = f"timed out after {timeout:.0f}s"
                elif stall is not None and now - last > stall:
                    reason = f"no Application changed for {now - last:.0f}s"
                if reason:
                    detail = "\n".join(f"  {name}: {state}" for name, state in sorted(states.items()))
                    extra = f"\n{explain()}" if explain else ""
                    raise AssertionError(f"{reason} waiting for {what}; Applications now:\n{detail}{extra}")
                self._lock.wait(0.5)

    def timeline(self, since: float = 0.0, apps: Sequence[str] | None = None) -> str:
        lines = [f"{o.at - since:8.2f}s {o.app:20} {o.state if o.state else 'deleted'}"
                 for o in self.since(since) if apps is None or o.app in apps]
        return "\n".join(lines)

    def _record(self, name: str, state: AppState | None) -> None:
        with self._lock:
            if state is None:
                self._current.pop(name, None)
            elif self._current.get(name) == state:
                return
            else:
                self._current[name] = state
            self.observations.append(Observation(time.monotonic(), name, state))
            self._lock.notify_all()
        for listener in self.listeners:
            listener(name, state)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                listing = self.api.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "applications",
                                                                 _preload_content=False)
                body = json.loads(listing.data)
                for app in body["items"]:
                    self._seen(app)
                version = body["metadata"]["resourceVersion"]
                while version and not self._stopping.is_set():
                    version = self._watch(version)
            except Exception as error:  # kept for the failure message, then relist
                if not self._stopping.is_set():
                    self.errors.append(f"{time.strftime('%H:%M:%S')} {error!r}")
                    self._stopping.wait(0.5)

    def _seen(self, app: Obj) -> None:
        name = app["metadata"]["name"]
        with self._lock:
            self.created.setdefault(name, time.monotonic())
        self._record(name, AppState.of(app))

    def _watch(self, version: str) -> str | None:
        response: Any = self.api.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "applications", watch=True, resource_version=version,
            allow_watch_bookmarks=True, timeout_seconds=60, _preload_content=False)
        self._response = response
        try:
            for event in json_lines(response):
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    return None  # 410 Gone and friends: list again
                version = obj["metadata"]["resourceVersion"]
                if kind in ("ADDED", "MODIFIED"):
                    self._seen(obj)
                elif kind == "DELETED":
                    self._record(obj["metadata"]["name"], None)
        finally:
            self._response = None
            response.release_conn()
        return version


def rig_binaries() -> dict[str, Path]:
    """The cached GitOps binaries, once the tools a rig runs (redis-server, git, kubectl) are on PATH.

    Under ``CI`` missing binaries are built (minutes, once per machine); otherwise a missing tool or
    binary is :func:`tests.prerequisites.missing` (a skip naming the command that fixes it).
    """
    for tool in ("redis-server", "git", "kubectl"):
        if shutil.which(tool) is None:
            missing(f"{tool} is not on PATH (apt-get install -y redis-server git)")
    found = gitops_binaries.paths()
    if found is not None:
        return found
    if os.environ.get("CI") and shutil.which("go"):
        return gitops_binaries.build()
    missing("Argo CD, helm and kustomize are not built; run `python -m tests.e2e.gitops_binaries build` "
            "(Go module proxy, ~10 min cold)")
