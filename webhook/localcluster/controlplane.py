"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, started from the binaries of :mod:`webhook.localcluster.binaries`, no kubelets.

Why real binaries and not a fake API server: the e2e tests exist to check what only the real
thing does: the admission chain (LimitRanger, ServiceAccount, Priority, DefaultTolerationSeconds,
then our webhook), the scheduler's filters and scores, the Job and garbage-collector controllers.
Nodes are API objects kept alive by :mod:`webhook.localcluster.fakekubelet`.

Everything lives in one temporary folder (certificates, kubeconfigs, etcd's data, one log per
component) and every process is stopped by PID in :meth:`ControlPlane.stop`, which also runs at
interpreter exit if a caller forgot. Usage::

    with ControlPlane(binaries.paths()) as plane:
        print(plane.kubeconfig)
"""

from __future__ import annotations

import atexit
import http.client
import shutil
import ssl
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.localcluster import pki, processes
from webhook.localcluster.binaries import Binaries

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What a test may want to change about the control plane; defaults suit the smoke tests."""

    service_cidr: str = "10.96.0.0/16"
    """Required by the API server (no default), and it allocates the ``kubernetes`` Service from it."""
    apiserver_args: tuple[str, ...] = ()
    """Extra flags, e.g. ``("--enable-admission-plugins=ExtendedResourceToleration",)``."""
    controller_manager_args: tuple[str, ...] = ()
    scheduler_args: tuple[str, ...] = ()
    """Extra flags for every kube-scheduler started, e.g. ``("--v=10",)`` to log each node's score."""
    ready_timeout: float = 120.0
    """Two busy cores can take a while to start an API server; a healthy one needs ~5-10 s."""
    keep_workdir: bool = False
    """Leave certificates, data and logs behind after :meth:`ControlPlane.stop`, for a post-mortem."""


