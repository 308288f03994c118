"""A Helm chart repository on loopback: a folder of chart packages plus its index.yaml, over HTTP.

``../shared/upstream/charts`` holds NVIDIA's gpu-operator packages and an index; serving it on
127.0.0.1 stands in for https://helm.ngc.nvidia.com/nvidia, which no test machine reaches. Point
``chartRepoURL`` in argocd/site/site.yaml (or ``--chart-repo`` / ``$GPUGATE_CHART_REPO`` of
``gpugate stack``) at ``HelmRepo.url``.

    with HelmRepo.serve(CHARTS) as repo:
        helm template gpu-operator gpu-operator --repo {repo.url} --version v26.7.0

A thread of this process serves it (no child process to stop); ``close`` stops it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parents[3] / "shared"
CHARTS = SHARED / "upstream" / "charts"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """helm fetches index.yaml and a package per render: not worth a line each on stderr."""


class HelmRepo:
    """``folder`` served read-only at ``url`` (http://127.0.0.1:<free port>)."""

    def __init__(self, folder: Path) -> None:
        if not (folder / "index.yaml").is_file():
            raise FileNotFoundError(f"{folder}/index.yaml: not a Helm repository folder")
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="helm-repo", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    @classmethod
    @contextmanager
    def serve(cls, folder: Path = CHARTS) -> Iterator[HelmRepo]:
        repo = cls(folder)
        try:
            yield repo
        finally:
            repo.close()
