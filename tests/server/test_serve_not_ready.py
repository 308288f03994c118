"""``gpugate serve`` on a folder it cannot serve says so in words, on a real gunicorn server.

It used to print only "serving https://..." and stay up, unready, with the reason in JSON lines.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.server.harness import ConfigMapVolume, Server, repo_policies


def _words(server: Server) -> str:
    """The log without its JSON lines: what a person reads in the terminal."""
    return "\n".join(line for line in server.log_text().splitlines() if not line.startswith("{"))


@pytest.mark.parametrize("content", ["empty", "invalid"])
def test_serve_says_it_is_not_ready_and_why_until_a_valid_set_loads(tmp_path: Path, content: str) -> None:
    volume = ConfigMapVolume(tmp_path / "policies")
    if content == "invalid":
        volume.publish({"bad.yaml": "apiVersion: gpugate.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: x}\n"
                                    "spec: {gpu: {max: eight}}\n"})
    server = Server(tmp_path, policies=volume.root).start(wait_ready=False)
    try:
        words = _words(server)
        assert "NOT READY" in words and "until a valid set loads" in words, words
        expected = "holds no GPUPolicy" if content == "empty" else "bad.yaml, document 1, spec.gpu.max"
        assert expected in words, words
        assert server.session.get(f"{server.url}/readyz", timeout=5).status_code == 503
        volume.publish(repo_policies())
        deadline = time.monotonic() + 20
        while server.session.get(f"{server.url}/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.2)
    finally:
        server.stop()


def test_serve_with_a_valid_set_prints_no_warning(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path / "policies")
    volume.publish(repo_policies())
    server = Server(tmp_path, policies=volume.root).start()
    try:
        assert "NOT READY" not in server.log_text()
    finally:
        server.stop()
