"""Preflight rules on the CRDs the cluster serves against those the target chart release ships. Pure.

Helm never upgrades a CRD, and the API server prunes fields its CRD does not declare without an
error: a ClusterPolicy written against a stale CRD loses its new settings and the operator still
reports ready (edgelesssys/contrast#2599, NVIDIA/gpu-operator#431, gpu-operator#435). A served CRD can also still
require a field the new chart stopped rendering (gpu-operator#139, #2163), and a release can add kinds its
operator watches from the first second (gpu-operator#602; v26.7.0 adds ``gpuclusters``, ``computedomains`` and
``computedomaincliques``, wiremind/wiremind-helm-charts#914). Two Argo CD Applications that both
ship one CRD rewrite it back and forth (NVIDIA/aicr#2439, #2546).

The Application here renders the chart with ``--include-crds`` and syncs it server-side, CRDs
first: the chart's CRDs land before the CRs in the same sync, and staleness matters only where the
CRDs come from elsewhere (``helm.skipCrds``, a separate CRD Application, an operator bundle).

* ``crds-served``: with the chart's CRDs not applied by this Application, every CRD of the target
  release is served, declares every field the release's declares, and requires nothing it does not;
* ``crd-owner``: no CRD of the target release is tracked by another Argo CD Application.

The target release's CRDs are data (``webhook/stack/data/chart-crds``, generated from NVIDIA's chart
packages by ``python -m tools.chartcrds_gen``), compared as sets of schema paths.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.stack.change import Change, needs_cluster
from webhook.stack.clusterstate import ClusterSnapshot, KubeObject, annotations_of, labels_of, name_of, spec_of
from webhook.stack.compat import Check

TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
TRACKING_LABEL = "app.kubernetes.io/instance"
SHOWN = 6


@dataclass(frozen=True)
class VersionShape:
    """One version of a CRD's schema: every property path, and the paths it requires."""

    paths: frozenset[str]
    required: frozenset[str]


@dataclass(frozen=True)
class CRDShape:
    name: str
    versions: Mapping[str, VersionShape]


def _walk(node: Any, prefix: str, paths: set[str], required: set[str]) -> None:
    if not isinstance(node, Mapping):
        return
    for key in node.get("required") or []:
        required.add(f"{prefix}.{key}" if prefix else str(key))
    for key, child in (node.get("properties") or {}).items():
        path = f"{prefix}.{key}" if prefix else str(key)
        paths.add(path)
        _walk(child, path, paths, required)
    if isinstance(node.get("items"), Mapping):
        _walk(node["items"], prefix + "[]", paths, required)
    if isinstance(node.get("additionalProperties"), Mapping):
        _walk(node["additionalProperties"], prefix + ".*", paths, required)


def crd_shape(crd: KubeObject) -> CRDShape:
    """The served versions of a CRD object as path sets (status and metadata included as declared)."""
    versions = {}
    for version in spec_of(crd).get("versions") or []:
        if version.get("served") is False:
            continue
        paths: set[str] = set()
        required: set[str] = set()
        _walk(((version.get("schema") or {}).get("openAPIV3Schema")) or {}, "", paths, required)
        versions[str(version.get("name"))] = VersionShape(frozenset(paths), frozenset(required))
    return CRDShape(name=name_of(crd), versions=versions)


def tracked_by(crd: KubeObject) -> str | None:
    """The Argo CD Application that tracks ``crd`` (annotation tracking, else the instance label)."""
    tracking = annotations_of(crd).get(TRACKING_ANNOTATION)
    if tracking:
        return str(tracking).split(":", 1)[0]
    return labels_of(crd).get(TRACKING_LABEL)


def _listed(paths: Iterable[str]) -> str:
    ordered = sorted(paths)
    more = f" and {len(ordered) - SHOWN} more" if len(ordered) > SHOWN else ""
    return ", ".join(ordered[:SHOWN]) + more


def staleness(target: CRDShape, served: KubeObject | None) -> list[str]:
    """What a served CRD lacks or requires beyond ``target`` (empty: it serves the target's schema)."""
    if served is None:
        return [f"{target.name} is not served"]
    have = crd_shape(served)
    problems = []
    for version, shape in target.versions.items():
        mine = have.versions.get(version)
        if mine is None:
            problems.append(f"{target.name} does not serve {version}")
            continue
        missing = shape.paths - mine.paths
        if missing:
            problems.append(f"{target.name} {version} lacks {len(missing)} field(s) the API server would prune: "
                            f"{_listed(missing)}")
        extra = mine.required - shape.required
        if extra:
            problems.append(f"{target.name} {version} still requires {_listed(extra)}, which the new release "
                            f"no longer requires (its chart may not render them)")
    return problems


def _target(change: Change) -> Mapping[str, CRDShape] | None:
    return (change.context.chart_crds or {}).get(str(change.final.operator_version))


@needs_cluster
def check_crds_served(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "crds-served"
    release = change.final.operator_version
    if state.crds is None:
        return []
    target = _target(change)
    if target is None:
        return [Check(name=name, ok=True, skipped=True, reason=f"no CRD list for {release} (tools.chartcrds_gen)")]
    problems = [p for crd in sorted(target) for p in staleness(target[crd], state.crd(crd))]
    if change.context.chart_crds_applied:
        brings = f"; it brings: {'; '.join(problems)}" if problems else ""
        return [Check(name=name, ok=True,
                      reason=f"Argo CD applies the {release} chart's {len(target)} CRDs before its objects in the "
                             f"same sync (helm.skipCrds off){brings}")]
    if not problems:
        return [Check(name=name, ok=True, reason=f"{state.source} serves the {len(target)} CRDs of {release} as "
                                                  f"the release declares them")]
    how = ("the gpu-operator Application skips the chart's CRDs (helm.skipCrds)"
           if change.context.chart_crds_applied is False else "the gpu-operator Application was not read")
    return [Check(name=name, ok=False, source="edgelesssys/contrast#2599, NVIDIA/gpu-operator#602, gpu-operator#139, "
                                              "#2163, wiremind/wiremind-helm-charts#914",
                  reason=f"{how}, and {state.source} does not serve {release}'s CRDs: " + "; ".join(problems),
                  fix=f"apply the {release} chart's crds/ first (the Application or tool that owns them), wait for "
                      f"them to be Established, then plan this change again; or let this Application apply them "
                      f"(drop helm.skipCrds)")]


@needs_cluster
def check_crd_owner(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "crd-owner"
    if state.crds is None:
        return []
    target = _target(change) or {}
    ours = change.context.application
    others = {crd: app for crd in sorted(target) if (served := state.crd(crd)) is not None
              and (app := tracked_by(served)) and app != ours}
    if not others:
        return [Check(name=name, ok=True, reason=f"no CRD of {change.final.operator_version} is tracked by an "
                                                  f"Application other than {ours}")]
    listed = "; ".join(f"{crd} by {app}" for crd, app in others.items())
    return [Check(name=name, ok=False, source="NVIDIA/aicr#2439, #2546",
                  reason=f"CRDs the {change.final.operator_version} chart ships are tracked by another Argo CD "
                         f"Application ({listed}): with self-heal on both, each rewrites the other's schema",
                  fix="let one Application own each CRD: turn it off in the other chart (its CRD toggle) or "
                      "exclude it from one of them; then plan again")]
