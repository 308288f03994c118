"""The webhook container as the Deployment configures it, run for real: gunicorn, TLS, the mounts.

Paths the pod gets from volumes are mapped to temporary folders holding what the volumes would
hold (the rendered policies ConfigMap's files, a TLS Secret's files, an empty /tmp), and the
listen addresses to free ports on 127.0.0.1; every other argument is the manifest's own.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.kubefake import FakeKube, fake_kube  # noqa: F401 - the fixture is used by name
from tests.manifests.helpers import NAMESPACE, find, one, render_variant, rule_allows
from webhook.admission import reviews
from webhook.certs import pki
from webhook.localcluster import processes

pytestmark = pytest.mark.slow


def _get(port: int, path: str, context: ssl.SSLContext | None, server_name: str) -> tuple[int, bytes]:
    if context is None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    else:
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
        connection.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), 5),
                                              server_hostname=server_name)
    return processes.http_get(connection, path)


def _kubeconfig(path: Path, server: str) -> Path:
    """What the pod's mounted token gives ``--resolve-claims`` in the cluster: the API server's address."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "in-cluster", "cluster": {"server": server}}],
        "users": [{"name": "gpugate-webhook", "user": {"token": "service-account-token"}}],
        "contexts": [{"name": "pod", "context": {"cluster": "in-cluster", "user": "gpugate-webhook"}}]}))
    return path


CLAIM_ONLY_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "namespace": "team-a"},
                  "spec": {"containers": [{"name": "main", "image": "registry.example/app:1",
                                           "resources": {"claims": [{"name": "gpus"}]}}],
                           "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]}}
TWO_GPUS = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "two-gpus", "namespace": "team-a"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}}


def _review(port: int, path: str, context: ssl.SSLContext, server_name: str, pod: dict) -> list[dict]:
    """POST an AdmissionReview for ``pod`` as the API server does; the JSON patch of the answer."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    connection.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), 10),
                                          server_hostname=server_name)
    try:
        connection.request("POST", path, body=json.dumps(reviews.wrap_pod(pod, uid="u-1")),
                           headers={"Content-Type": "application/json"})
        response = json.loads(connection.getresponse().read())["response"]
    finally:
        connection.close()
    assert response["allowed"] is True, response
    return json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []


def test_deployment_args_serve_the_probes_over_tls_and_metrics_in_plaintext(tmp_path: Path, fake_kube: FakeKube
                                                                            ) -> None:
    """... and, with the Deployment's --resolve-claims and the token its RBAC binds, a pod asking GPUs
    only through a claim template is shaped (tolerations), every API call it made being one the
    rendered RBAC grants."""
    fake_kube.register("resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates", namespaced=True)
    fake_kube.register("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", namespaced=True)
    fake_kube.put(TWO_GPUS)
    objs = render_variant("webhook")
    deployment = one(objs, "Deployment", "gpugate-webhook")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}

    # What each mounted volume holds in the cluster, in a folder of its own.
    mounted: dict[str, Path] = {}
    for mount in container["volumeMounts"]:
        local = tmp_path / mount["name"]
        local.mkdir()
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            rendered = [c for c in find(objs, "ConfigMap") if c["metadata"]["name"] == volume["configMap"]["name"]]
            if not rendered and volume["configMap"].get("optional"):
                mounted[mount["mountPath"]] = local  # written at run time (the balancer's inventory): empty
                continue
            [config_map] = rendered
            for key, text in config_map["data"].items():
                (local / key).write_text(text)
        elif "secret" in volume:
            bundle = pki.create_bundle(service="gpugate-webhook", namespace=NAMESPACE,
                                         now=datetime.now(UTC))
            (local / "tls.crt").write_bytes(bundle.cert)
            (local / "tls.key").write_bytes(bundle.key)
            (local / "ca.crt").write_bytes(bundle.ca_cert)
            ca_file = local / "ca.crt"
        mounted[mount["mountPath"]] = local

    def local_path(value: str) -> str:
        for mount_path, local in sorted(mounted.items(), key=lambda item: -len(item[0])):
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(local) + value[len(mount_path):]
        return value

    https_port, metrics_port = processes.free_port(), processes.free_port()
    args = []
    for arg in container["args"]:
        flag, _, value = arg.partition("=")
        if flag == "--bind":
            value = f"127.0.0.1:{https_port}"
        elif flag == "--metrics-bind":
            value = f"127.0.0.1:{metrics_port}"
        else:
            value = local_path(value)
        args.append(f"{flag}={value}" if value else flag)
    env = {**os.environ, **{e["name"]: local_path(e["value"]) for e in container.get("env", []) if "value" in e}}
    if pod.get("automountServiceAccountToken"):
        env["KUBECONFIG"] = str(_kubeconfig(tmp_path / "kubeconfig.json", fake_kube.url))
    log = (tmp_path / "serve.log").open("wb")  # a file, not a pipe: a full pipe would stall the server
    process = subprocess.Popen([sys.executable, "-m", "webhook.cli", "serve", *args], env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        context = ssl.create_default_context(cafile=str(ca_file))
        name = f"gpugate-webhook.{NAMESPACE}.svc"  # what the API server dials, verified against the CA
        ready_path = container["readinessProbe"]["httpGet"]["path"]
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"gpugate serve exited {process.returncode}: {(tmp_path / 'serve.log').read_text()}")
            try:
                status, _ = _get(https_port, ready_path, context, name)
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert status == 200, f"{ready_path} never answered 200 over TLS"
        live_status, _ = _get(https_port, container["livenessProbe"]["httpGet"]["path"], context, name)
        assert live_status == 200
        metrics_status, body = _get(metrics_port, "/metrics", None, name)
        assert metrics_status == 200 and b"gpugate_" in body
        patch = _review(https_port, "/mutate", context, name, CLAIM_ONLY_POD)
        tolerations = [op["value"] for op in patch if op["path"] == "/spec/tolerations"]
        assert tolerations == [[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]], patch
    finally:
        processes.terminate(process, grace=20)
        log.close()
    rules = [rule for role in find(objs, "ClusterRole") for rule in role["rules"]
             if any(b["roleRef"]["name"] == role["metadata"]["name"] and b["subjects"][0]["name"] == "gpugate-webhook"
                    for b in find(objs, "ClusterRoleBinding"))]
    made = [(r.method, r.path, r.query) for r in fake_kube.requests]
    assert ("GET", "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates/two-gpus") in [
        (method, path) for method, path, _ in made]
    assert any(path == "/apis/resource.k8s.io/v1/deviceclasses" for _, path, _ in made)  # the classes' watch
    for method, path, query in made:
        group, resource, name = _target(path)
        verb = "get" if name else "watch" if query.get("watch") in ("true", "1") else "list"
        assert method == "GET" and rule_allows(rules, verb=verb, group=group, resource=resource, name=name), \
            f"{method} {path} is not granted to gpugate-webhook"


def _target(path: str) -> tuple[str, str, str | None]:
    """(API group, resource, name or None) of a request path (``/api/v1/...`` or ``/apis/g/v/...``)."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    return group, rest[0], rest[1] if len(rest) > 1 else None
