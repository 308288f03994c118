"""Every state the GPU Operator can be in lets the Argo CD syncs finish.

``tests/gitops/argosync.py`` replays gitops-engine's wave rule. Over it run:

- the gpu-operator Application: the real chart at the pinned version rendered with our values
  (helm, as Argo CD's repo server runs it) plus drivers/, with the ClusterPolicy and NVIDIADriver
  health taken from our Lua checks for every status fixture (every status the controllers write);
- the root Application: argocd/apps as kustomize renders it, with each child's health from our
  Application check for every health a child can report.

The former layout (NVIDIADrivers in wave 1 behind the chart; gpu-operator in the root's
first wave) is replayed too, to show the rule really deadlocks it: a notReady ClusterPolicy (any
first install with GPU nodes, any driver rollout) kept the drivers, and the webhook, balancer and
scheduler, from ever being applied; and a pause or a revert would queue behind that operation.
"""

from __future__ import annotations

import copy
import itertools
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests.gitops.argosync import Obj, label, simulate
from tests.gitops.gitopsdata import ARGOCD, REPO, SHARED, kustomize
from tests.gitops.luasandbox import run_health
from tests.gitops.test_health import installed
from tests.helmtool import helm_binary
from tests.prerequisites import needed
from webhook.stack import chartrender, manifests

HEALTH = ARGOCD / "health"
CHARTS = SHARED / "upstream" / "charts"
CHILD_HEALTHS = ("Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown")


def helm_or_skip() -> Path:
    helm = helm_binary()
    needed(CHARTS, "NVIDIA's chart packages are needed to render the chart")
    return helm


@cache
def _chart_objects() -> tuple[Obj, ...]:
    stack = manifests.load_stack(REPO)
    source = chartrender.ChartSource(repo_url=f"file://{CHARTS}", chart=stack.chart,
                                     version=str(stack.operator_version))
    values = (REPO / manifests.VALUES_FILE).read_bytes()
    return tuple(chartrender.render(helm_or_skip(), source, values=values,
                                    kube_version=f"1.{stack.kubernetes_minor}"))


def operator_app_objects() -> list[Obj]:
    """What the gpu-operator Application syncs: the chart's objects, then drivers/."""
    helm_or_skip()
    return copy.deepcopy(list(_chart_objects())) + kustomize(REPO / manifests.DRIVERS_DIR)


def _statuses(kind: str) -> list[tuple[str, dict | None]]:
    return [(p.stem, yaml.safe_load(p.read_text()).get("status"))
            for p in sorted((HEALTH / "nvidia.com" / kind / "testdata").glob("*.yaml"))]


def _lua(group_kind: str, obj: Obj) -> str | None:
    """The status the shipped argocd-cm script for ``group_kind`` gives ``obj``."""
    script, open_libs = installed(*group_kind.split("/"))
    result = run_health(script, obj, open_libs=open_libs)
    return result.get("status")


def operator_health(cluster_policy: dict | None, driver: dict | None):
    """The health Argo CD reads in one operator state; built-in kinds are assumed Healthy (they do not
    wait on the GPU drivers: the operator and NFD run on any node)."""
    def health(obj: Obj, applied: frozenset[str]) -> str | None:
        kind = obj["kind"]
        if kind in ("ClusterPolicy", "NVIDIADriver"):
            live = copy.deepcopy(obj)
            status = cluster_policy if kind == "ClusterPolicy" else driver
            if status is not None:
                live["status"] = status
            return _lua(f"nvidia.com/{kind}", live)
        if kind in ("Deployment", "DaemonSet", "StatefulSet"):
            return "Healthy"
        return None
    return health


CP_STATES = _statuses("ClusterPolicy")
ND_STATES = _statuses("NVIDIADriver")
STATES = list(itertools.product(CP_STATES, ND_STATES))


@pytest.mark.parametrize(("cp", "nd"), STATES, ids=[f"cp-{c[0]}+nd-{n[0]}" for c, n in STATES])
def test_the_gpu_operator_sync_finishes_in_every_operator_state(cp, nd):
    """Whatever the ClusterPolicy and NVIDIADrivers report (rollout, reconcile failure, no GPU
    nodes), the operation ends with every object applied: the drivers, a pause (autoUpgrade
    false on a pool) and a revert all reach the cluster during a rollout."""
    objects = operator_app_objects()
    outcome = simulate(objects, operator_health(cp[1], nd[1]))
    assert outcome.phase == "Succeeded", outcome
    wanted = {label(o) for o in objects if not _is_hook(o)}
    assert wanted <= set(outcome.applied)
    assert {label(o) for o in objects if o["kind"] == "NVIDIADriver"} <= set(outcome.applied)


