"""A model of one Argo CD sync operation: gitops-engine's wave rule, replayed over objects and a health function.

Transcribed from gitops-engine v0.7.1-0.20251217140045-5baed5604d2d (the module Argo CD v3.2.11
builds with), ``pkg/sync/sync_context.go`` ``(*syncContext).Sync``, which the application
controller calls again and again until the operation ends. One call ("round") does, in order:

1. for every running resource task with a live object, read its health
   (``health.GetResourceHealth`` with the Lua overrides): Healthy or no health at all ->
   Succeeded, Degraded -> Failed, anything else (Progressing, Suspended, Missing, Unknown) stays
   Running;
2. if the operation spans more than one (phase, wave) (``syncTasks.multiStep``) and any task is
   still running: wait (the operation stays Running, "waiting for healthy state of ...");
3. if any completed task did not succeed: the operation Failed;
4. otherwise apply every pending task of the lowest (phase, wave); if no pending task is left
   outside it (and no hook), the operation Succeeded right there, "EVEN if those objects
   subsequently degraded": the last wave is never waited for.

Wave: ``argocd.argoproj.io/sync-wave``, else Helm's ``helm.sh/hook-weight``, else 0
(``pkg/sync/syncwaves/waves.go``). Phases: PreSync < Sync < PostSync; a resource is in Sync; a hook in
its hook types' phases (``pkg/sync/sync_phase.go``, Helm pre-/post-install|upgrade mapped by
``pkg/sync/hook/helm/type.go``; deletion hooks have no sync phase). Hooks are assumed to complete.

The health of an object is a function of the object and of what the sync applied so far, so a
scenario can say "the ClusterPolicy stays notReady until the NVIDIADrivers are applied".
Health is otherwise static: the question answered is whether the operation can end in that
state, not how long the operator takes to leave it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
Health = Callable[[Obj, frozenset[str]], "str | None"]
"""(live object, labels of the objects applied so far) -> Healthy|Progressing|Degraded|... or None."""

PHASE_ORDER = {"PreSync": -1, "Sync": 0, "PostSync": 1, "SyncFail": 2}
HELM_HOOKS = {"pre-install": "PreSync", "pre-upgrade": "PreSync", "post-install": "PostSync",
              "post-upgrade": "PostSync"}
MAX_ROUNDS = 50


def label(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _annotations(obj: Obj) -> dict[str, str]:
    return obj.get("metadata", {}).get("annotations") or {}


def wave(obj: Obj) -> int:
    for key in ("argocd.argoproj.io/sync-wave", "helm.sh/hook-weight"):
        try:
            return int(_annotations(obj)[key])
        except (KeyError, ValueError):
            continue
    return 0


def phases(obj: Obj) -> list[str]:
    argo = [t.strip() for t in _annotations(obj).get("argocd.argoproj.io/hook", "").split(",") if t.strip()]
    helm = [t.strip() for t in _annotations(obj).get("helm.sh/hook", "").split(",") if t.strip()]
    if argo == ["Skip"]:
        return []
    if argo:
        return [t for t in argo if t in PHASE_ORDER]
    if helm and helm != ["crd-install"]:
        return sorted({HELM_HOOKS[t] for t in helm if t in HELM_HOOKS})
    return ["Sync"]


def is_hook(obj: Obj) -> bool:
    return bool(_annotations(obj).get("argocd.argoproj.io/hook")) or \
        _annotations(obj).get("helm.sh/hook", "crd-install") != "crd-install"


@dataclass
class Task:
    obj: Obj
    phase: str
    wave: int
    hook: bool
    state: str = ""  # "" pending, Running, Succeeded, Failed

    @property
    def key(self) -> tuple[int, int]:
        return (PHASE_ORDER[self.phase], self.wave)


@dataclass
class Outcome:
    phase: str
    """Succeeded, Failed, or Running (the operation can never end in this state)."""
    rounds: int
    applied: list[str] = field(default_factory=list)
    waiting_on: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def simulate(objects: Iterable[Obj], health: Health) -> Outcome:
    tasks = [Task(obj=o, phase=p, wave=wave(o), hook=is_hook(o)) for o in objects for p in phases(o)]
    tasks.sort(key=lambda t: t.key)
    applied: list[str] = []
    for round_no in range(1, MAX_ROUNDS + 1):
        before = [t.state for t in tasks]
        done = frozenset(applied)
        for task in tasks:
            if task.state != "Running":
                continue
            status = "Healthy" if task.hook else health(task.obj, done)
            if status in (None, "Healthy"):
                task.state = "Succeeded"
            elif status == "Degraded":
                task.state = "Failed"
        multi_step = bool(tasks) and tasks[0].key != tasks[-1].key
        running = [t for t in tasks if t.state == "Running" and (multi_step or t.hook)]
        if running:
            if [t.state for t in tasks] == before:
                return Outcome("Running", round_no, applied, waiting_on=[label(t.obj) for t in running])
            continue
        failed = [label(t.obj) for t in tasks if t.state == "Failed"]
        if failed:
            return Outcome("Failed", round_no, applied, failed=failed)
        pending = [t for t in tasks if t.state == ""]
        if not pending:
            return Outcome("Succeeded", round_no, applied)
        current = pending[0].key
        for task in pending:
            if task.key == current:
                task.state = "Running"
                applied.append(label(task.obj))
        if not [t for t in pending if t.key != current or t.hook]:
            return Outcome("Succeeded", round_no, applied)
    raise AssertionError(f"no outcome after {MAX_ROUNDS} rounds")
