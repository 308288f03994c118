"""The pieces tests/e2e/test_webhook.py builds on: the real ``gpugate serve``, its certificates,
the webhook configurations exactly as ``kubectl kustomize manifests/webhook`` renders them, a
second tiny mutating webhook, and a thread that keeps creating pods.

Why a module of its own: the test module stays a list of claims about the cluster; how a server
is started on 127.0.0.1, stopped by PID, restarted on the same port, or how a rendered
configuration is pointed at it lives here, once.

Nothing here edits what it tests: the configurations are the rendered ones with only
``clientConfig`` switched to ``url`` + ``caBundle`` (the API server cannot reach a Service on a
cluster without kube-proxy), the server is the ``gpugate`` console script of the venv.
"""

from __future__ import annotations

import atexit
import base64
import copy
import http.client
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.certs import pki
from webhook.localcluster import processes, webhooks
from webhook.localcluster.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
GPUGATE = Path(sys.executable).with_name("gpugate")
"""The console script installed next to the interpreter running the tests (the project's venv)."""
WEBHOOK_NAME = "gpugate-webhook"
SERVICE_NAMESPACE = "gpugate-system"
POLICY_ANNOTATION = "gpugate.io/policy"

Obj = dict[str, Any]


# --- rendering -------------------------------------------------------------------------------

