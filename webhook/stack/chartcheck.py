"""Check the objects the real gpu-operator chart renders against what stack.yaml means. Pure.

``webhook.stack.chartrender`` runs ``helm template``; this module only reads its output (plus the
NVIDIADrivers of ``drivers/``) and returns ``Check`` values:

- ``chart-clusterpolicy``: one ClusterPolicy, and it carries stack.yaml's driver management, the
  default pool's driver and upgrade policy, and every pinned component version;
- ``chart-nvidiadriver``: the chart renders no NVIDIADriver that collides with ours (or, with the
  ClusterPolicy managing the driver, none at all), and ships the NVIDIADriver CRD ours need;
- ``chart-delete-hooks``: deleting the Application runs no hook that would strip the GPU nodes;
- ``chart-sync-order``: Argo CD applies every object in one step, so no wave waits on the health
  of objects whose readiness depends on a later wave (docs/gitops.md, "Sync waves").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.stack.compat import Check
from webhook.stack.model import COMPONENT_VALUES_PATHS, Stack

KubeObject = Mapping[str, Any]

HOOK_ANNOTATION = "argocd.argoproj.io/hook"
HELM_HOOK_ANNOTATION = "helm.sh/hook"
WAVE_ANNOTATION = "argocd.argoproj.io/sync-wave"
HELM_WEIGHT_ANNOTATION = "helm.sh/hook-weight"

# gitops-engine pkg/sync/hook/helm/type.go: the Helm hooks Argo CD runs during a sync, and when.
HELM_SYNC_HOOKS = {"pre-install": "PreSync", "pre-upgrade": "PreSync", "post-install": "PostSync",
                   "post-upgrade": "PostSync"}
ARGO_SYNC_HOOKS = ("PreSync", "Sync", "PostSync", "SyncFail")
# Deletion hooks: PostDelete (and helm post-delete) since Argo CD 2.10, PreDelete (and helm
# pre-delete) since 3.5. Both run on any deletion of the Application, cascading or not.
DELETE_HOOKS = {"post-delete": "PostDelete", "pre-delete": "PreDelete", "PostDelete": "PostDelete",
                "PreDelete": "PreDelete"}
# The one deletion hook we accept, and why: it deletes the chart's own GPUCluster CR, which our
# values never render (gpuCluster.deployCR false), so on deletion it finds nothing to do.
ALLOWED_PRE_DELETE = {"gpu-operator-cleanup-gpucluster": "nvidia.com/GPUCluster"}


def _annotations(obj: KubeObject) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _name(obj: KubeObject) -> str:
    return str((obj.get("metadata") or {}).get("name") or "?")


def _label(obj: KubeObject) -> str:
    return f"{obj.get('kind')}/{_name(obj)}"


def hook_types(obj: KubeObject) -> tuple[str, ...]:
    """Argo CD's hook types of ``obj``; Helm's count only when no Argo CD hook is set (gitops-engine hook.Types)."""
    annotations = _annotations(obj)
    argo = [t.strip() for t in str(annotations.get(HOOK_ANNOTATION, "")).split(",") if t.strip()]
    if argo:
        return tuple(argo)
    helm = [t.strip() for t in str(annotations.get(HELM_HOOK_ANNOTATION, "")).split(",") if t.strip()]
    return tuple(t for t in helm if t != "crd-install")


def is_hook(obj: KubeObject) -> bool:
    return bool(hook_types(obj)) and hook_types(obj) != ("Skip",)


def sync_phases(obj: KubeObject) -> tuple[str, ...]:
    """The sync phases ``obj`` runs in: Sync for a resource; a hook's own (none for deletion hooks)."""
    if not is_hook(obj):
        return ("Sync",)
    phases = {HELM_SYNC_HOOKS.get(t, t) for t in hook_types(obj)}
    return tuple(sorted(p for p in phases if p in ARGO_SYNC_HOOKS))


def wave(obj: KubeObject) -> int:
    """gitops-engine syncwaves.Wave: the sync-wave annotation, else Helm's hook-weight, else 0."""
    annotations = _annotations(obj)
    for key in (WAVE_ANNOTATION, HELM_WEIGHT_ANNOTATION):
        try:
            return int(str(annotations[key]))
        except (KeyError, ValueError):
            continue
    return 0


