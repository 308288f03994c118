"""A real ``gpugate serve`` in a subprocess, and an HTTPS client that verifies it like the API server.

No pytest here: the chaos benchmark drives the same harness.

The client connects to 127.0.0.1 but verifies the certificate for the Service's DNS name
(``gpugate-webhook.gpugate-system.svc``) with the generated CA, as the kube-apiserver does with
the webhook configuration's caBundle.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
import yaml
from requests.adapters import HTTPAdapter

from webhook.admission import reviews

REPO = Path(__file__).resolve().parents[2]
SERVICE_HOST = "gpugate-webhook.gpugate-system.svc"
EXAMPLE_POD = REPO / "webhook" / "examples" / "pod-training.yaml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServiceNameAdapter(HTTPAdapter):
    """Verify the server certificate for ``server_hostname`` whatever address the URL names."""

    def __init__(self, server_hostname: str, **kwargs: Any) -> None:
        self._server_hostname = server_hostname
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["server_hostname"] = self._server_hostname
        super().init_poolmanager(*args, **kwargs)


def https_session(ca: Path, server_hostname: str = SERVICE_HOST, pool: int = 10) -> requests.Session:
    session = requests.Session()
    session.trust_env = False          # REQUESTS_CA_BUNDLE would otherwise replace our CA
    session.verify = str(ca)
    session.mount("https://", ServiceNameAdapter(server_hostname, pool_connections=pool, pool_maxsize=pool))
    return session


class Server:
    """``gpugate serve`` as a subprocess; its stderr (JSON lines) goes to ``log_path``."""

    def __init__(self, workdir: Path, *, policies: Path | None, extra: list[str] | None = None,
                 workers: int = 2, threads: int = 4) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.state_dir = workdir / "state"
        self.log_path = workdir / "server.log"
        self.metrics_port = free_port()
        self.args = [sys.executable, "-m", "webhook.cli", "serve", "--bind", f"127.0.0.1:{self.port}",
                     "--state-dir", str(self.state_dir), "--workers", str(workers), "--threads", str(threads),
                     "--reload-interval", "0.2", "--metrics-bind", f"127.0.0.1:{self.metrics_port}"]
        if policies is not None:
            self.args += ["--policies", str(policies)]
        self.args += extra or []
        self.process: subprocess.Popen[bytes] | None = None
        self.ca: Path = self.state_dir / "ca.crt"

    def start(self, *, ca: Path | None = None, wait_ready: bool = True) -> Server:
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(self.args, cwd=self.workdir, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True)
        if ca is not None:
            self.ca = ca
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"gpugate serve exited {self.process.returncode}:\n{self.log_text()}")
            if self.ca.exists():
                try:
                    with https_session(self.ca) as session:
                        if session.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                            if not wait_ready or session.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                                break
                except requests.RequestException:
                    pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"gpugate serve did not become ready:\n{self.log_text()}")
            time.sleep(0.1)
        self.session = https_session(self.ca)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        if hasattr(self, "session"):
            self.session.close()
        if hasattr(self, "_log"):
            self._log.close()

    def ctrl_c(self) -> float:
        """Send SIGINT to the whole process group, as a terminal's Ctrl-C does; seconds until it exited."""
        assert self.process is not None
        started = time.monotonic()
        os.killpg(self.process.pid, signal.SIGINT)
        self.process.wait(15)
        return time.monotonic() - started

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON objects of the server's log (non-JSON lines, e.g. the start banner, skipped)."""
        out = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def post(self, endpoint: str, body: Any, **kwargs: Any) -> requests.Response:
        data = json.dumps(body) if isinstance(body, (dict, list)) else body
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        return self.session.post(f"{self.url}/{endpoint}", data=data, headers=headers, timeout=10, **kwargs)

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {'name{labels}': value}, from the plaintext metrics port (the TLS
        port serves admission only)."""
        text = requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                samples[key] = float(value)
        return samples


@contextmanager
def running(workdir: Path, *extra: str) -> Iterator[Server]:
    """A server on the repository's policies (copied into ``workdir``) with ``extra`` flags, stopped after."""
    srv = Server(workdir, policies=copy_policies(workdir / "policies"), extra=list(extra)).start()
    try:
        yield srv
    finally:
        srv.stop()


def example_pod() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE_POD.read_text())


def review_of(pod: dict[str, Any], *, namespace: str = "ml-vision", operation: str = "CREATE",
              dry_run: bool = False) -> dict[str, Any]:
    return reviews.wrap_pod(pod, uid=str(uuid.uuid4()), namespace=namespace, operation=operation,
                              dry_run=dry_run)


def copy_policies(target: Path) -> Path:
    """The repository's policies/ (the files the loader reads) copied to ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for path in (REPO / "policies").glob("*.yaml"):
        shutil.copy(path, target / path.name)
    return target


class ConfigMapVolume:
    """A folder laid out and updated the way the kubelet does for a ConfigMap volume."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True)
        self._generation = 0

    def publish(self, files: dict[str, str]) -> None:
        self._generation += 1
        payload = self.root / f"..2026_11_30_00_00_{self._generation:02d}.{uuid.uuid4().hex[:6]}"
        payload.mkdir()
        for name, text in files.items():
            (payload / name).write_text(text)
        tmp_link = self.root / "..data_tmp"
        tmp_link.symlink_to(payload.name)
        os.replace(tmp_link, self.root / "..data")       # the atomic swap
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        for name in os.listdir(self.root):                 # keys gone from the ConfigMap lose their link
            if not name.startswith(".") and name not in files:
                (self.root / name).unlink()
        for old in self.root.glob("..2026_*"):
            if old.name != payload.name:
                shutil.rmtree(old)


def repo_policies() -> dict[str, str]:
    return {p.name: p.read_text() for p in (REPO / "policies").glob("*.yaml") if p.name != "kustomization.yaml"}
