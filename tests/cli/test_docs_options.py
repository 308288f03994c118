"""Every option of ``gpugate serve`` is in docs/server.md's table (``--resolve-claims``, which the
shipped manifests turn on, was missing)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from webhook.commands.serve import serve

ROOT = Path(__file__).resolve().parents[2]


def test_every_serve_option_is_in_the_options_table() -> None:
    table = (ROOT / "docs" / "server.md").read_text(encoding="utf-8").split("## Options", 1)[1].split("\n## ", 1)[0]
    options = [name for param in serve.params if isinstance(param, click.Option) for name in param.opts
               if name.startswith("--") and name != "--help"]
    missing = [name for name in options if not re.search(rf"{re.escape(name)}(?![\w-])", table)]
    assert not missing, f"docs/server.md's Options table lacks {missing}"