def check_sync_order(objects: Iterable[KubeObject]) -> Check:
    """Every resource in one wave and no hook after it: Argo CD then applies all and never waits."""
    resources = [o for o in objects if not is_hook(o)]
    waves = sorted({wave(o) for o in resources})
    late_hooks = [_label(o) for o in objects if is_hook(o)
                  and any(p in ("Sync", "PostSync") for p in sync_phases(o))]
    if len(waves) > 1:
        spread = "; ".join(f"wave {w}: " + ", ".join(_label(o) for o in resources if wave(o) == w)[:200]
                           for w in waves)
        return Check(name="chart-sync-order", ok=False,
                     reason=f"the gpu-operator Application would sync in {len(waves)} waves ({spread}); "
                            f"Argo CD waits for each wave but the last to be Healthy, and the ClusterPolicy "
                            f"stays notReady until the drivers of a later wave run: put every object in one wave")
    if late_hooks:
        return Check(name="chart-sync-order", ok=False,
                     reason=f"Sync/PostSync hooks {', '.join(late_hooks)} make Argo CD wait for every resource "
                            f"to be Healthy first, which a driver rollout is not for hours")
    return Check(name="chart-sync-order", ok=True,
                 reason=f"{len(resources)} object(s) in one wave ({waves[0] if waves else 0}), no hook after them: "
                        f"the sync finishes whatever state the operator is in")


def check_delete_hooks(objects: Iterable[KubeObject]) -> Check:
    """Deleting the Application (cascade or not) must not run a hook that strips or empties GPU nodes."""
    objects = list(objects)
    rendered_kinds = {f"{str(o.get('apiVersion', '')).rpartition('/')[0]}/{o.get('kind')}" for o in objects}
    problems = []
    accepted = []
    for obj in objects:
        kinds = {DELETE_HOOKS[t] for t in hook_types(obj) if t in DELETE_HOOKS}
        if not kinds:
            continue
        guarded = ALLOWED_PRE_DELETE.get(_name(obj))
        if kinds == {"PreDelete"} and guarded is not None and guarded not in rendered_kinds:
            accepted.append(_label(obj))
            continue
        problems.append(f"{_label(obj)} ({'/'.join(sorted(kinds))})")
    if problems:
        return Check(name="chart-delete-hooks", ok=False,
                     reason=f"deleting the gpu-operator Application would run {', '.join(problems)}; Argo CD runs "
                            f"deletion hooks even without a cascade. Turn them off in values.yaml (NFD: "
                            f"node-feature-discovery.postDeleteCleanup: false; operator.cleanupCRD: false)")
    note = f" (accepted: {', '.join(accepted)}, nothing for it to delete)" if accepted else ""
    return Check(name="chart-delete-hooks", ok=True,
                 reason=f"no deletion hook strips the GPU nodes{note}")


def _dig(tree: Any, path: Iterable[str]) -> Any:
    for key in path:
        if not isinstance(tree, Mapping):
            return None
        tree = tree.get(key)
    return tree


def _normalised(policy: Any) -> Any:
    """Drop what the chart leaves out when empty (podSelector: ""), so equal policies compare equal."""
    if isinstance(policy, Mapping):
        return {k: _normalised(v) for k, v in policy.items() if v not in ("", None, {})}
    return policy


