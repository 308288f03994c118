"""The balancer as its Deployment configures it, run against the fake API server: every call it makes
is allowed by the RBAC of manifests/balancer (the static tests show the RBAC grants nothing more)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.kubefake import FakeKube, fake_kube  # noqa: F401 - the fixture is used by name
from tests.manifests.helpers import arg_value, one, render_variant, rule_allows
from webhook.localcluster import processes
from webhook.names import GPU_FREE_LABEL

pytestmark = pytest.mark.slow


def _rbac_verb(method: str, query: dict[str, str], named: bool) -> str:
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if named else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]


def _is_discovery(path: str) -> bool:
    """``/api``, ``/apis``, ``/api/v1`` or ``/apis/<group>/<version>``: API discovery, which the
    ``system:discovery`` ClusterRole grants every authenticated user, so no role of ours needs it."""
    parts = path.strip("/").split("/")
    return len(parts) <= (2 if parts[0] == "api" else 3)


def _parse(path: str) -> tuple[str, str | None, str, str | None]:
    """(group, namespace, resource, name) of an API path."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    return group, namespace, rest[0], rest[1] if len(rest) > 1 else None


@pytest.mark.parametrize("watch_list", [True, False], ids=["streamed-lists", "paged-lists"])
def test_the_deployed_balancer_needs_no_more_than_its_rbac(fake_kube: FakeKube, tmp_path: Path,
                                                           watch_list: bool) -> None:
    """Both list paths: streamed (a watch with sendInitialEvents) and, on a server without them, pages."""
    fake_kube.watch_list = watch_list
    fake_kube.register("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", namespaced=False)
    fake_kube.register("resource.k8s.io", "v1", "ResourceSlice", "resourceslices", namespaced=False)
    fake_kube.register("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", namespaced=True)
    objs = render_variant("balancer")
    deployment = one(objs, "Deployment", "gpugate-balancer")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    namespace = deployment["metadata"]["namespace"]
    health_port = processes.free_port()
    args = [f"--health-bind=127.0.0.1:{health_port}" if a.startswith("--health-bind") else a
            for a in container["args"]]
    # The downward API values the pod would get.
    env = {**os.environ, "POD_NAME": "gpugate-balancer-7d9f-abcde", "POD_NAMESPACE": namespace}
    fake_kube.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"},
                   "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"},
                              "capacity": {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"}}})
    assert container["command"][:2] == ["gpugate", "balance"]
    log = (tmp_path / "balance.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "webhook.cli", *container["command"][1:], *args,
                                "--server", fake_kube.url], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            node = fake_kube.get("v1", "Node", "gpu-1")
            lease = fake_kube.get("coordination.k8s.io/v1", "Lease", arg_value(container, "--lease-name"), namespace)
            inventory = fake_kube.get("v1", "ConfigMap", "gpugate-inventory", namespace)
            if lease is not None and GPU_FREE_LABEL in (node["metadata"].get("labels") or {}) and inventory:
                break
            assert process.poll() is None, (tmp_path / "balance.log").read_text()
            time.sleep(0.1)
        else:
            pytest.fail(f"the balancer did not take its Lease, label the node and publish its inventory: "
                        f"{(tmp_path / 'balance.log').read_text()}")
        for kind in ("livenessProbe", "readinessProbe"):
            probe = container[kind]["httpGet"]["path"]
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}{probe}", timeout=5) as response:
                assert response.status == 200, kind
    finally:
        processes.terminate(process, grace=20)
        log.close()

    cluster_rules = one(objs, "ClusterRole", "gpugate-balancer")["rules"]
    role = one(objs, "Role", "gpugate-balancer")
    checked = set()
    for request in fake_kube.requests:
        if _is_discovery(request.path):
            continue
        group, ns, resource, name = _parse(request.path)
        verb = _rbac_verb(request.method, request.query, name is not None)
        allowed = rule_allows(cluster_rules, verb=verb, group=group, resource=resource, name=name) or (
            ns == role["metadata"]["namespace"]
            and rule_allows(role["rules"], verb=verb, group=group, resource=resource, name=name))
        assert allowed, f"{request.method} {request.path} ({verb} {resource}) is not granted"
        checked.add((verb, resource))
    # Lists are streamed (a watch with sendInitialEvents) where the server allows it; else paged.
    assert {("watch", "nodes"), ("watch", "pods"), ("watch", "priorityclasses"), ("patch", "nodes"),
            ("watch", "resourceslices"), ("watch", "resourceclaims"),
            ("create", "leases"), ("get", "configmaps"), ("create", "configmaps")} <= checked
    if not watch_list:
        assert {("list", "nodes"), ("list", "pods"), ("list", "priorityclasses")} <= checked
