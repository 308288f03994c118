"""Run the project's own Job pods for real: what the fake kubelet cannot do.

The fake kubelet (``fakekubelet.py``) marks bound pods Running and never runs a container. That is
enough for Deployments, not for the webhook's certificate Job (``manifests/webhook/components/
builtin-tls/job.yaml``): it is an Argo CD ``Sync`` hook, so the sync waits until the Job
completes (gitops-engine ``pkg/sync/sync_context.go``: a running hook keeps the operation
Running), and its work (the TLS Secret, the caBundle of both webhook configurations) is what
the drift test is about.

So this thread does the container's part for pods of Jobs whose image is the project's
(``ghcr.io/gpugate/gpugate``): once the fake kubelet has them Running, it runs the container's
``command`` + ``args`` with the venv's ``gpugate`` console script, as the pod's ServiceAccount
(a TokenRequest token in a kubeconfig: the Job's RBAC from the manifests, nothing more), then
writes the pod's terminal status as a kubelet would (Succeeded, exit code 0). A failing run is
retried in place after a pause (``restartPolicy: OnFailure``: the kubelet restarts the
container), which also covers the Job starting before the webhook configurations exist (the
comment in job.yaml).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.localcluster.fakekubelet import STRATEGIC, succeeded_status

Obj = dict[str, Any]

PROJECT_IMAGE = "ghcr.io/gpugate/gpugate"
GPUGATE = Path(sys.executable).with_name("gpugate")
RETRY_SECONDS = 2.0
MAX_RUNS = 8


@dataclass
class JobRun:
    pod: str
    command: list[str]
    returncode: int
    output: str
    at: float


class ProjectJobRunner:
    """Runs the containers of the project's Job pods in ``namespace`` (one at a time)."""

    def __init__(self, api: client.ApiClient, kubeconfig: Path, workdir: Path, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.namespace = namespace
        self.runs: list[JobRun] = []
        self.errors: list[str] = []
        self._done: set[str] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="project-job-runner", daemon=True)

    def start(self) -> ProjectJobRunner:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=70)

    def describe(self) -> str:
        lines = [f"  {r.pod}: exit {r.returncode}: {' '.join(r.command[1:3])} ... -> {r.output.strip()[-300:]}"
                 for r in self.runs[-6:]]
        return "project Job runs:\n" + ("\n".join(lines) or "  none") + f"\nerrors: {self.errors[-3:] or 'none'}"

    def _loop(self) -> None:
        while not self._stopping.wait(0.3):
            try:
                response = self.core.list_namespaced_pod(self.namespace, label_selector="batch.kubernetes.io/job-name",
                                                         _preload_content=False)
                for pod in json.loads(response.data)["items"]:
                    if self._stopping.is_set():
                        return
                    if self._wanted(pod):
                        self._run_pod(pod)
            except Exception as error:  # kept for describe(); the next pass tries again
                self.errors.append(f"{time.strftime('%H:%M:%S')} {error!r}"[:1000])

    def _wanted(self, pod: Obj) -> bool:
        meta, spec = pod["metadata"], pod["spec"]
        return (meta["uid"] not in self._done and not meta.get("deletionTimestamp")
                and (pod.get("status") or {}).get("phase") == "Running"
                and all(c.get("image", "").startswith(PROJECT_IMAGE + ":") for c in spec["containers"]))

    def _run_pod(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        self._done.add(meta["uid"])
        kubeconfig = self._service_account_kubeconfig(spec.get("serviceAccountName") or "default")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}  # never in-cluster
        env["KUBECONFIG"] = str(kubeconfig)
        for container in spec["containers"]:
            argv = [*(container.get("command") or []), *(container.get("args") or [])]
            if not argv or argv[0] != "gpugate":
                self.errors.append(f"{meta['name']}: not a gpugate command: {argv}")
                return
            command = [str(GPUGATE), *argv[1:]]
            for attempt in range(1, MAX_RUNS + 1):
                result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
                self.runs.append(JobRun(meta["name"], command, result.returncode, result.stdout + result.stderr,
                                        time.monotonic()))
                if result.returncode == 0:
                    break
                if attempt == MAX_RUNS or self._stopping.wait(RETRY_SECONDS):
                    return  # the pod stays Running, as a crash-looping container's would
        self.core.patch_namespaced_pod_status(meta["name"], self.namespace, succeeded_status(pod, now=time.time()),
                                              _content_type=STRATEGIC)

    def _service_account_kubeconfig(self, account: str) -> Path:
        """A kubeconfig holding a fresh token of ``account``: its RBAC, nothing more."""
        deadline = time.monotonic() + 30
        while True:
            try:
                token = self.core.create_namespaced_service_account_token(
                    account, self.namespace, {"spec": {"expirationSeconds": 3600}}).status.token
                break
            except ApiException as error:  # the ServiceAccount is synced in the same wave
                if error.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        admin = yaml.safe_load(self.kubeconfig.read_text())
        document = {"apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
                    "users": [{"name": account, "user": {"token": token}}],
                    "contexts": [{"name": account, "context": {"cluster": admin["clusters"][0]["name"],
                                                              "user": account}}],
                    "current-context": account}
        path = self.workdir / f"{account}.kubeconfig"
        path.write_text(yaml.safe_dump(document))
        path.chmod(0o600)
        return path
