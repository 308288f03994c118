"""The size, depth and slow-read attack shapes, through the real kube-apiserver: each refused, no 5xx,
and no GPU pod stored in a namespace the policies deny GPUs.

A tenant who may create pods and ResourceClaims in their own namespaces used each of these to have a
GPU pod stored in ``web-shop`` while the validating webhook failed open: the server answered what it
could not judge with a non-200 status, too late, or ``allowed: true``. Here the webhook is
registered exactly as ``kubectl kustomize manifests/webhook`` renders it (validation
``failurePolicy: Fail``), served by one ``gpugate serve --resolve-claims`` reading claims as the
``gpugate-webhook`` ServiceAccount through a TCP relay that can be made slow (the API server's own
latency, seen from the webhook). The bodies are written as JSON text: no recursive encoder reaches
the depths sent.

1. a 600 KB pod whose env holds ``<`` (the API server writes each as ``\\u003c``: a 3.6 MB review);
2. a pod whose ``managedFields`` nest 1,100 levels (a client may send managedFields on create);
3. a claim whose opaque parameters nest 1,100 levels;
4. a pod naming a claim nested about 1,000 levels deep (stored before the webhook was registered),
   and asking 8 GPUs itself;
5. a pod whose claim read is slow: refused within the webhook's timeout, admitted once reads are quick.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from kubernetes import client

from tests.e2e.balancer_access import scrape
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import (
    GpugateServer,
    Namespaces,
    Registration,
    ServingCerts,
    deployed_policies,
    pod_manifest,
    register_as_shipped,
    serving,
    shipped_webhooks,
    webhook_account,
)
from webhook.localcluster import processes
from webhook.localcluster.cluster import Cluster

pytestmark = pytest.mark.e2e

DEEP = "__deep__"
Obj = dict[str, Any]


class SlowRelay:
    """A TCP relay to the API server whose answers can be held back (``delay`` seconds per chunk)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.delay = 0.0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stopped = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                inner, _ = self._listener.accept()
            except OSError:
                return
            outer = socket.create_connection(self.target)
            self._sockets += [inner, outer]
            threading.Thread(target=self._pump, args=(inner, outer, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(outer, inner, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if answers and self.delay:
                    time.sleep(self.delay)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._stopped = True
        self._listener.close()
        for sock in self._sockets:
            try:
                sock.close()
            except OSError:
                pass


@pytest.fixture(scope="module")
def relay(local: Cluster) -> Iterator[SlowRelay]:
    admin = yaml.safe_load(Path(local.kubeconfig).read_text())
    server = admin["clusters"][0]["cluster"]["server"]
    host, port = server.split("://", 1)[1].rsplit(":", 1)
    started = SlowRelay((host.strip("[]"), int(port)))
    yield started
    started.close()


@pytest.fixture(scope="module")
def server(local: Cluster, workdir: Path, relay: SlowRelay) -> Iterator[GpugateServer]:
    """``gpugate serve --resolve-claims`` as the webhook's ServiceAccount, reading through the relay."""
    assert local.plane is not None
    certs = ServingCerts(workdir / "certs")
    with webhook_account(local, workdir) as kubeconfig:
        config = yaml.safe_load(kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
        kubeconfig.write_text(yaml.safe_dump(config))
        metrics_port = processes.free_port()
        started = GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca,
                                policies=deployed_policies(workdir / "policies", {}),
                                log=local.plane.logs / "gpugate-serve-limits.log",
                                extra_args=("--resolve-claims", "--http2",
                                            "--metrics-bind", f"127.0.0.1:{metrics_port}"),
                                env={"KUBECONFIG": str(kubeconfig)})
        started.metrics_port = metrics_port  # type: ignore[attr-defined]
        started.certs = certs  # type: ignore[attr-defined]
        with serving(started):
            yield started


@pytest.fixture
def registered(local: Cluster, server: GpugateServer, registration: Registration,
               namespaces: Namespaces) -> Registration:
    """The base rendering (validation fails closed) pointed at the module's server, in effect."""
    _register(local, registration, server, namespaces.make("web-probe"))
    return registration


def _register(cluster: Cluster, registration: Registration, server: GpugateServer, probe: str) -> None:
    register_as_shipped(registration, server, server.certs)  # type: ignore[attr-defined]
    wait_until(lambda: _post(cluster, f"/api/v1/namespaces/{probe}/pods?dryRun=All", _gpu_pod("probe"))[0] == 403,
               timeout=20, interval=0.1, what="the API server to call gpugate", explain=cluster.logs_tail)


def _nested(depth: int) -> str:
    return '{"f:a":' * depth + "{}" + "}" * depth


def _post(cluster: Cluster, path: str, document: Obj, deep: int = 0) -> tuple[int, Obj]:
    """POST ``document`` as JSON text (the string ``DEEP`` in it becomes ``deep`` nested objects):
    the API server's status and answer."""
    body = json.dumps(document).replace(f'"{DEEP}"', _nested(deep)).encode()
    api = cluster.api_client()
    configuration = api.configuration
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    for setting in configuration.auth_settings().values():
        headers[setting["key"]] = setting["value"]
    response = api.rest_client.pool_manager.request("POST", configuration.host + path, body=body, headers=headers,
                                                    timeout=30.0, retries=False)
    try:
        answer = orjson.loads(response.data)
    except orjson.JSONDecodeError:  # a stored object nested deeper than any decoder here reads
        answer = {"raw": response.data[:300].decode(errors="replace")}
    return response.status, answer


def _refused(status: int, answer: Obj) -> None:
    assert 400 <= status < 500, (status, str(answer)[:500])


def _gpu_pod(name: str, gpus: int = 8, **spec: Any) -> Obj:
    pod = pod_manifest(name, gpus=gpus)
    pod["spec"].update(spec)
    return pod


def _claim(name: str, device_class: str = "gpu.nvidia.com", parameters: Any = None) -> Obj:
    devices: Obj = {"requests": [{"name": "dev", "exactly": {"deviceClassName": device_class}}]}
    if parameters is not None:
        devices["config"] = [{"opaque": {"driver": "example.com", "parameters": parameters}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": devices}}


def _no_gpu_pod_stored(cluster: Cluster, namespace: str) -> None:
    for pod in cluster.core().list_namespaced_pod(namespace).items:
        for container in pod.spec.containers:
            limits = (container.resources.limits or {}) if container.resources else {}
            assert not any(key.startswith("nvidia.com/") for key in limits), pod.metadata.name


def test_a_pod_made_large_by_the_api_servers_escaping_is_judged(local: Cluster, registered: Registration,
                                                                 namespaces: Namespaces) -> None:
    web = namespaces.make("web-shop")
    pod = _gpu_pod("lt-env")
    pod["spec"]["containers"][0]["env"] = [{"name": "HTML", "value": "<" * 600_000}]
    status, answer = _post(local, f"/api/v1/namespaces/{web}/pods", pod)
    _refused(status, answer)
    assert "GPUs are not available in web" in answer.get("message", ""), answer.get("message")
    _no_gpu_pod_stored(local, web)


def test_managed_fields_nested_past_the_decoder_are_refused(local: Cluster, registered: Registration,
                                                             namespaces: Namespaces) -> None:
    web = namespaces.make("web-shop")
    pod = _gpu_pod("deep-fields")
    pod["metadata"]["managedFields"] = [{"manager": "tenant", "operation": "Update", "apiVersion": "v1",
                                         "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                                         "fieldsV1": DEEP}]
    status, answer = _post(local, f"/api/v1/namespaces/{web}/pods", pod, deep=1_100)
    _refused(status, answer)
    _no_gpu_pod_stored(local, web)


def test_a_claim_whose_opaque_parameters_nest_past_the_decoder_is_refused(local: Cluster, registered: Registration,
                                                                          namespaces: Namespaces) -> None:
    web = namespaces.make("web-shop")
    status, answer = _post(local, f"/apis/resource.k8s.io/v1/namespaces/{web}/resourceclaims",
                           _claim("deep-params", parameters=DEEP), deep=1_100)
    _refused(status, answer)
    assert not client.ResourceV1Api(local.api_client()).list_namespaced_resource_claim(web).items


def test_a_pod_naming_a_claim_too_deep_to_read_is_refused(local: Cluster, registration: Registration,
                                                          server: GpugateServer, namespaces: Namespaces) -> None:
    """The claim was stored before the webhook was registered (or in a class no policy governs); the pod
    asks 8 GPUs itself and names it. Before, the failed read let the pod through unjudged."""
    web = namespaces.make("web-shop")
    registration.remove()
    status, answer = _post(local, f"/apis/resource.k8s.io/v1/namespaces/{web}/resourceclaims",
                           _claim("very-deep", "other.example.com", parameters=DEEP), deep=1_020)
    assert status == 201, answer
    _register(local, registration, server, web)
    pod = _gpu_pod("names-deep-claim", resourceClaims=[{"name": "deep", "resourceClaimName": "very-deep"}])
    status, answer = _post(local, f"/api/v1/namespaces/{web}/pods", pod)
    _refused(status, answer)
    _no_gpu_pod_stored(local, web)


def test_a_slow_claim_read_is_refused_before_the_timeout_and_admitted_when_quick(
        local: Cluster, registered: Registration, relay: SlowRelay, namespaces: Namespaces) -> None:
    ml = namespaces.make("ml-team")
    status, answer = _post(local, f"/apis/resource.k8s.io/v1/namespaces/{ml}/resourceclaims", _claim("one"))
    assert status == 201, answer
    pod = pod_manifest("uses-claim")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "one"}]
    timeout = shipped_webhooks().validating["webhooks"][0]["timeoutSeconds"]
    relay.delay = 4.0
    try:
        started = time.monotonic()
        status, answer = _post(local, f"/api/v1/namespaces/{ml}/pods", pod)
        took = time.monotonic() - started
    finally:
        relay.delay = 0.0
    _refused(status, answer)
    assert "took longer than" in answer.get("message", ""), answer.get("message")
    assert took < 2 * timeout   # mutation's read and validation's, each refused at its 2 s deadline
    status, answer = _post(local, f"/api/v1/namespaces/{ml}/pods", pod)
    assert status == 201, answer


def test_the_api_server_talks_http2_to_the_webhook(local: Cluster, registered: Registration,
                                                   server: GpugateServer, namespaces: Namespaces) -> None:
    """The API server offers h2 by ALPN and gunicorn's HTTP/2 serves it: pod creates through it are
    answered, over connections that chose HTTP/2 (the readiness probes of the test speak HTTP/1.1)."""
    ml = namespaces.make("ml-team")
    for i in range(5):
        status, answer = _post(local, f"/api/v1/namespaces/{ml}/pods", _gpu_pod(f"h2-{i}", gpus=1))
        assert status == 201, answer
    port = server.metrics_port  # type: ignore[attr-defined]
    assert scrape(port, "gpugate_http2_connections_total") >= 1
    assert scrape(port, "gpugate_admissions_total", endpoint="validate") >= 5

