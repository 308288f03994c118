"""What a new user trips on (issue 30): each check here failed, or said too little, before.

The CLI runs as a user runs it, on files in a temporary folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from webhook.cli import main
from webhook.errors import PolicyLoadError
from webhook.policy import loading
from webhook.policy.model import PolicySet
from webhook.policy.store import PolicyStore

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"


def run(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


# --- item 2: one rule for "servable" ------------------------------------------------------------

def test_policy_check_refuses_an_empty_folder_as_serve_does(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("no policies here\n")
    result = run("policy", "check", tmp_path)
    assert result.exit_code == 1, result.output
    assert "holds no GPUPolicy" in result.stderr and "--allow-empty-policies" in result.stderr
    refused = PolicyStore(tmp_path).check()
    assert not refused.loaded and refused.error in result.stderr  # the server's words, word for word
    allowed = run("policy", "check", tmp_path, "--allow-empty-policies")
    assert allowed.exit_code == 0 and "0 policies valid" in allowed.stdout
    assert PolicyStore(tmp_path, allow_empty=True).check().loaded


def test_policy_check_passes_exactly_what_the_store_loads(tmp_path: Path) -> None:
    shutil.copy(POLICIES / "training.yaml", tmp_path / "training.yaml")
    result = run("policy", "check", tmp_path)
    assert result.exit_code == 0 and "1 policy valid" in result.stdout, result.output
    assert PolicyStore(tmp_path).check().loaded
    with pytest.raises(PolicyLoadError, match="holds no GPUPolicy"):
        loading.require_servable(PolicySet.empty(), tmp_path)
