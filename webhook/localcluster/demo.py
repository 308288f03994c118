"""``gpugate demo``: gpugate on a local control plane, one command.

It starts :class:`~webhook.localcluster.cluster.Cluster` (etcd, kube-apiserver, controller manager,
kube-scheduler on 127.0.0.1) with a mix of fake GPU nodes (whole H100s on one NVLink clique, an
H100 node partitioned into MIG slices, a time-sliced node, a CPU node), runs ``gpugate serve`` and
``gpugate balance`` on this machine against it, registers the webhook configurations of
manifests/webhook pointed at the server by URL with its CA, waits until the balancer's inventory
reaches the server (as the ConfigMap volume does in a cluster), creates the bundled example pods
and reports what each became and where kube-scheduler put it. Everything it started is stopped by
PID on Ctrl-C or, with ``once``, as soon as the table is printed.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from webhook import names
from webhook.certs import pki as servingpki
from webhook.errors import GpugateError, PolicyLoadError
from webhook.kube import yamlload
from webhook.localcluster import cluster as cluster_module
from webhook.localcluster import interrupts, processes, webhooks
from webhook.localcluster.cluster import Cluster
from webhook.localcluster.fakekubelet import NodeSpec
from webhook.policy import loading
from webhook.server import outcome, probe

SYSTEM_NAMESPACE = "gpugate-system"
INVENTORY = ("gpugate-inventory", "inventory.json")  # the balancer's ConfigMap and key
WEBHOOK_NAME = "gpugate-webhook"
CLIQUE = "nvl72-a"

NODES: tuple[NodeSpec, ...] = (
    NodeSpec(name="h100-a", gpus=8, clique=CLIQUE),
    NodeSpec(name="h100-b", gpus=8, clique=CLIQUE),
    # MIG mixed: one H100 node's GPUs cut into 1g.10gb, 2g.20gb and 3g.40gb slices.
    NodeSpec(name="h100-mig", gpus=8, mig={"1g.10gb": 14, "2g.20gb": 6, "3g.40gb": 4}, mig_config="all-balanced"),
    # Time-slicing: 4 GPUs, 4 replicas each, advertised as nvidia.com/gpu.shared: 16.
    NodeSpec(name="h100-shared", gpus=4, replicas=4),
    NodeSpec(name="cpu-a", gpus=0),
)


@dataclass(frozen=True, slots=True)
class DemoPod:
    """One bundled example (webhook/examples) and the namespace the demo creates it in."""

    file: str
    namespace: str
    asked: str


PODS: tuple[DemoPod, ...] = (
    DemoPod("pod-training.yaml", "ml-team", "training, gpus: 4"),
    DemoPod("pod-inference.yaml", "ml-team", "inference, gpus: 1"),
    DemoPod("pod-notebook.yaml", "ml-team", "notebook, a share"),
    DemoPod("pod-rightsized.yaml", "ml-team", "gpu-memory: 16Gi"),
    DemoPod("pod-web.yaml", "web-shop", "web pod, nvidia.com/gpu: 1"),
)
NAMESPACES: dict[str, dict[str, str]] = {
    SYSTEM_NAMESPACE: {names.SKIP_LABEL: "true"},
    "ml-team": {},
    "web-shop": {},
}


@dataclass(frozen=True, kw_only=True)
class Settings:
    policies: Path
    webhook_configurations: Path
    """manifests/webhook/webhookconfigurations.yaml: what the demo registers (pointed at the server)."""
    once: bool = False
    schedule_timeout: float = 60.0
    log: Callable[[str], None] = print
    install: str = "manifests"
    """How gpugate is installed on the cluster: ``manifests`` registers ``webhook_configurations``;
    ``helm`` installs the chart (``chart``) with ``helm``, its webhook pointed at the local server."""
    chart: Path = Path("manifests/chart/gpugate")
    helm: str | None = None
    """The helm binary (default: $GPUGATE_HELM, else helm on PATH)."""


def example(file: str) -> dict[str, Any]:
    """A bundled example pod (package data, so an installed gpugate has them too)."""
    text = resources.files("webhook").joinpath("examples", file).read_text()
    document = yaml.safe_load(text)
    if not isinstance(document, dict):
        raise GpugateError(f"webhook/examples/{file} is not a pod")
    return document


def run(settings: Settings) -> list[tuple[str, outcome.Outcome]]:
    """Start everything, create the example pods, report; stop everything before returning.

    A SIGINT or SIGTERM while starting raises :class:`~webhook.localcluster.interrupts.Interrupted`
    once everything started so far is stopped."""
    check_inputs(settings)
    with interrupts.raised(), ExitStack() as stack:
        found = cluster_module.ensure_binaries(settings.log)  # a first build's Ctrl-C ends here too
        started = time.monotonic()
        settings.log("starting the control plane (etcd, kube-apiserver, controller manager, scheduler) ...")
        cluster = stack.enter_context(Cluster.local(found))
        assert cluster.plane is not None
        work = Path(tempfile.mkdtemp(prefix="gpugate-demo-", dir=cluster.plane.workdir))
        for name, labels in NAMESPACES.items():
            _namespace(cluster, name, labels)
        for spec in NODES:
            cluster.kubelet.add_node(spec, wait_schedulable=False)
        for spec in NODES:
            cluster.kubelet.wait_schedulable(spec.name)
        settings.log(f"{len(NODES)} nodes ready: " + ", ".join(_describe(spec) for spec in NODES))

        inventory_file = work / "inventory" / "inventory.json"
        server, ca = _serve(stack, cluster, settings.policies, inventory_file, work)
        settings.log(f"gpugate serve at {server}; gpugate balance labelling nodes and writing the inventory")
        balancer = _balance(stack, cluster, work)
        stack.enter_context(_inventory_volume(cluster, inventory_file))
        if settings.install == "helm":
            install_chart(cluster.kubeconfig, _helm(settings), settings.chart, server, ca, work, settings.log)
        else:
            _register(cluster, settings.webhook_configurations, server, ca)
            stack.callback(_unregister, cluster)
        _wait(lambda: inventory_file.is_file(), "the balancer's inventory to reach the server", balancer)
        _wait(lambda: _webhook_answers(cluster), "the API server to call the webhook", balancer)

        rows = _create_pods(cluster)
        _wait(lambda: all(_settled(cluster, pod) for _, pod in rows), "the pods to be scheduled", balancer,
              timeout=settings.schedule_timeout, required=False)
        rows = [(label, _reread(cluster, pod)) for label, pod in rows]
        settings.log(f"\nready in {time.monotonic() - started:.0f} s\n")
        settings.log(outcome.table(rows))
        if not settings.once:
            interrupts.announce_and_wait(lambda: settings.log(
                f"\nexport KUBECONFIG={cluster.kubeconfig}   # to look around with kubectl\nCtrl-C stops everything."))
        interrupts.stopping()
        settings.log("stopping ...")
    return rows


CHART_RELEASE = ("gpugate", "gpugate")
"""The release name and namespace ``--install helm`` uses (a namespace of its own, made by helm; the
webhook configurations leave the release namespace out by name)."""


def _helm(settings: Settings) -> Path:
    from webhook.stack import chartrender

    found = chartrender.find_helm(settings.helm)
    if found is None:
        raise GpugateError("gpugate demo --install helm needs helm: pass --helm PATH, set $GPUGATE_HELM, or put "
                           "helm on PATH (nothing was started)")
    return found


def install_chart(kubeconfig: Path, helm: Path, chart: Path, server: str, ca: bytes, work: Path,
                  log: Callable[[str], None]) -> None:
    """``helm install`` of gpugate's chart, as a user would run it, with the webhook served on this
    machine: ``tls.mode: external``, ``webhook.url`` the local server, ``webhook.caBundle`` its CA
    (the control plane runs no containers, so the chart's own webhook pods are fake pods). The
    chart's configurations are then the ones the API server calls."""
    release, namespace = CHART_RELEASE
    values = work / "chart-values.yaml"
    values.write_text(yaml.safe_dump({"tls": {"mode": "external"},
                                      "webhook": {"url": server, "caBundle": base64.b64encode(ca).decode()}}))
    command = [str(helm), "install", release, str(chart), "--namespace", namespace, "--create-namespace",
               "--kubeconfig", str(kubeconfig), "--values", str(values)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise GpugateError(f"helm install failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    log(f"helm install {release} {chart} --namespace {namespace}: done (tls.mode external, webhook.url {server}; "
        f"values in {values})")


def check_inputs(settings: Settings) -> None:
    """Refuse, before anything starts, a policy folder ``gpugate serve`` would not load (with the
    problems ``gpugate policy check`` lists) and a file that is not webhook configurations: both
    used to surface a minute and a half later, as a server that never became ready or a KeyError."""
    if settings.install == "helm":
        _helm(settings)
        if not (settings.chart / "Chart.yaml").is_file():
            raise GpugateError(f"{settings.chart} holds no Chart.yaml: pass --chart DIR (gpugate's chart is "
                               f"manifests/chart/gpugate in a clone)")
    for path in (settings.policies, settings.webhook_configurations):
        if not path.exists():
            raise GpugateError(f"{path} does not exist: run `gpugate demo` from a clone of gpugate, or pass "
                               "--policies DIR and --webhook-configurations FILE")
    try:
        loading.load_servable(settings.policies)
    except PolicyLoadError as err:
        raise GpugateError("\n".join(err.problems) + f"\n{len(err.problems)} problem(s) in {settings.policies} "
                           f"(gpugate policy check {settings.policies} says the same); the demo serves that "
                           f"folder, so nothing was started") from None
    where = str(settings.webhook_configurations)
    try:
        documents = list(yamlload.load_all(settings.webhook_configurations.read_text(encoding="utf-8")))
    except yaml.YAMLError as err:
        raise GpugateError(f"--webhook-configurations {where}{yamlload.describe_error(err)}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise GpugateError(f"--webhook-configurations {where}: cannot read it ({err})") from None
    found = webhooks.problems(documents, where)
    if found:
        raise GpugateError(f"--webhook-configurations: {found[0]}" + (f" (and {len(found) - 1} more)"
                                                                      if len(found) > 1 else ""))


def _describe(spec: NodeSpec) -> str:
    if spec.gpus == 0:
        return f"{spec.name} (CPU)"
    if spec.mig:
        return f"{spec.name} (MIG " + " ".join(f"{p}x{n}" for p, n in spec.mig.items()) + ")"
    if spec.replicas > 1:
        return f"{spec.name} ({spec.gpus} GPUs x {spec.replicas} time-sliced)"
    return f"{spec.name} ({spec.gpus} whole GPUs)"


def _namespace(cluster: Cluster, name: str, labels: dict[str, str]) -> None:
    core = cluster.core()
    core.create_namespace(cast(Any, {"metadata": {"name": name, "labels": labels}}))
    # Pods are refused until the controller manager has made the namespace's default ServiceAccount.
    _wait(lambda: _exists(lambda: core.read_namespaced_service_account("default", name)),
          f"namespace {name}'s default ServiceAccount")


def _exists(read: Callable[[], object]) -> bool:
    try:
        read()
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def _serve(stack: ExitStack, cluster: Cluster, policies: Path, inventory: Path, work: Path) -> tuple[str, bytes]:
    bundle = servingpki.create_bundle(service=WEBHOOK_NAME, namespace=SYSTEM_NAMESPACE, now=datetime.now(UTC))
    certs = work / "certs"
    servingpki.write_bundle(bundle, certs)
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))

    def ready(ports: Sequence[int]) -> bool:
        connection = http.client.HTTPSConnection("127.0.0.1", ports[0], context=context, timeout=2)
        return processes.http_get(connection, "/readyz")[0] == 200

    launch = processes.Launch(
        name="gpugate-serve", ports=1, probe=ready,
        command=lambda ports: [_gpugate(), "serve", "--bind", f"127.0.0.1:{ports[0]}", "--cert", str(certs / "tls.crt"),
                               "--key", str(certs / "tls.key"), "--policies", str(policies), "--inventory",
                               str(inventory), "--state-dir", str(work / "state")])
    process = processes.start(launch, cluster.plane.logs if cluster.plane else work)
    stack.callback(process.stop)
    return f"https://127.0.0.1:{process.ports[0]}", bundle.ca_cert


def _balance(stack: ExitStack, cluster: Cluster, work: Path) -> processes.Process:
    def ready(ports: Sequence[int]) -> bool:
        return processes.http_get(http.client.HTTPConnection("127.0.0.1", ports[0], timeout=2), "/readyz")[0] == 200

    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "POD_NAMESPACE": SYSTEM_NAMESPACE,
           "POD_NAME": "gpugate-balancer-demo"}
    launch = processes.Launch(
        name="gpugate-balance", ports=1, probe=ready,
        command=lambda ports: [_gpugate(), "balance", "--health-bind", f"127.0.0.1:{ports[0]}"])
    process = processes.start(launch, cluster.plane.logs if cluster.plane else work, env=env)
    stack.callback(process.stop)
    return process


def _gpugate() -> str:
    """The gpugate console script beside this interpreter (a venv's), else ``python -m webhook.cli``."""
    script = Path(sys.executable).with_name("gpugate")
    return str(script) if script.is_file() else "gpugate"


@contextmanager
def _inventory_volume(cluster: Cluster, path: Path, interval: float = 1.0) -> Iterator[None]:
    """Copy the balancer's inventory ConfigMap to the server's ``--inventory`` file, as a kubelet's
    ConfigMap volume would (atomically, so the server never reads half a file)."""
    core = client.CoreV1Api(cluster.api_client())
    stop = threading.Event()
    path.parent.mkdir(parents=True, exist_ok=True)

    def loop() -> None:
        written = None
        while not stop.wait(interval):
            try:
                data = core.read_namespaced_config_map(INVENTORY[0], SYSTEM_NAMESPACE).data or {}
            except ApiException:
                continue
            text = data.get(INVENTORY[1])
            if text and text != written:
                partial = path.with_suffix(".partial")
                partial.write_text(text)
                os.replace(partial, path)
                written = text

    thread = threading.Thread(target=loop, name="inventory-volume", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _register(cluster: Cluster, path: Path, server: str, ca: bytes) -> None:
    api = client.AdmissionregistrationV1Api(cluster.api_client())
    for document in yaml.safe_load_all(path.read_text()):
        if not document:
            continue
        body = webhooks.pointed_at(document, server, ca)
        if document["kind"] == "MutatingWebhookConfiguration":
            api.create_mutating_webhook_configuration(cast(Any, body))
        elif document["kind"] == "ValidatingWebhookConfiguration":
            api.create_validating_webhook_configuration(cast(Any, body))


def _unregister(cluster: Cluster) -> None:
    api = client.AdmissionregistrationV1Api(cluster.api_client())
    for delete in (api.delete_mutating_webhook_configuration, api.delete_validating_webhook_configuration):
        try:
            delete(WEBHOOK_NAME)
        except ApiException:
            pass


def _webhook_answers(cluster: Cluster) -> bool:
    """A dry-run GPU pod comes back shaped: the API server has picked up the configuration."""
    return probe.create_dry_run(cluster.core(), "ml-team", probe.probe_pod()).shaped


def _create_pods(cluster: Cluster) -> list[tuple[str, outcome.Outcome]]:
    core = cluster.core()
    rows = []
    for pod in PODS:
        body = example(pod.file)
        try:
            created: Any = core.create_namespaced_pod(pod.namespace, cast(Any, body), _preload_content=False)
        except ApiException as err:
            name = body["metadata"].get("name") or body["metadata"].get("generateName", "")
            rows.append((pod.asked, outcome.refused(name, namespace=pod.namespace,
                                                    message=outcome.denial_text(err.body or str(err.reason)))))
            continue
        rows.append((pod.asked, outcome.admitted(json.loads(created.data), namespace=pod.namespace)))
    return rows


def _settled(cluster: Cluster, pod: outcome.Outcome) -> bool:
    return pod.denied is not None or _reread(cluster, pod).node is not None


def _reread(cluster: Cluster, pod: outcome.Outcome) -> outcome.Outcome:
    if pod.denied is not None:
        return pod
    answered: Any = cluster.core().read_namespaced_pod(pod.name, pod.namespace, _preload_content=False)
    return outcome.admitted(json.loads(answered.data), namespace=pod.namespace)


def _wait(condition: Callable[[], bool], what: str, watched: processes.Process | None = None, *,
          timeout: float = 60.0, required: bool = True) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if watched is not None and not watched.running():
            raise GpugateError(f"{watched.name} exited while waiting for {what}:\n{watched.tail()}")
        time.sleep(0.2)
    if required:
        raise GpugateError(f"timed out after {timeout:.0f} s waiting for {what}")
    return False
