"""The ``gpugate`` group: lazy subcommands, and a clear word when an optional extra is missing."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from webhook.cli import COMMANDS, main


def test_help_lists_every_command_without_importing_them() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in result.output
    assert "unavailable" not in result.output


def test_a_missing_extra_is_named_with_the_install_command() -> None:
    """Without numpy (the replay extra), `gpugate replay` says what to install instead of a traceback."""
    code = ("import sys; sys.modules['numpy'] = None; sys.modules['matplotlib'] = None\n"
            "from webhook.cli import main\nmain(['replay', '--seeds', '1', '--arms', 'random'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "needs numpy, which is not installed" in proc.stderr
    assert "pip install 'gpugate[replay]'" in proc.stderr
    assert "Traceback" not in proc.stderr