def kubectl(cluster: Cluster, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """The real kubectl against the test cluster (KUBECONFIG set for this call only)."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    result = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, env=env,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def kustomize(directory: Path) -> list[Obj]:
    """``kubectl kustomize DIR``: what Argo CD (and a human with kubectl) would apply."""
    result = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kustomize_with_components(base: Path, components: Sequence[Path], workdir: Path) -> list[Obj]:
    """Render ``base`` with kustomize Components, as an overlay or an Argo CD Application would.

    A Component cannot be rendered alone; a throw-away overlay in ``workdir`` names the base and
    the components by relative path (kustomize loads other kustomizations from anywhere).
    """
    overlay = workdir / f"overlay-{secrets.token_hex(3)}"
    overlay.mkdir(parents=True)
    document = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, overlay)],
        "components": [os.path.relpath(component, overlay) for component in components],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return kustomize(overlay)


def find(documents: Sequence[Obj], kind: str, name: str | None = None) -> Obj:
    found = [d for d in documents if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''} in the rendering, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class RenderedWebhooks:
    """The two gpugate webhook configurations as a kustomization renders them."""

    mutating: Obj
    validating: Obj

    @classmethod
    def of(cls, documents: Sequence[Obj]) -> RenderedWebhooks:
        return cls(mutating=find(documents, "MutatingWebhookConfiguration", WEBHOOK_NAME),
                   validating=find(documents, "ValidatingWebhookConfiguration", WEBHOOK_NAME))

    def pointed_at(self, base_url: str, ca_pem: bytes) -> RenderedWebhooks:
        """The same configurations with only ``clientConfig`` replaced by ``url`` + ``caBundle``.

        The path comes from the rendered ``service.path``, so /mutate and /validate stay the
        manifest's choice.
        """
        return RenderedWebhooks(mutating=_with_url(self.mutating, base_url, ca_pem),
                                validating=_with_url(self.validating, base_url, ca_pem))

    def service_port(self, port: int) -> RenderedWebhooks:
        """The same configurations with only the Service port changed (for a loopback ExternalName)."""
        return RenderedWebhooks(mutating=_with_service_port(self.mutating, port),
                                validating=_with_service_port(self.validating, port))


def _with_url(config: Obj, base_url: str, ca_pem: bytes) -> Obj:
    return webhooks.pointed_at(config, base_url, ca_pem)


def _with_service_port(config: Obj, port: int) -> Obj:
    out = copy.deepcopy(config)
    for hook in out["webhooks"]:
        hook["clientConfig"]["service"]["port"] = port
    return out


class Registration:
    """The gpugate webhook configurations in the cluster; replaced as a whole, deleted at the end."""

    def __init__(self, cluster: Cluster) -> None:
        self.api = client.AdmissionregistrationV1Api(cluster.api_client())
        self.current: RenderedWebhooks | None = None

    def apply(self, webhooks: RenderedWebhooks) -> None:
        """Create or replace both configurations with exactly these documents."""
        _put(self.api.read_mutating_webhook_configuration, self.api.create_mutating_webhook_configuration,
             self.api.replace_mutating_webhook_configuration, webhooks.mutating)
        _put(self.api.read_validating_webhook_configuration, self.api.create_validating_webhook_configuration,
             self.api.replace_validating_webhook_configuration, webhooks.validating)
        self.current = webhooks

    def stored(self) -> tuple[Obj, Obj]:
        """Both configurations as the API server stores them (raw JSON, with its defaults)."""
        mutating = json.loads(self.api.read_mutating_webhook_configuration(
            WEBHOOK_NAME, _preload_content=False).data)
        validating = json.loads(self.api.read_validating_webhook_configuration(
            WEBHOOK_NAME, _preload_content=False).data)
        return mutating, validating

    def remove(self) -> None:
        for delete in (self.api.delete_mutating_webhook_configuration,
                       self.api.delete_validating_webhook_configuration):
            _ignore_missing(lambda delete=delete: delete(WEBHOOK_NAME))
        self.current = None


@contextmanager
def registered_as_shipped(cluster: Cluster, server: GpugateServer, certs: ServingCerts) -> Iterator[Registration]:
    """Both configurations as manifests/webhook renders them, pointed at ``server``; removed on the way out."""
    registration = Registration(cluster)
    register_as_shipped(registration, server, certs)
    try:
        yield registration
    finally:
        registration.remove()


def shipped_webhooks() -> RenderedWebhooks:
    """Both configurations as ``kubectl kustomize manifests/webhook`` renders them (what a deploy applies)."""
    return RenderedWebhooks.of(kustomize(ROOT / "manifests" / "webhook"))


def register_as_shipped(registration: Registration, server: GpugateServer, certs: ServingCerts) -> None:
    """The shipped configurations pointed at ``server`` (trusting ``certs``' CA), applied through
    ``registration``, so the test's own registration removes them."""
    registration.apply(shipped_webhooks().pointed_at(server.base_url, certs.bundle.ca_cert))


def _put(read: Callable[..., Any], create: Callable[..., Any], replace: Callable[..., Any], document: Obj) -> None:
    name = document["metadata"]["name"]
    body = copy.deepcopy(document)
    try:
        existing = json.loads(read(name, _preload_content=False).data)
    except ApiException as error:
        if error.status != 404:
            raise
        create(body)
        return
    body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
    replace(name, body)


def _ignore_missing(action: Callable[[], object]) -> None:
    try:
        action()
    except ApiException as error:
        if error.status != 404:
            raise


# --- certificates ----------------------------------------------------------------------------

class ServingCerts:
    """A fresh CA and a serving certificate for IP 127.0.0.1 (and the Service's DNS names).

    ``pki.create_bundle`` adds ``ips=("127.0.0.1",)`` by default: the API server dials the url's
    host and checks it against the certificate's IP SANs. The DNS names of the Service are there
    too, so the same files also serve a ``service`` clientConfig (server name
    ``gpugate-webhook.gpugate-system.svc``).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.bundle = pki.create_bundle(service=WEBHOOK_NAME, namespace=SERVICE_NAMESPACE, now=datetime.now(UTC),
                                        days=7, ips=(LOOPBACK,))
        pki.write_bundle(self.bundle, directory)

    @property
    def cert(self) -> Path:
        return self.directory / pki.CERT_FILE

    @property
    def key(self) -> Path:
        return self.directory / pki.KEY_FILE

    @property
    def ca(self) -> Path:
        return self.directory / pki.CA_CERT_FILE

    def rotate(self) -> bytes:
        """A new serving pair under the same CA, written as the server's files; returns the cert PEM."""
        self.bundle = pki.create_bundle(service=WEBHOOK_NAME, namespace=SERVICE_NAMESPACE, now=datetime.now(UTC),
                                        days=7, ips=(LOOPBACK,), ca_cert=self.bundle.ca_cert,
                                        ca_key=self.bundle.ca_key)
        pki.write_bundle(self.bundle, self.directory)
        return self.bundle.cert


def install_pair(directory: Path, cert_pem: bytes, key_pem: bytes, ca_pem: bytes) -> None:
    """Write a Secret's files the way the kubelet swaps a Secret volume: whole files, key first."""
    for name, data in ((pki.KEY_FILE, key_pem), (pki.CERT_FILE, cert_pem), (pki.CA_CERT_FILE, ca_pem)):
        temporary = directory / f".{name}.{secrets.token_hex(3)}"
        temporary.write_bytes(data)
        os.replace(temporary, directory / name)


def der_of(cert_pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert_pem.decode())


# --- the server ------------------------------------------------------------------------------

@dataclass
class Run:
    """One life of a server process: when it answered /readyz, when it was told to stop, when it exited."""

    pid: int
    ready: float
    terminated: float | None = None
    exited: float | None = None


class GpugateServer:
    """``gpugate serve`` as a subprocess on 127.0.0.1, stopped by PID, restartable on the same port.

    Times are ``time.monotonic()`` of this process, so they compare with the pod stream's.
    The JSON log (stderr) of every run is appended to ``log``.
    """

    def __init__(self, *, cert: Path, key: Path, ca: Path, policies: Path, log: Path,
                 inventory: Path | None = None, drain_seconds: float = 2.0, workers: int = 2,
                 reload_interval: float = 0.5, server_name: str = LOOPBACK, extra_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None) -> None:
        self.cert, self.key, self.ca, self.server_name = cert, key, ca, server_name
        self.extra_args, self.env = tuple(extra_args), env
        """More ``gpugate serve`` flags, and variables added to the environment (e.g. KUBECONFIG)."""
        self.policies, self.inventory, self.log = policies, inventory, log
        self.drain_seconds, self.workers, self.reload_interval = drain_seconds, workers, reload_interval
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.runs: list[Run] = []
        # Its own session shields it from pytest's Ctrl-C: stop it even if no fixture teardown runs.
        atexit.register(self._reap)

    @property
    def base_url(self) -> str:
        assert self.port is not None, "start the server first"
        return f"https://{LOOPBACK}:{self.port}"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self, port: int) -> list[str]:
        command = [str(GPUGATE), "serve", "--bind", f"{LOOPBACK}:{port}", "--cert", str(self.cert),
                   "--key", str(self.key), "--policies", str(self.policies), "--workers", str(self.workers),
                   "--drain-seconds", str(self.drain_seconds), "--reload-interval", str(self.reload_interval)]
        if self.inventory is not None:
            command += ["--inventory", str(self.inventory)]
        return command + list(self.extra_args)

    def start(self, timeout: float = 60.0) -> Run:
        """Start on the previous port (a restart) or on a free one; return once /readyz says 200."""
        attempts = 1 if self.port is not None else processes.START_ATTEMPTS
        for _ in range(attempts):
            port = self.port or processes.free_port()
            with self.log.open("ab") as out:
                self.process = subprocess.Popen(self.command(port), stdin=subprocess.DEVNULL, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True,
                                                env={**os.environ, **self.env} if self.env else None)
            if self._wait_ready(port, timeout):
                self.port = port
                self.runs.append(Run(pid=self.process.pid, ready=time.monotonic()))
                return self.runs[-1]
            self._reap()
            if "in use" not in processes.tail(self.log, 20):
                break  # not a port race: starting again would fail the same way
        raise processes.StartError(f"gpugate serve did not become ready; last lines of {self.log}:\n"
                                   f"{processes.tail(self.log, 40)}")

    def stop(self, grace: float = 30.0) -> Run:
        """SIGTERM the master (gunicorn's graceful stop: workers drain, then exit) and wait for it."""
        assert self.process is not None and self.runs, "not started"
        run = self.runs[-1]
        if self.process.poll() is None:
            run.terminated = time.monotonic()
            processes.terminate(self.process, grace)
        run.exited = time.monotonic()
        self._reap()
        return run

    def ensure_running(self) -> None:
        if not self.running():
            self.start()

    def ready(self, port: int | None = None) -> bool:
        try:
            return self.get("/readyz", port=port)[0] == 200
        except (OSError, http.client.HTTPException):
            return False

    def get(self, path: str, *, port: int | None = None) -> tuple[int, bytes]:
        port = port or self.port
        assert port is not None
        connection = http.client.HTTPSConnection(LOOPBACK, port, timeout=3)
        # Verify the name the API server would (the IP for a url, <svc>.<ns>.svc for a Service).
        raw = socket.create_connection((LOOPBACK, port), timeout=3)
        try:
            connection.sock = self.client_context().wrap_socket(raw, server_hostname=self.server_name)
        except BaseException:
            raw.close()
            raise
        return processes.http_get(connection, path)

    def client_context(self) -> ssl.SSLContext:
        """A client that trusts only the server's CA and checks its name, as the API server does."""
        return ssl.create_default_context(cafile=str(self.ca))

    def presented_cert(self) -> bytes:
        """The DER certificate a new TLS connection is shown (no verification: rotation may be half done)."""
        assert self.port is not None
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with socket.create_connection((LOOPBACK, self.port), timeout=3) as raw:
            with context.wrap_socket(raw, server_hostname=LOOPBACK) as tls:
                return tls.getpeercert(binary_form=True) or b""

    def admissions(self) -> list[Obj]:
        """Every ``admission`` line the server logged, over all its runs."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if '"event":"admission"' in line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def _wait_ready(self, port: int, timeout: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self.ready(port):
                return True
            time.sleep(0.05)
        return False

    def _reap(self) -> None:
        """Stop what is left of the last run: the master by PID, then any worker of its session.

        The master runs in its own session (start_new_session), so every process whose session
        id is the master's PID is one this object started; none of them should outlive a test.
        """
        if self.process is None:
            return
        master = self.process.pid
        if self.process.poll() is None:
            os.kill(master, signal.SIGKILL)
            self.process.wait(timeout=10)
        for pid in _session_members(master):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@contextmanager
def serving(server: GpugateServer) -> Iterator[GpugateServer]:
    """``server`` started, and stopped on the way out if it is still running."""
    server.start()
    try:
        yield server
    finally:
        if server.running():
            server.stop()


@contextmanager
def shipped_webhook(cluster: Cluster, workdir: Path, policy: str, *, name: str,
                    inventory: Path | None = None, resolve_claims: bool = False) -> Iterator[GpugateServer]:
    """``gpugate serve`` with one policy (YAML text) and fresh certificates, registered as manifests/webhook
    renders it; unregistered and stopped on the way out. ``resolve_claims``: with ``--resolve-claims``
    and a token of the webhook's ServiceAccount under the RBAC manifests/webhook renders, as shipped.

    Why one helper: each e2e module that judges a policy on the real API server sets up the same
    way; only the policy, the inventory file and the log's name (``gpugate-<name>.log``) differ.
    """
    if cluster.plane is None:
        raise RuntimeError("the webhook runs on this machine's 127.0.0.1; an attached cluster cannot call it")
    policies = workdir / "policies"
    policies.mkdir()
    (policies / f"{name}.yaml").write_text(policy)
    certs = ServingCerts(workdir / "certs")
    with ExitStack() as stack:
        extra: tuple[str, ...] = ()
        env = None
        if resolve_claims:
            extra, env = ("--resolve-claims",), {"KUBECONFIG": str(stack.enter_context(webhook_account(cluster,
                                                                                                      workdir)))}
        running = GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca, policies=policies, inventory=inventory,
                                log=cluster.plane.logs / f"gpugate-{name}.log", extra_args=extra, env=env)
        with serving(running), registered_as_shipped(cluster, running, certs):
            yield running


@contextmanager
def webhook_account(cluster: Cluster, workdir: Path) -> Iterator[Path]:
    """The webhook's ServiceAccount and RBAC as manifests/webhook renders them, applied; a kubeconfig
    with a TokenRequest token of that account (what the pod's mounted token gives it)."""
    from tests.e2e.accounts import applied, kubeconfig_as

    docs = [d for d in kustomize(ROOT / "manifests" / "webhook") if d["kind"] in WEBHOOK_RBAC_KINDS]
    assert sorted(d["kind"] for d in docs) == sorted(WEBHOOK_RBAC_KINDS), "manifests/webhook lost part of its RBAC"
    account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]
    with applied(cluster, docs, account["namespace"]):
        yield kubeconfig_as(cluster, account["name"], account["namespace"], workdir / "webhook-kubeconfig.yaml")


WEBHOOK_RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        # After the command: state, ppid, pgrp, session, ...
        if len(fields) > 3 and int(fields[3]) == session and int(entry.name) != session:
            members.append(int(entry.name))
    return members


# --- a second mutating webhook ---------------------------------------------------------------

LABELED = "e2e.gpugate.io/labeled"


class LabelingWebhook:
    """A tiny HTTPS mutating webhook that adds one label, to force gpugate's reinvocation.

    Registered after gpugate (configurations are called in name order:
    k8s.io/apiserver/pkg/admission/configuration/mutating_webhook_manager.go sorts them ByName)
    with ``reinvocationPolicy: IfNeeded``. Its change to the pod makes the API server call
    gpugate a second time (k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go:
    ``RequireReinvokingPreviouslyInvokedPlugins``). It records every pod it was sent.
    """

    CONFIGURATION = "zz-e2e-labeler"

    def __init__(self, directory: Path) -> None:
        self.bundle = pki.create_bundle(service="e2e-labeler", namespace="default", now=datetime.now(UTC),
                                        days=1, ips=(LOOPBACK,))
        pki.write_bundle(self.bundle, directory)
        self.directory = directory
        self.seen: list[Obj] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> LabelingWebhook:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body = json.dumps(owner.answer(review)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.directory / pki.CERT_FILE, self.directory / pki.KEY_FILE)
        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="e2e-labeler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def answer(self, review: Obj) -> Obj:
        request = review["request"]
        pod = request.get("object") or {}
        with self._lock:
            self.seen.append(copy.deepcopy(pod))
        response: Obj = {"uid": request["uid"], "allowed": True}
        labels = (pod.get("metadata") or {}).get("labels")
        if not labels or LABELED not in labels:
            if labels:
                patch = [{"op": "add", "path": "/metadata/labels/" + LABELED.replace("/", "~1"), "value": "true"}]
            else:
                patch = [{"op": "add", "path": "/metadata/labels", "value": {LABELED: "true"}}]
            response |= {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(patch).encode()).decode()}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    def configuration(self, namespace: str) -> Obj:
        assert self._server is not None
        port = self._server.server_address[1]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": self.CONFIGURATION},
            "webhooks": [{
                "name": "label.e2e.gpugate.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "timeoutSeconds": 5,
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
                "clientConfig": {"url": f"https://{LOOPBACK}:{port}/label",
                                 "caBundle": base64.b64encode(self.bundle.ca_cert).decode()},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                           "operations": ["CREATE"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            }],
        }