class ControlPlane:
    """etcd -> kube-apiserver -> kube-controller-manager -> kube-scheduler, in a temp folder.

    Attributes a test uses: ``kubeconfig`` (admin, system:masters), ``server`` (the https URL),
    ``ca`` (sign more certificates the API server trusts), ``workdir``; methods
    :meth:`start_scheduler` and :meth:`logs_tail`.
    """

    def __init__(self, binaries: Binaries, *, settings: Settings | None = None,
                 workdir: Path | None = None) -> None:
        self.binaries = binaries
        self.settings = settings or Settings()
        # Only a folder we made is ours to delete; a caller's folder is left as it is.
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="gpugate-e2e-"))
        self.logs = self.workdir / "logs"
        self.pki_dir = self.workdir / "pki"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.server = ""
        self.processes: list[processes.Process] = []
        self._etcd_url = ""
        self._schedulers = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        """Start every component in order and wait until the cluster takes pods; on any failure
        stop what was started and raise with the logs' tails."""
        for folder in (self.logs, self.pki_dir):
            folder.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._make_credentials()
            self._start_etcd()
            self._start_apiserver()
            self._start_controller_manager()
            self.start_scheduler(_default_scheduler_config(self.kubeconfig), name="kube-scheduler")
            self._wait_for_defaults()
        except BaseException as error:
            tails = self.logs_tail()
            self.stop()
            if isinstance(error, Exception):
                raise processes.StartError(f"control plane did not start: {error}\n\n{tails}") from error
            raise
        return self

    def stop(self) -> None:
        """Stop every process we started, newest first (schedulers before the API server before
        etcd), each by PID with SIGTERM then SIGKILL. Safe to call twice."""
        atexit.unregister(self.stop)
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if self._owns_workdir and not self.settings.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- for tests -------------------------------------------------------------------------

    def start_scheduler(self, config: Mapping[str, Any] | str, *, name: str | None = None,
                        leader_elect: bool | None = None) -> processes.Process:
        """Start one more kube-scheduler from a KubeSchedulerConfiguration (a mapping or YAML).

        ``clientConnection.kubeconfig`` is filled in with the admin kubeconfig when absent, so the
        project's in-cluster config (manifests/scheduler/scheduler-config.yaml) can be passed as is;
        ``leader_elect`` overrides ``leaderElection.leaderElect`` (its Lease namespace must exist
        when left on). The process is stopped with the control plane, or earlier by ``.stop()``.
        """
        document = dict(yaml.safe_load(config) if isinstance(config, str) else config)
        connection = dict(document.get("clientConnection") or {})
        connection.setdefault("kubeconfig", str(self.kubeconfig))
        document["clientConnection"] = connection
        if leader_elect is not None:
            document["leaderElection"] = {**(document.get("leaderElection") or {}), "leaderElect": leader_elect}
        self._schedulers += 1
        name = name or f"kube-scheduler-{self._schedulers}"
        path = self.workdir / f"{name}.config.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        process = processes.start(processes.Launch(
            name=name, ports=1, timeout=self.settings.ready_timeout,
            command=lambda ports: [
                str(self.binaries.kube_scheduler), f"--config={path}",
                f"--bind-address={LOOPBACK}", f"--secure-port={ports[0]}",
                *_delegated_auth(self.kubeconfig), *self.settings.scheduler_args,
            ],
            probe=lambda ports: _https_ok(ports[0], "/healthz"),
        ), self.logs)
        self.processes.append(process)
        return process

    def logs_tail(self, lines: int = 25) -> str:
        """The last lines of every component's log, for a failure message."""
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            parts.append(f"--- {log.name} (last {lines} lines) ---\n{processes.tail(log, lines)}")
        return "\n".join(parts)

    def admin_ssl_context(self) -> ssl.SSLContext:
        """TLS as the admin user, trusting only this cluster's CA (no environment bundles)."""
        context = ssl.create_default_context(cafile=str(self.ca.files.cert))
        context.load_cert_chain(str(self.admin.cert), str(self.admin.key))
        return context

    def get(self, path: str) -> tuple[int, bytes]:
        """One GET to the API server as admin: the raw status and body (for probes and tests)."""
        port = int(self.server.rsplit(":", 1)[1])
        return _https_get(port, path, self.admin_ssl_context())

    # -- steps -----------------------------------------------------------------------------

    def _make_credentials(self) -> None:
        self.ca = pki.CertificateAuthority.create(self.pki_dir)
        self.serving = self.ca.issue(self.pki_dir, "apiserver", common_name="kube-apiserver",
                                     dns_names=("localhost", "kubernetes", "kubernetes.default",
                                                "kubernetes.default.svc"),
                                     ip_addresses=(LOOPBACK,), server=True)
        self.admin = self.ca.issue(self.pki_dir, "admin", common_name="gpugate-e2e-admin",
                                   organizations=("system:masters",), client=True)
        self.service_accounts = pki.ServiceAccountKeys.create(self.pki_dir)

    def _start_etcd(self) -> None:
        data = self.workdir / "etcd"

        def command(ports: Sequence[int]) -> list[str]:
            client, peer = (f"http://{LOOPBACK}:{port}" for port in ports)
            return [
                str(self.binaries.etcd), "--name=e2e", f"--data-dir={data}",
                f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=e2e={peer}",
                # A test cluster lives minutes: durability buys nothing and fsync costs seconds.
                "--unsafe-no-fsync=true",
                "--auto-compaction-retention=1", "--log-level=warn",
            ]

        etcd = processes.start(processes.Launch(
            name="etcd", ports=2, command=command, timeout=self.settings.ready_timeout,
            probe=lambda ports: _http_ok(ports[0], "/health")), self.logs)
        self.processes.append(etcd)
        self._etcd_url = f"http://{LOOPBACK}:{etcd.ports[0]}"

    def _start_apiserver(self) -> None:
        def command(ports: Sequence[int]) -> list[str]:
            self.server = f"https://{LOOPBACK}:{ports[0]}"
            pki.write_kubeconfig(self.kubeconfig, server=self.server, ca=self.ca, user=self.admin)
            return [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={self._etcd_url}",
                f"--bind-address={LOOPBACK}", f"--secure-port={ports[0]}",
                # No default route on some machines: the API server could not pick an address.
                f"--advertise-address={LOOPBACK}",
                # ...and a loopback address is not valid in the `kubernetes` Endpoints: do not keep it.
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={self.serving.cert}", f"--tls-private-key-file={self.serving.key}",
                f"--client-ca-file={self.ca.files.cert}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.service_accounts.public_key}",
                f"--service-account-signing-key-file={self.service_accounts.private_key}",
                f"--service-cluster-ip-range={self.settings.service_cidr}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",  # the GPU Operator's daemon sets are privileged
                "--profiling=false",
                *self.settings.apiserver_args,
            ]

        apiserver = processes.start(processes.Launch(
            name="kube-apiserver", ports=1, command=command, timeout=self.settings.ready_timeout,
            probe=lambda ports: _https_ok(ports[0], "/readyz", self.admin_ssl_context())), self.logs)
        self.processes.append(apiserver)

    def _start_controller_manager(self) -> None:
        kcm = processes.start(processes.Launch(
            name="kube-controller-manager", ports=1, timeout=self.settings.ready_timeout,
            command=lambda ports: [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig}",
                *_delegated_auth(self.kubeconfig),
                f"--bind-address={LOOPBACK}", f"--secure-port={ports[0]}",
                "--leader-elect=false",
                # Signs the tokens of legacy token Secrets; the same key the API server verifies with.
                f"--service-account-private-key-file={self.service_accounts.private_key}",
                f"--root-ca-file={self.ca.files.cert}",
                f"--cluster-signing-cert-file={self.ca.files.cert}",
                f"--cluster-signing-key-file={self.ca.files.key}",
                "--profiling=false",
                *self.settings.controller_manager_args,
            ],
            probe=lambda ports: _https_ok(ports[0], "/healthz")), self.logs)
        self.processes.append(kcm)

    def _wait_for_defaults(self) -> None:
        """Ready for tests means: namespaces exist and the ServiceAccount admission plugin will
        find ``default`` (created by the controller manager), or every pod create is refused."""
        for path in ("/api/v1/namespaces/default", "/api/v1/namespaces/kube-node-lease",
                     "/api/v1/namespaces/default/serviceaccounts/default"):
            deadline = time.monotonic() + self.settings.ready_timeout
            while not self._answers(path):
                if time.monotonic() > deadline:
                    raise processes.StartError(f"GET {path} still fails after {self.settings.ready_timeout:.0f}s")
                time.sleep(0.1)


    def _answers(self, path: str) -> bool:
        try:
            return self.get(path)[0] == 200
        except OSError:
            return False


def _default_scheduler_config(kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        # One scheduler per cluster here; an election would only delay the first decision.
        "leaderElection": {"leaderElect": False},
    }


def _delegated_auth(kubeconfig: Path) -> list[str]:
    """How the controller manager and schedulers check callers of their own HTTPS port.

    The lookup of front-proxy settings is skipped: this API server has no front proxy, and the
    lookup would log an error about the missing request-header CA several times a second.
    """
    return [f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--authentication-skip-lookup=true"]


def _http_ok(port: int, path: str) -> bool:
    return processes.http_get(http.client.HTTPConnection(LOOPBACK, port, timeout=2), path)[0] == 200


def _https_ok(port: int, path: str, context: ssl.SSLContext | None = None) -> bool:
    return _https_get(port, path, context)[0] == 200


def _https_get(port: int, path: str, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """GET over TLS with ``http.client``: no proxy variables, no CA-bundle variables in the way.

    Without a context the peer is not verified: the controller manager and the schedulers serve
    /healthz with a self-signed certificate made in memory, on loopback.
    """
    if context is None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return processes.http_get(http.client.HTTPSConnection(LOOPBACK, port, timeout=5, context=context), path)