def _is_hook(obj: Obj) -> bool:
    annotations = obj.get("metadata", {}).get("annotations") or {}
    return "helm.sh/hook" in annotations or "argocd.argoproj.io/hook" in annotations


def test_the_former_layout_deadlocks_on_a_first_install_with_gpu_nodes():
    """NVIDIADrivers in wave 1: the toolkit waits on driver validation, the ClusterPolicy stays notReady
    (Progressing), and the wave that would bring the drivers never starts."""
    objects = operator_app_objects()
    for obj in objects:
        if obj["kind"] == "NVIDIADriver":
            obj["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] = "1"
    rollout = dict(CP_STATES)["progressing_operandNotReady"]
    outcome = simulate(objects, operator_health(rollout, None))
    assert outcome.phase == "Running" and "ClusterPolicy/cluster-policy" in outcome.waiting_on
    assert not any(a.startswith("NVIDIADriver/") for a in outcome.applied)
    failed = simulate(objects, operator_health(dict(CP_STATES)["degraded_reconcileFailed"], None))
    assert failed.phase == "Failed" and not any(a.startswith("NVIDIADriver/") for a in failed.applied)


# --- the root Application -------------------------------------------------------------------

def _child_status(app: Obj, health: str) -> dict:
    spec = app["spec"]
    compared = {"destination": spec["destination"]}
    for key in ("source", "sources", "ignoreDifferences"):
        if key in spec:
            compared[key] = copy.deepcopy(spec[key])
    return {"health": {"status": health}, "sync": {"status": "Synced", "comparedTo": compared}}


def root_health(states: dict[str, str]):
    def health(obj: Obj, applied: frozenset[str]) -> str | None:
        if obj["kind"] != "Application":
            return None  # AppProject: no health assessment
        live = copy.deepcopy(obj)
        live["status"] = _child_status(obj, states.get(obj["metadata"]["name"], "Healthy"))
        return _lua("argoproj.io/Application", live)
    return health


LAST_WAVE = ("gpu-operator", "gpugate-observability")
ROOT_STATES = list(itertools.product(CHILD_HEALTHS, CHILD_HEALTHS))


@pytest.mark.parametrize(("operator", "observability"), ROOT_STATES,
                         ids=[f"operator-{a}+observability-{b}" for a, b in ROOT_STATES])
def test_the_root_sync_finishes_whatever_the_gpu_operator_app_reports(operator, observability):
    """The webhook, balancer and scheduler are applied and the root's operation ends whether the
    gpu-operator Application is rolling out (Progressing for hours), Degraded or Missing: so a
    first install gets the webhook, and a revert of an operator upgrade is synced at once."""
    objects = kustomize(ARGOCD / "apps")
    outcome = simulate(objects, root_health({"gpu-operator": operator, "gpugate-observability": observability}))
    assert outcome.phase == "Succeeded", outcome
    assert {label(o) for o in objects} <= set(outcome.applied)


def test_only_the_gpu_operator_and_observability_apps_are_in_the_last_wave():
    waves = {o["metadata"]["name"]: int(o["metadata"].get("annotations", {}).get("argocd.argoproj.io/sync-wave", 0))
             for o in kustomize(ARGOCD / "apps")}
    last = max(waves.values())
    assert sorted(n for n, w in waves.items() if w == last) == sorted(LAST_WAVE)


def test_the_former_root_order_never_reaches_the_webhook_during_a_rollout():
    objects = kustomize(ARGOCD / "apps")
    for obj in objects:
        if obj["metadata"]["name"] == "gpu-operator":
            obj["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] = "0"
    outcome = simulate(objects, root_health({"gpu-operator": "Progressing"}))
    assert outcome.phase == "Running" and outcome.waiting_on == ["Application/gpu-operator"]
    assert "Application/gpugate-webhook" not in outcome.applied


def test_the_simulator_waits_for_health_between_waves_and_not_after_the_last():
    """The rule itself, on three ConfigMap-like objects: wave 0 Progressing blocks wave 1; a
    Progressing last wave does not block the end; Degraded before the last wave fails."""
    def obj(name: str, wave: int) -> Obj:
        return {"kind": "X", "metadata": {"name": name, "annotations": {"argocd.argoproj.io/sync-wave": str(wave)}}}

    objects = [obj("a", 0), obj("b", 1)]
    assert simulate(objects, lambda o, _: "Progressing" if o["metadata"]["name"] == "a" else None).phase == "Running"
    assert simulate(objects, lambda o, _: "Progressing" if o["metadata"]["name"] == "b" else None).phase == "Succeeded"
    assert simulate(objects, lambda o, _: "Degraded" if o["metadata"]["name"] == "a" else None).phase == "Failed"
    assert simulate(objects, lambda o, _: None).applied == ["X/a", "X/b"]