# --- pods --------------------------------------------------------------------------------------

RESTRICTED_POD_SECURITY: Obj = {"runAsNonRoot": True, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER_SECURITY: Obj = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_manifest(name: str | None = None, *, labels: Mapping[str, str] | None = None, gpus: int | None = None,
                 generate_name: str | None = None, **spec: Any) -> Obj:
    """A pod that meets the restricted Pod Security Standard (gpugate-system enforces it).

    ``gpus`` writes ``limits: nvidia.com/gpu`` only, as users do; the API server copies limits
    to requests for extended resources before admission.
    """
    container: Obj = {"name": "main", "image": "registry.example/cuda:12",
                      "securityContext": RESTRICTED_CONTAINER_SECURITY}
    if gpus is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    metadata: Obj = {"labels": dict(labels or {})}
    if name:
        metadata["name"] = name
    if generate_name:
        metadata["generateName"] = generate_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"securityContext": RESTRICTED_POD_SECURITY, "containers": [container], **spec}}


def create_pod(core: client.CoreV1Api, namespace: str, pod: Obj, *, dry_run: bool = False) -> Obj:
    """Create through the API server and return the pod it answered with (raw JSON)."""
    kwargs: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
    response = core.create_namespaced_pod(namespace, pod, _preload_content=False, **kwargs)
    return json.loads(response.data)