def check_cluster_policy(objects: Iterable[KubeObject], stack: Stack) -> Check:
    """The rendered ClusterPolicy means what stack.yaml says."""
    policies = [o for o in objects if o.get("kind") == "ClusterPolicy"]
    if len(policies) != 1:
        return Check(name="chart-clusterpolicy", ok=False,
                     reason=f"the chart renders {len(policies)} ClusterPolicies; exactly one is reconciled "
                            f"(a second never gets a status), so render one (clusterPolicy.deployCR)")
    spec = policies[0].get("spec") or {}
    driver = spec.get("driver") or {}
    pool = stack.default_pool
    problems: list[str] = []
    if driver.get("enabled") is not True:
        problems.append(f"driver.enabled is {driver.get('enabled')!r}, not true")
    crd = bool(driver.get("useNvidiaDriverCRD"))
    if crd != (stack.management == "nvidiadriver"):
        problems.append(f"driver.useNvidiaDriverCRD is {crd}, but stack.yaml manages the driver by "
                        f"{stack.management}")
    if stack.management == "clusterpolicy":
        for key, want in (("version", pool.driver), ("repository", stack.driver_repository),
                          ("image", stack.driver_image)):
            if driver.get(key) != want:
                problems.append(f"driver.{key} is {driver.get(key)!r}, stack.yaml says {want!r}")
        if bool(driver.get("usePrecompiled")) != pool.use_precompiled:
            problems.append(f"driver.usePrecompiled is {bool(driver.get('usePrecompiled'))}, pool {pool.name} "
                            f"says {pool.use_precompiled}")
    if pool.upgrade_policy:
        rendered = _normalised(driver.get("upgradePolicy") or {})
        wanted = _normalised(dict(pool.upgrade_policy))
        differing = sorted(k for k in wanted if rendered.get(k) != wanted[k])
        if differing:
            problems.append("driver.upgradePolicy differs from pool " + pool.name + "'s in "
                            + ", ".join(f"{k} ({rendered.get(k)!r} != {wanted[k]!r})" for k in differing))
    for component, version in sorted(stack.components.items()):
        got = _dig(spec, COMPONENT_VALUES_PATHS[component])
        if got != version:
            problems.append(f"{'.'.join(COMPONENT_VALUES_PATHS[component])} is {got!r}, stack.yaml pins {version!r}")
    if problems:
        return Check(name="chart-clusterpolicy", ok=False,
                     reason="the rendered ClusterPolicy does not say what stack.yaml means: " + "; ".join(problems))
    what = ("NVIDIADriver per pool" if stack.management == "nvidiadriver"
            else f"driver {pool.driver} from the ClusterPolicy")
    return Check(name="chart-clusterpolicy", ok=True,
                 reason=f"ClusterPolicy {_name(policies[0])}: {what}, pool {pool.name}'s upgrade policy"
                        + (f", {len(stack.components)} pinned component(s)" if stack.components else ""))


def check_nvidia_drivers(objects: Iterable[KubeObject], stack: Stack, ours: Iterable[KubeObject]) -> Check:
    """No chart NVIDIADriver next to ours (a second default is ReconcileFailed), and the CRD they need."""
    objects = list(objects)
    charts = [o for o in objects if o.get("kind") == "NVIDIADriver"]
    if stack.management == "clusterpolicy":
        if charts:
            return Check(name="chart-nvidiadriver", ok=False,
                         reason=f"the chart renders {', '.join(_label(o) for o in charts)} while the ClusterPolicy "
                                f"manages the driver: set driver.nvidiaDriverCRD.deployDefaultCR: false")
        return Check(name="chart-nvidiadriver", ok=True, reason="no NVIDIADriver: the ClusterPolicy manages the driver")
    ours = list(ours)
    names = {_name(o) for o in ours}
    clashes = sorted({_name(o) for o in charts} & names)
    defaults = [_label(o) for o in charts + ours if (o.get("spec") or {}).get("default") is True]
    crd = any(o.get("kind") == "CustomResourceDefinition" and _name(o) == "nvidiadrivers.nvidia.com" for o in objects)
    if clashes or len(defaults) > 1:
        return Check(name="chart-nvidiadriver", ok=False,
                     reason=f"the chart's NVIDIADriver(s) {', '.join(_label(o) for o in charts)} collide with "
                            f"drivers/ (same name: {', '.join(clashes) or 'none'}; default CRs: "
                            f"{', '.join(defaults)}); keep driver.nvidiaDriverCRD.deployDefaultCR: false")
    if not crd:
        return Check(name="chart-nvidiadriver", ok=False,
                     reason="the chart renders no nvidiadrivers.nvidia.com CRD, which drivers/ needs")
    return Check(name="chart-nvidiadriver", ok=True,
                 reason=f"the chart ships the NVIDIADriver CRD and no CR of its own; drivers/ has {len(ours)}")


def check_rendered_chart(objects: Iterable[KubeObject], stack: Stack, drivers: Iterable[KubeObject]) -> list[Check]:
    """All chart checks for one render (chart objects) plus ``drivers`` (what drivers/ renders)."""
    objects = list(objects)
    drivers = list(drivers)
    return [check_cluster_policy(objects, stack), check_nvidia_drivers(objects, stack, drivers),
            check_delete_hooks(objects), check_sync_order(objects + drivers)]
