"""The gpugate containers' arguments are accepted by the real commands (parsed, not run)."""

from __future__ import annotations

import json
import re

import click
import pytest

from tests.manifests.helpers import REPO, containers, pod_specs, render_variant
from webhook.cli import main


def _entrypoint() -> list[str]:
    [line] = [entry for entry in (REPO / "Dockerfile").read_text().splitlines() if entry.startswith("ENTRYPOINT")]
    return json.loads(line.partition(" ")[2])


def _gpugate_invocations() -> list[tuple[str, list[str]]]:
    found = []
    for obj in render_variant("all"):
        for label, pod in pod_specs(obj):
            for container in containers(pod):
                if not re.search(r"/gpugate/gpugate[:@]", container["image"]):
                    continue
                argv = list(container.get("command") or _entrypoint()) + list(container.get("args") or [])
                assert argv[0] == "gpugate", f"{label}: runs {argv[0]}, not the gpugate CLI"
                found.append((f"{label}/{container['name']}", argv[1:]))
    return found


INVOCATIONS = _gpugate_invocations()


def test_all_gpugate_containers_are_checked() -> None:
    commands = sorted({argv[0] for _, argv in INVOCATIONS})
    assert commands == ["balance", "certs", "serve", "stack"]


@pytest.mark.parametrize(("where", "argv"), INVOCATIONS, ids=[w for w, _ in INVOCATIONS])
def test_container_arguments_parse(where: str, argv: list[str]) -> None:
    name, *args = argv
    with click.Context(main) as parent:
        command = main.get_command(parent, name)
        assert command is not None, f"{where}: no gpugate command {name!r}"
        try:
            command.make_context(name, list(args), parent=parent)
        except click.ClickException as err:
            pytest.fail(f"{where}: gpugate {name} refuses its arguments: {err.format_message()}")
