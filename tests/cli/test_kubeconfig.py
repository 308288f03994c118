"""``--kubeconfig`` and ``--context`` on every command that talks to a cluster: the named context is
the one talked to, whatever the file's current-context or $KUBECONFIG say."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from tests.kubefake import FakeKube
from webhook.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeKube]:
    with FakeKube() as server:
        yield server


def kubeconfig(path: Path, fake_url: str) -> Path:
    """Two contexts: ``good`` at the fake API server, ``nowhere`` (the current one) at a closed port."""
    clusters = {"good": fake_url, "nowhere": f"http://127.0.0.1:{closed_port()}"}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "nowhere",
        "clusters": [{"name": n, "cluster": {"server": url}} for n, url in clusters.items()],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": "u"}} for n in clusters]}))
    return path


def run(*args: object, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


CLUSTER_COMMANDS = [
    ("stack", "status", "--kube", "--repo", str(ROOT)),
    ("certs", "--secret", "gpugate-system/gpugate-webhook-tls", "--service", "gpugate-webhook"),
]


@pytest.mark.parametrize("args", CLUSTER_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_the_named_context_is_the_cluster_talked_to(tmp_path: Path, fake: FakeKube, args: tuple[str, ...]) -> None:
    config = kubeconfig(tmp_path / "config", fake.url)
    env = {"KUBECONFIG": str(tmp_path / "absent"), "KUBERNETES_SERVICE_HOST": ""}
    before = len(fake.requests)
    result = run(*args, "--kubeconfig", config, "--context", "good", env=env)
    assert result.exit_code == 0, result.output
    assert len(fake.requests) > before
    current = run(*args, "--kubeconfig", config, env=env)  # its current-context: a closed port
    assert current.exit_code == 1 and "connection refused" in current.output.lower()


def test_an_unknown_context_is_named(tmp_path: Path, fake: FakeKube) -> None:
    config = kubeconfig(tmp_path / "config", fake.url)
    result = run("stack", "status", "--repo", ROOT, "--kubeconfig", config, "--context", "typo")
    assert result.exit_code == 1 and "context typo" in result.output and "Traceback" not in result.output


def test_server_and_a_kubeconfig_together_are_a_usage_error(tmp_path: Path, fake: FakeKube) -> None:
    config = kubeconfig(tmp_path / "config", fake.url)
    result = run("stack", "status", "--kube", "--repo", ROOT, "--server", fake.url, "--kubeconfig", config)
    assert result.exit_code == 2 and "--server is used as is" in result.output


def _talks_to_a_cluster(command: click.Command) -> list[str]:
    """The (sub)commands of ``command`` that take --server for the API server."""
    if isinstance(command, click.Group):
        return [f"{command.name} {name}" for sub in command.commands.values() for name in _talks_to_a_cluster(sub)]
    opts = {opt for param in command.params for opt in param.opts}
    return [command.name or ""] if "--server" in opts and command.name not in ("admit",) else []


def test_every_command_with_an_api_server_option_takes_kubeconfig_and_context() -> None:
    """admit's --server is gpugate serve's URL, not an API server; serve reads claims in-cluster."""
    lacking = []
    for name in COMMANDS:
        command = main.get_command(click.Context(main), name)
        assert command is not None
        for path in _talks_to_a_cluster(command):
            leaf: click.Command = command
            for part in path.split()[1:]:
                assert isinstance(leaf, click.Group)
                leaf = leaf.commands[part]
            opts = {opt for param in leaf.params for opt in param.opts}
            if not {"--kubeconfig", "--context"} <= opts:
                lacking.append(path)
    assert not lacking, lacking
