"""Run one pod's container on this machine, as its kubelet would, with the pod's own identity.

The e2e control plane has no kubelet that runs containers: the fake kubelet only marks pods Running.
A pod whose outcome matters (a `helm test` hook: helm waits for its phase) is run here instead: its
container's command and args run as a local process (the image's ``gpugate`` is this venv's console
script), authenticated with a token the API server issues for the pod's ServiceAccount (TokenRequest,
bound to the pod), so RBAC judges it as it would judge the pod in a cluster. Its exit code becomes
the pod's phase, written through ``pods/status`` as a kubelet writes it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from webhook.localcluster.cluster import Cluster
from webhook.localcluster.fakekubelet import STRATEGIC, exited_status

IMAGE_COMMANDS = {"gpugate": str(Path(sys.executable).with_name("gpugate"))}
"""What the image's commands are on this machine."""

Obj = dict[str, Any]


@dataclass(frozen=True)
class HostRun:
    exit_code: int
    output: str


def wait_running(cluster: Cluster, namespace: str, name: str, timeout: float = 120.0) -> Obj:
    """The pod once the fake kubelet has started it (bound and Running)."""
    core = cluster.core()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pod = json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)
        except ApiException as error:
            if error.status != 404:
                raise
        else:
            if (pod.get("status") or {}).get("phase") == "Running":
                return pod
        time.sleep(0.2)
    raise AssertionError(f"pod {namespace}/{name} did not start within {timeout:.0f} s:\n{cluster.logs_tail()}")


def run(cluster: Cluster, pod: Obj, workdir: Path, timeout: float = 120.0) -> HostRun:
    """Run the pod's one container here with its ServiceAccount's token; write its exit as the pod's phase."""
    meta, spec = pod["metadata"], pod["spec"]
    [container] = spec["containers"]
    command = [*container.get("command", []), *container.get("args", [])]
    command[0] = IMAGE_COMMANDS.get(command[0], command[0])
    kubeconfig = workdir / f"{meta['name']}.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(_kubeconfig(cluster, pod)))
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False,
                          env={"KUBECONFIG": str(kubeconfig), "PATH": str(Path(sys.executable).parent)})
    core = cluster.core()
    core.patch_namespaced_pod_status(meta["name"], meta["namespace"],
                                     exited_status(pod, now=time.time(), exit_code=done.returncode),
                                     _content_type=STRATEGIC)
    return HostRun(exit_code=done.returncode, output=done.stdout + done.stderr)


def _kubeconfig(cluster: Cluster, pod: Obj) -> Obj:
    """A kubeconfig holding only a token bound to ``pod`` for its ServiceAccount (no admin key)."""
    meta = pod["metadata"]
    bound = {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]}
    request = {"spec": {"expirationSeconds": 600, "boundObjectRef": bound}}
    token = client.CoreV1Api(cluster.api_client()).create_namespaced_service_account_token(
        pod["spec"]["serviceAccountName"], meta["namespace"], request).status.token
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    [entry] = admin["clusters"]
    return {"apiVersion": "v1", "kind": "Config", "clusters": [entry],
            "users": [{"name": "pod", "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": entry["name"], "user": "pod"}}],
            "current-context": "pod"}