def read_pod(core: client.CoreV1Api, namespace: str, name: str) -> Obj:
    return json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)


def api_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.body)


def policy_of(pod: Obj) -> str | None:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(POLICY_ANNOTATION)


def gpu_tolerations(pod: Obj) -> list[Obj]:
    return [t for t in pod["spec"].get("tolerations") or [] if str(t.get("key", "")).startswith("nvidia.com/")]


# --- a stream of pod creates -----------------------------------------------------------------

@dataclass
class Attempt:
    name: str
    started: float
    ended: float
    error: str | None = None


@dataclass
class PodStream:
    """A thread that creates pods one after another until stopped, timing each create.

    One at a time on purpose: each create's [started, ended] window then brackets the webhook
    calls the API server made for it, which the tests compare with the server's up/down times.
    """

    cluster: Cluster
    namespace: str
    make: Callable[[str], Obj]
    prefix: str = "stream"
    pause: float = 0.1
    attempts: list[Attempt] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PodStream:
        core = client.CoreV1Api(self.cluster.api_client())  # its own connection pool
        self._thread = threading.Thread(target=self._run, args=(core,), name="pod-stream", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self, core: client.CoreV1Api) -> None:
        serial = 0
        while not self._stop.is_set():
            serial += 1
            name = f"{self.prefix}-{serial}"
            started = time.monotonic()
            error = None
            try:
                core.create_namespaced_pod(self.namespace, self.make(name), _preload_content=False)
            except ApiException as failure:
                error = f"HTTP {failure.status}: {api_message(failure)}"
            except Exception as failure:
                error = f"{type(failure).__name__}: {failure}"
            self.attempts.append(Attempt(name, started, time.monotonic(), error))
            self._stop.wait(self.pause)

    def failures(self) -> list[Attempt]:
        return [a for a in self.attempts if a.error]

    def stored(self) -> dict[str, Obj]:
        core = self.cluster.core()
        items = json.loads(core.list_namespaced_pod(self.namespace, _preload_content=False).data)["items"]
        return {pod["metadata"]["name"]: pod for pod in items}


