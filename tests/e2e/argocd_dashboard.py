"""What Argo CD's web UI would show, read from the API it reads, written as Markdown.

The UI cannot be served here: Argo CD's Go module ships ``ui/dist/app`` empty (a ``gitkeep``;
the release images build it with yarn), and ``ui/package.json`` depends on ``argo-ui`` as a Git
dependency (``git+https://github.com/argoproj/argo-ui.git``, pinned in ``ui/yarn.lock``), which
no package registry serves and github.com is not reachable from these machines. So no browser
and no screenshots: instead each :meth:`Dashboard.snapshot` asks ``argocd-server`` (the same
REST API the UI calls: ``GET /api/v1/applications`` for the tiles, ``GET
/api/v1/applications/{name}/resource-tree`` for the application details tree, health of every
node included, operator-created children too) and renders the application list and each app's
tree the way the UI lays them out, one Markdown file per step, plus the raw JSON.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.argocd_harness import ArgoCD, module_dir

Obj = dict[str, Any]


def ui_unavailable_reason() -> str | None:
    """Why the UI cannot be built or served from the pinned module, or None if it could be."""
    root = module_dir() / "ui"
    built = [p for p in (root / "dist" / "app").glob("*") if p.name != "gitkeep"]
    if built:
        return None
    package = json.loads((root / "package.json").read_text())
    dependency = (package.get("dependencies") or {}).get("argo-ui", "")
    lock = (root / "yarn.lock").read_text() if (root / "yarn.lock").exists() else ""
    pinned = re.search(r'resolved "(git\+https://github\.com/argoproj/argo-ui\.git#[0-9a-f]+)"', lock)
    return (f"the module's ui/dist/app holds no build (only gitkeep), and building it needs argo-ui from "
            f"{pinned.group(1) if pinned else dependency} (ui/package.json: {dependency!r}), a Git dependency "
            "that no package registry serves; github.com is unreachable from these machines")


@dataclass
class Snapshot:
    label: str
    at: float
    markdown: str
    apps: dict[str, Obj]
    trees: dict[str, Obj]


@dataclass
class Dashboard:
    """Snapshots of the application list and trees, written under ``directory``."""

    argocd: ArgoCD
    directory: Path
    started: float = field(default_factory=time.monotonic)
    snapshots: list[Snapshot] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self, label: str) -> Snapshot:
        with self._lock:
            return self._snapshot(label)

    def _snapshot(self, label: str) -> Snapshot:
        apps = {a["metadata"]["name"]: a for a in self.argocd.api_json("/api/v1/applications").get("items") or []}
        trees = {name: self.argocd.api_json(f"/api/v1/applications/{name}/resource-tree") for name in sorted(apps)}
        at = time.monotonic()
        shot = Snapshot(label, at, render(label, at - self.started, apps, trees), apps, trees)
        self.snapshots.append(shot)
        self.directory.mkdir(parents=True, exist_ok=True)
        stem = f"{len(self.snapshots):02d}-{re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-')}"
        (self.directory / f"{stem}.md").write_text(shot.markdown)
        (self.directory / f"{stem}.json").write_text(json.dumps({"applications": apps, "trees": trees}, indent=1))
        return shot

    def index(self) -> Path:
        """One page with every snapshot, in order."""
        path = self.directory / "README.md"
        path.write_text("# Argo CD, as the dashboard would have shown it\n\n"
                        + "\n\n".join(s.markdown for s in self.snapshots))
        return path


def render(label: str, elapsed: float, apps: dict[str, Obj], trees: dict[str, Obj]) -> str:
    lines = [f"## {label} (t+{elapsed:.0f}s)", "", "| application | sync | health | last operation | revision |",
             "|---|---|---|---|---|"]
    for name, app in sorted(apps.items()):
        status = app.get("status") or {}
        operation = status.get("operationState") or {}
        sync = status.get("sync") or {}
        revisions = sync.get("revisions") or [sync.get("revision") or ""]
        lines.append(f"| {name} | {sync.get('status', '')} | {(status.get('health') or {}).get('status', '')} | "
                     f"{operation.get('phase', '')}: {_cell(operation.get('message', ''))} | "
                     f"{', '.join(r[:8] if len(r) == 40 else r for r in revisions if r)} |")
    for name, app in sorted(apps.items()):
        lines += ["", f"### {name}", ""]
        lines += tree_lines(trees.get(name) or {}, app)
    return "\n".join(lines) + "\n"


def tree_lines(tree: Obj, app: Obj) -> list[str]:
    """The resource tree: managed resources at the top (with their sync status), children under
    their owners (parentRefs), each with its health as the UI's node badge shows it."""
    nodes: Sequence[Obj] = tree.get("nodes") or []
    sync = {(r.get("group", ""), r.get("kind"), r.get("namespace", ""), r.get("name")): r.get("status")
            for r in (app.get("status") or {}).get("resources") or []}
    by_uid = {n.get("uid"): n for n in nodes if n.get("uid")}
    children: dict[str, list[Obj]] = {}
    roots = []
    for node in nodes:
        parents = [p.get("uid") for p in node.get("parentRefs") or [] if p.get("uid") in by_uid]
        if parents:
            children.setdefault(parents[0], []).append(node)
        else:
            roots.append(node)

    def key(node: Obj) -> tuple[str, str, str]:
        return (node.get("kind", ""), node.get("namespace", ""), node.get("name", ""))

    out: list[str] = []

    def walk(node: Obj, depth: int) -> None:
        health = node.get("health") or {}
        ref = (node.get("group", ""), node.get("kind"), node.get("namespace", ""), node.get("name"))
        badge = " / ".join(x for x in (sync.get(ref), health.get("status")) if x) or "-"
        where = f"{node.get('namespace')}/" if node.get("namespace") else ""
        message = f": {_cell(health['message'])}" if health.get("message") else ""
        out.append(f"{'  ' * depth}- {node.get('kind')} {where}{node.get('name')} [{badge}]{message}")
        for child in sorted(children.get(node.get("uid", ""), []), key=key):
            walk(child, depth + 1)

    for root in sorted(roots, key=key):
        walk(root, 0)
    return out or ["- (no resources)"]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")[:240]
