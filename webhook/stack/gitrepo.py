"""The git edge of ``gpugate stack``: a few porcelain commands run through subprocess.

Stack commits are found by their trailer (``Gpugate-Stack: upgrade|promote|rollback``), never
by position, so ordinary commits in between do not confuse a rollback; history is only added to.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from webhook.errors import GpugateError
from webhook.stack.messages import REVERTS_TRAILER, TRAILER

GIT_TIMEOUT_SECONDS = 60


class PushRefused(GpugateError):
    """The remote refused a push because its branch moved on (someone else pushed): fetch and redo."""


@dataclass(frozen=True)
class StackCommit:
    sha: str
    action: str
    subject: str
    reverts: str = ""
    """For a rollback commit: the sha of the stack commit it rolled back."""


class Repo:
    """A git working tree; every method runs one or two git commands in it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        top = self._git("rev-parse", "--show-toplevel", what=f"{self.path} is not inside a git repository").strip()
        self.root = Path(top)

    def _git(self, *args: str, what: str = "", input_text: str | None = None) -> str:
        try:
            proc = subprocess.run(["git", *args], cwd=self.path, capture_output=True, text=True,
                                  input=input_text, timeout=GIT_TIMEOUT_SECONDS, check=False)
        except FileNotFoundError as err:
            raise GpugateError("git is not on PATH") from err
        except subprocess.TimeoutExpired as err:
            raise GpugateError(f"git {args[0]} did not finish in {GIT_TIMEOUT_SECONDS}s") from err
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip()
            raise GpugateError(f"{what or 'git ' + ' '.join(args[:2]) + ' failed'}: {detail}")
        return proc.stdout

    def _log(self, limit: int, *fields: str) -> list[list[str]]:
        """``git log`` of the newest ``limit`` commits: per commit its sha, then each of ``fields``."""
        sep, end = "\x1f", "\x1e"
        out = self._git("log", f"-n{limit}", f"--format=%H{sep}{sep.join(fields)}{end}")
        return [record.strip("\n").split(sep, len(fields)) for record in out.split(end) if record.strip("\n")]

    def head(self) -> str:
        return self._git("rev-parse", "HEAD", what="the repository has no commit yet").strip()

    def dirty(self, paths: list[str]) -> list[str]:
        """Uncommitted changes: any tracked file, plus untracked files under ``paths``."""
        tracked = self._git("status", "--porcelain", "--untracked-files=no").splitlines()
        untracked = self._git("status", "--porcelain", "--untracked-files=all", "--", *paths).splitlines()
        return sorted({line for line in tracked + untracked if line.strip()})

    def require_clean(self, paths: list[str], *, allow: tuple[str, ...] = ()) -> None:
        """Refuse uncommitted changes; ``allow`` names tracked files that may be modified (not added)."""
        changes = [line for line in self.dirty(paths) if not (line[:2] == " M" and line[3:] in allow)]
        if changes:
            shown = "; ".join(line.strip() for line in changes[:8])
            more = f" and {len(changes) - 8} more" if len(changes) > 8 else ""
            raise GpugateError(f"the working tree has uncommitted changes ({shown}{more}); "
                               "commit or discard them first, so the stack commit holds only the tool's edits")

    def commit(self, paths: list[str], message: str) -> str:
        """Stage exactly ``paths`` (additions, edits, deletions) and commit them; returns the new sha."""
        self._git("add", "--all", "--", *paths, what="git add failed")
        try:
            self._git("commit", "--quiet", "--no-verify", "-F", "-", "--", *paths,
                      what="git commit failed", input_text=message)
        except GpugateError:
            self._git("reset", "--quiet", "--", *paths, what="git reset (unstage) failed")
            raise
        return self.head()

    def stack_commits(self, limit: int = 200) -> list[StackCommit]:
        """Stack commits, newest first (found by trailer)."""
        commits = []
        for sha, action, reverts, subject in self._log(limit, f"%(trailers:key={TRAILER},valueonly,separator=%x2c)",
                                                      f"%(trailers:key={REVERTS_TRAILER},valueonly,separator=%x2c)",
                                                      "%s"):
            if action.strip():
                commits.append(StackCommit(sha=sha, action=action.strip(), subject=subject,
                                           reverts=reverts.strip()))
        return commits

    def revert(self, sha: str, message: str) -> str:
        """``git revert`` ``sha`` as one new commit with ``message``; abort and raise on conflict."""
        try:
            self._git("revert", "--no-commit", sha, what=f"git revert {sha[:12]} failed (conflict?)")
        except GpugateError:
            subprocess.run(["git", "revert", "--abort"], cwd=self.path, capture_output=True, check=False)
            raise
        try:
            self._git("commit", "--quiet", "--no-verify", "-F", "-", what="git commit failed", input_text=message)
        except GpugateError:
            subprocess.run(["git", "revert", "--abort"], cwd=self.path, capture_output=True, check=False)
            raise
        return self.head()

    @classmethod
    def clone(cls, url: str, path: Path, *, branch: str, config: tuple[str, ...] = ()) -> Repo:
        """A fresh clone of ``branch`` at ``path`` (``config``: ``-c key=value`` pairs kept in the clone)."""
        args = ["git", "clone", "--quiet", "--branch", branch, "--single-branch"]
        for item in config:
            args += ["--config", item]
        try:
            proc = subprocess.run([*args, url, str(path)], capture_output=True, text=True,
                                  timeout=GIT_TIMEOUT_SECONDS * 5, check=False)
        except subprocess.TimeoutExpired as err:
            raise GpugateError(f"git clone {url} did not finish") from err
        if proc.returncode != 0:
            raise GpugateError(f"git clone {url} (branch {branch}) failed: {proc.stderr.strip()}")
        return cls(path)

    def sync_to_remote(self, remote: str, branch: str) -> str:
        """Fetch ``branch`` and reset the working tree to it (the clone holds no work of its own); the new head."""
        self._git("fetch", "--quiet", remote, branch, what=f"git fetch {remote} {branch} failed")
        self._git("reset", "--quiet", "--hard", "FETCH_HEAD", what="git reset failed")
        return self.head()

    def push(self, remote: str, branch: str) -> None:
        """Push HEAD to ``branch``, never forced; a refusal because the branch moved is ``PushRefused``."""
        proc = subprocess.run(["git", "push", "--porcelain", remote, f"HEAD:refs/heads/{branch}"], cwd=self.path,
                              capture_output=True, text=True, timeout=GIT_TIMEOUT_SECONDS, check=False)
        if proc.returncode == 0:
            return
        said = (proc.stdout + proc.stderr).strip()
        if "[rejected]" in said or "non-fast-forward" in said or "fetch first" in said or "[remote rejected]" in said:
            raise PushRefused(f"git push to {remote} {branch} was refused: {said}")
        raise GpugateError(f"git push to {remote} {branch} failed: {said}")

    def trailer_commits(self, key: str, *, limit: int = 500) -> list[tuple[str, float, list[str]]]:
        """(sha, commit time, every value of trailer ``key``) of the newest ``limit`` commits carrying it."""
        found = []
        for sha, when, values in self._log(limit, "%ct", f"%(trailers:key={key},valueonly,unfold,separator=%x1d)"):
            listed = [v.strip() for v in values.split("\x1d") if v.strip()]
            if listed:
                found.append((sha, float(when), listed))
        return found

    def changes_of(self, path: str, *, limit: int = 200) -> list[tuple[str, float]]:
        """(sha, commit time) of the newest ``limit`` commits that changed ``path``, newest first."""
        out = self._git("log", f"-n{limit}", "--format=%H %ct", "--", path)
        return [(sha, float(when)) for sha, when in (line.split() for line in out.splitlines() if line.strip())]

    def subject(self, rev: str) -> str:
        return self._git("show", "-s", "--format=%s", rev, what=f"no commit {rev}").strip()

    def show_file(self, rev: str, path: str) -> str | None:
        """The content of ``path`` at ``rev``, or None when it does not exist there."""
        proc = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=self.path, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_SECONDS, check=False)
        return proc.stdout if proc.returncode == 0 else None
