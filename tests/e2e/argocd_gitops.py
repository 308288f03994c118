"""The Git side of the Argo CD tests: a fork of the project in a temp folder, and ``gpugate stack``
run in it as a platform engineer would.

* :func:`fork_of_worktree`: a clone of the project (its history, so ``gpugate stack rollback``
  finds earlier stack commits) with the working tree's uncommitted changes on top as one commit:
  the tests judge the files as they are now, not only what is committed.
* :func:`point_at_fork`: the override a user makes for their fork, applied in the clone only,
  never in the working tree: the repository URL (and NVIDIA's chart repository) replaced by the
  loopback git daemon and Helm repository, committed. It uses the project's documented way
  (``docs/gitops.md``, "Before you start: the repository URL").
* :class:`Fork`: ``gpugate stack ...`` against the clone, with the schemas from ``../shared``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.argocd_harness import run

ROOT = Path(__file__).resolve().parents[2]
GPUGATE = Path(sys.executable).with_name("gpugate")
PLACEHOLDER_REPO = "https://github.com/example-org/gpugate.git"
NVIDIA_CHARTS = "https://helm.ngc.nvidia.com/nvidia"
AUTHOR = ("-c", "user.name=gpugate e2e", "-c", "user.email=e2e@gpugate.invalid", "-c", "commit.gpgsign=false")


def git(repo: Path, *args: str, check: bool = True) -> str:
    return run(["git", *AUTHOR, "-C", str(repo), *args], check=check).stdout


def fork_of_worktree(source: Path, target: Path) -> Path:
    """Clone ``source`` into ``target`` and copy the working tree's changes over it, committed.

    Only ``git clone`` and ``git ls-files`` touch ``source``: neither writes its index or history.
    """
    run(["git", "clone", "-q", "--no-hardlinks", str(source), str(target)])
    # Argo CD tracks `main` (argocd/): a worktree on another branch is forked as the fork's main.
    git(target, "checkout", "-q", "-B", "main")
    listed = run(["git", "-C", str(source), "ls-files", "-z", "--modified", "--deleted", "--others",
                  "--exclude-standard"]).stdout
    changed = sorted({p for p in listed.split("\0") if p})
    for relative in changed:
        origin, copy = source / relative, target / relative
        if origin.is_file():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, copy)
        elif copy.is_file():
            copy.unlink()
    git(target, "config", "user.name", "gpugate e2e")
    git(target, "config", "user.email", "e2e@gpugate.invalid")
    git(target, "add", "-A")
    if git(target, "status", "--porcelain").strip():
        git(target, "commit", "-q", "--no-verify", "-m", f"Working tree of {source} ({len(changed)} paths)")
    return target


@dataclass(frozen=True)
class ForkOverride:
    """What was changed to point Argo CD at the fork, and how (for the report)."""

    method: str
    files: tuple[str, ...]


SITE = Path("argocd/site/site.yaml")


def point_at_fork(repo: Path, git_url: str, chart_url: str) -> ForkOverride:
    """Point every Application and the AppProject at ``git_url`` and the chart at ``chart_url``,
    the way the project documents for a fork, and commit it in the clone.

    Now that is ``argocd/site/site.yaml`` (``repoURL``, ``chartRepoURL``; kustomize
    replacements copy them into the Applications and the AppProject, docs/gitops.md "Point Argo
    CD at your fork"). A tree without it gets the former documented override: a
    search-and-replace of the placeholder URLs over ``argocd/``.
    """
    site = repo / SITE
    if site.is_file():
        text = site.read_text()
        new = text
        for key, value in (("repoURL", git_url), ("chartRepoURL", chart_url)):
            new, count = re.subn(rf"^(\s+{key}:)\s*\S+", rf"\g<1> {value}", new, count=1, flags=re.MULTILINE)
            if count != 1:
                raise AssertionError(f"{SITE} has no data.{key}: how does a fork point Argo CD at itself now?")
        site.write_text(new)
        changed = [str(SITE)]
        method = f"{SITE} data.repoURL and data.chartRepoURL (docs/gitops.md, 'Point Argo CD at your fork')"
    else:
        changed = []
        for path in sorted((repo / "argocd").rglob("*.yaml")):
            text = path.read_text()
            new = text.replace(PLACEHOLDER_REPO, git_url).replace(NVIDIA_CHARTS, chart_url)
            if new != text:
                path.write_text(new)
                changed.append(str(path.relative_to(repo)))
        if not changed:
            raise AssertionError(f"neither {SITE} nor the placeholder {PLACEHOLDER_REPO} under argocd/: "
                                 "how does a fork point Argo CD at itself now? (update point_at_fork)")
        method = "search-and-replace of the placeholder URLs over argocd/ (docs/gitops.md's former override)"
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--no-verify", "-m", f"Point Argo CD at our fork {git_url} and chart mirror {chart_url}")
    return ForkOverride(method, tuple(changed))


def applications_in_git(repo: Path) -> dict[str, int]:
    """Application name -> sync wave, as the root Application renders ``argocd/apps``."""
    rendered = run(["kubectl", "kustomize", str(repo / "argocd" / "apps")]).stdout
    return {doc["metadata"]["name"]: int((doc["metadata"].get("annotations") or {})
                                         .get("argocd.argoproj.io/sync-wave", "0"))
            for doc in yaml.safe_load_all(rendered) if doc and doc.get("kind") == "Application"}


@dataclass
class Fork:
    """The fork's working clone (served by the git daemon as it is: commits are visible at once)."""

    path: Path
    kubeconfig: Path
    helm: Path | None = None
    """The e2e helm: ``gpugate stack`` renders the target chart with it (``$GPUGATE_HELM``)."""
    schemas: Path = ROOT.parent / "shared" / "schemas"

    def head(self) -> str:
        return git(self.path, "rev-parse", "HEAD").strip()

    def subject(self, revision: str = "HEAD") -> str:
        return git(self.path, "log", "-1", "--format=%s", revision).strip()

    def stack(self, *args: str, exit_codes: Sequence[int] = (0,)) -> str:
        """``gpugate stack ARGS --repo FORK`` (``--schemas`` for the commands that check drivers)."""
        return self._stack(args, exit_codes)[1]

    def _stack(self, args: Sequence[str], exit_codes: Sequence[int]) -> tuple[int, str]:
        command = [str(GPUGATE), "stack", *args, "--repo", str(self.path)]
        if args and args[0] in ("plan", "upgrade", "promote", "sync", "rollback", "canary"):
            command += ["--schemas", str(self.schemas)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["KUBECONFIG"] = str(self.kubeconfig)
        if self.helm is not None:
            env["GPUGATE_HELM"] = str(self.helm)
        result = run(command, env=env, check=False, timeout=240)
        if result.returncode not in exit_codes:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        return result.returncode, result.stdout

    def status(self) -> tuple[int, dict[str, Any]]:
        """``gpugate stack status --kube -o json`` and its exit code (1: a node failed its upgrade)."""
        code, out = self._stack(("status", "--kube", "-o", "json"), (0, 1))
        return code, dict(json.loads(out))

    def file(self, relative: str) -> str:
        return (self.path / relative).read_text()


def pool_counts(status: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Pool name -> {upgrade state: node count} from ``stack status --kube -o json``."""
    return {p["name"]: dict(p["upgradeStates"]) for p in status["cluster"]["pools"]}


def driver_states(status: dict[str, Any]) -> dict[str, str]:
    return {d["name"]: d["state"] for d in status["cluster"]["nvidiaDrivers"] or []}


def yaml_value(text: str, key: str) -> str | None:
    """The first ``key: value`` of a YAML text (enough for a version pin)."""
    match = re.search(rf"^\s*{re.escape(key)}:\s*['\"]?([^'\"\s#]+)", text, re.MULTILINE)
    return match.group(1) if match else None


def changed_files(repo: Path, revision: str) -> Sequence[str]:
    return [line for line in git(repo, "show", "--name-only", "--format=", revision).splitlines() if line]