# --- namespaces ------------------------------------------------------------------------------

class Namespaces:
    """Namespaces named for the policies' globs (``ml-*``, ``web-*``...), deleted at the end."""

    def __init__(self, cluster: Cluster) -> None:
        self.core = cluster.core()
        self.names: list[str] = []

    def make(self, prefix: str, labels: Mapping[str, str] | None = None) -> str:
        name = f"{prefix}-{secrets.token_hex(3)}"
        self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": name, "labels": dict(labels or {})}})
        self.names.append(name)
        self._wait_for_default_service_account(name)
        return name

    def _wait_for_default_service_account(self, name: str, timeout: float = 30.0) -> None:
        """The ServiceAccount admission plugin refuses pods until the controller made ``default``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.core.read_namespaced_service_account("default", name)
                return
            except ApiException as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def delete_all(self) -> None:
        for name in self.names:
            _ignore_missing(lambda name=name: self.core.delete_namespace(name))
        self.names.clear()


# --- the API server's log ----------------------------------------------------------------------

class LogCursor:
    """Read what a component logged after a given moment (by file offset, no clock parsing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def read(self) -> str:
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            return handle.read().decode("utf-8", "replace")


def apiserver_log(cluster: Cluster) -> Path:
    """The kube-apiserver's log the harness keeps (controlplane.ControlPlane.logs/<name>.log)."""
    assert cluster.plane is not None
    return cluster.plane.logs / "kube-apiserver.log"


def iter_kustomizations(*roots: Path) -> Iterator[Path]:
    for root in roots:
        yield from sorted(p.parent for p in root.rglob("kustomization.yaml"))


def deployed_policies(folder: Path, extra: Mapping[str, str] | None = None) -> Path:
    """What the webhook Deployment mounts (the files ``policies/kustomization.yaml`` puts in its
    ConfigMap) copied into ``folder``, plus ``extra`` (file name -> YAML) a test adds."""
    folder.mkdir(parents=True)
    generator = yaml.safe_load((ROOT / "policies" / "kustomization.yaml").read_text())["configMapGenerator"][0]
    for name in generator["files"]:
        (folder / name).write_bytes((ROOT / "policies" / name).read_bytes())
    for name, text in (extra or {}).items():
        (folder / name).write_text(text)
    return folder
