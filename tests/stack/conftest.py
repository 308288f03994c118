"""Fixtures for the stack tests: a real git repository in a temp folder, copied from the project.

The copy holds ``manifests/`` and ``argocd/`` as they are in this checkout, and a ``shared``
symlink beside it (when ../shared exists) so the default ``<repo>/../shared/schemas`` resolves
the same way it does for the real repository.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.prerequisites import missing, needed, optional
from webhook.stack import manifests
from webhook.stack.model import Stack

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"

GIT_ENV = {
    "GIT_AUTHOR_NAME": "stack test", "GIT_AUTHOR_EMAIL": "stack@test.invalid",
    "GIT_COMMITTER_NAME": "stack test", "GIT_COMMITTER_EMAIL": "stack@test.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV, "HOME": str(repo.parent)})
    return proc.stdout


def snapshot(repo: Path) -> str:
    """A hash of every file outside .git (path + bytes) plus HEAD: equal means byte-identical."""
    digest = hashlib.sha256()
    for path in sorted(p for p in repo.rglob("*") if ".git" not in p.relative_to(repo).parts):
        if path.is_file() or path.is_symlink():
            digest.update(str(path.relative_to(repo)).encode() + b"\0")
            digest.update(path.read_bytes() if path.is_file() else os.readlink(path).encode())
    digest.update(git(repo, "rev-parse", "HEAD").encode())
    return digest.hexdigest()


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "--all")
    git(repo, "commit", "-q", "-m", message)


def write_stack(repo: Path, stack: Stack) -> None:
    """Set the repo to ``stack`` (stack.yaml and every derived file), as a person editing by hand would."""
    changes = manifests.derive(stack, manifests.read_files(repo))
    for rel, content in changes.items():
        target = repo / rel
        if content is None:
            target.unlink()
        else:
            target.write_bytes(content)


@pytest.fixture
def stack_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository with the project's manifests/ and argocd/, one commit, clean."""
    if shutil.which("kubectl") is None:
        missing("kubectl is not installed: stack upgrades re-render manifests with the real "
                "`kubectl kustomize` (CI installs and checks it)")
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HOME", str(tmp_path))
    repo = project_copy(tmp_path / "repo", commit=False)
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    # The chart render of `gpugate stack` must not reach for NVIDIA's repository from a test: use
    # the chart packages beside the checkout, or (a fresh clone with helm on PATH) skip the render.
    charts = SHARED / "upstream" / "charts"
    if optional(charts / "index.yaml", "the chart render of `gpugate stack`"):
        monkeypatch.setenv("GPUGATE_CHART_REPO", f"file://{charts}")
    else:
        monkeypatch.setenv("GPUGATE_SKIP_CHART_RENDER", "1")
    git(repo, "init", "-q", "-b", "main")
    commit_all(repo, "initial import")
    return repo


def project_copy(repo: Path, *, commit: bool = True) -> Path:
    """The project's manifests/ and argocd/ as they are in this checkout, at ``repo`` (a git repository
    with them as its first commit when ``commit``; the caller sets the git identity)."""
    repo.mkdir(parents=True)
    for folder in ("manifests", "argocd"):
        if (ROOT / folder).is_dir():
            shutil.copytree(ROOT / folder, repo / folder)
    if commit:
        git(repo, "init", "-q", "-b", "main")
        commit_all(repo, "initial import")
    return repo


@pytest.fixture
def require_shared() -> Path:
    return needed(SHARED, "fresh clone: no NVIDIADriver CRD or chart values to check against")


@pytest.fixture
def shared_or_none() -> Path | None:
    """../shared when present; tests still run without it, minus the CRD validation."""
    return optional(SHARED, "the CRD validation")


@pytest.fixture
def set_stack(stack_repo: Path) -> Callable[..., Stack]:
    """Commit a variant of the checked-in stack: ``set_stack(operator="v26.3.3", management=...)``."""

    def apply(*, message: str = "set up stack", pools: dict[str, dict] | None = None, **changes) -> Stack:
        stack = manifests.load_stack(stack_repo)
        if "operator_version" in changes and isinstance(changes["operator_version"], str):
            from webhook.stack.releases import OperatorVersion
            changes["operator_version"] = OperatorVersion.parse(changes["operator_version"])
        if changes.get("management") == "clusterpolicy":
            stack = stack.replace(pools=(stack.default_pool,))
        stack = stack.replace(**changes)
        for name, fields in (pools or {}).items():
            stack = stack.with_pool(name, **fields)
        write_stack(stack_repo, stack)
        commit_all(stack_repo, message)
        return stack

    return apply
