"""The preflight corpus: real GPU Operator failures (and clean upgrades) as a Git change plus a recorded cluster.

Each folder of ``tests/stack/preflight/`` is one case:

* ``case.yaml``: the title, the public thread or release note it comes from (``source``), what its
  users saw, the Git side (``stack``: how stack.yaml differed from the shipped one before the change;
  ``values``: a JSON merge patch onto the shipped values.yaml; ``application.skipCrds``), the change
  itself (``change.upgrade``: the flags of ``gpugate stack upgrade``; ``change.edit``: a hand edit of
  stack.yaml and values.yaml committed with ``gpugate stack sync``; ``change.promote``), the moment
  the state was read (``observedAt``) and what must come of it (``expect``: ``flagged: <check>``, a
  failure or a warning that names its cause and fix; ``clean: true``; or ``missed: <why>`` for a
  failure nothing in Git or the cluster shows beforehand);
* ``cluster.yaml``: the recorded objects (``include:`` folds in a base recording of ``_base/``; a
  ``chartCRDs: <release>`` document stands for the CRDs of that chart release as served, read from
  NVIDIA's chart package, with the Application tracking them).

``plan`` runs the same pure planner ``gpugate stack plan`` runs, with the same ChangeContext it builds.
"""

from __future__ import annotations

import copy
import tarfile
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.kubefake import merge_patch
from webhook.stack import chartcrds, manifests
from webhook.stack import matrix as matrix_data
from webhook.stack import plan as planning
from webhook.stack.checks import ChangeContext, Waivers
from webhook.stack.clusterstate import ClusterSnapshot
from webhook.stack.compat import Check
from webhook.stack.model import Stack

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "preflight"
CHARTS = ROOT.parent / "shared" / "upstream" / "charts"
TRACKING = "argocd.argoproj.io/tracking-id"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader where PyYAML has it: the recordings hold whole CRDs (the ClusterPolicy's is 150 KB)."""


def _documents(text: str) -> list[Any]:
    return [d for d in yaml.load_all(text, Loader=LOADER) if d is not None]


def merge(base: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (maps merge, ``null`` deletes), on a copy: kubefake's, the one the tests share."""
    return merge_patch(copy.deepcopy(base), patch)


@cache
def chart_crd_objects(release: str) -> tuple[dict[str, Any], ...]:
    """The CRD objects of NVIDIA's chart package at ``release`` (its crds/ folder)."""
    package = CHARTS / f"gpu-operator-{release}.tgz"
    found = []
    with tarfile.open(package) as archive:
        for member in archive.getmembers():
            parts = member.name.split("/")
            if member.isfile() and len(parts) == 3 and parts[1] == "crds":
                handle = archive.extractfile(member)
                assert handle is not None
                found += [d for d in _documents(handle.read().decode("utf-8")) if isinstance(d, dict)]
    return tuple(found)


def _served(recorded: dict[str, Any]) -> list[dict[str, Any]]:
    crds = []
    for crd in chart_crd_objects(str(recorded["chartCRDs"])):
        crd = copy.deepcopy(crd)
        name = crd["metadata"]["name"]
        app = (recorded.get("trackedByName") or {}).get(name, recorded.get("trackedBy"))
        if name in (recorded.get("drop") or []):
            continue
        if app:
            kind = crd["spec"]["names"]["kind"]
            crd["metadata"].setdefault("annotations", {})[TRACKING] = (
                f"{app}:apiextensions.k8s.io/CustomResourceDefinition:/{name}")
            crd.setdefault("status", {})["acceptedNames"] = {"kind": kind}
        crds.append(crd)
    return crds


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name"))


def recorded_objects(path: Path) -> list[dict[str, Any]]:
    """The objects of a cluster.yaml, its includes folded in first (a later object replaces an earlier
    one of the same kind, namespace and name; ``{delete: {kind, namespace, name}}`` removes one)."""
    return list(_recorded(path.resolve()))  # the objects are read, never changed


@cache
def _recorded(path: Path) -> list[dict[str, Any]]:
    documents = _documents(path.read_text())
    objects: dict[tuple[str, str, str], dict[str, Any]] = {}
    for document in documents:
        if "include" in document:
            for included in recorded_objects(path.parent / document["include"]):
                objects[_key(included)] = included
        elif "chartCRDs" in document:
            for crd in _served(document):
                objects[_key(crd)] = crd
        elif "delete" in document:
            gone = document["delete"]
            objects.pop((gone["kind"], gone.get("namespace", ""), gone["name"]), None)
        else:
            objects[_key(document)] = document
    return list(objects.values())


@dataclass(frozen=True, eq=False)
class Case:
    name: str
    data: dict[str, Any]
    before: Stack
    values_before: dict[str, Any]
    state: ClusterSnapshot

    @property
    def expect(self) -> dict[str, Any]:
        return self.data["expect"]

    @property
    def kind(self) -> str:
        """``failure`` (flagged or missed) or ``clean``."""
        return "clean" if self.expect.get("clean") else "failure"


def shipped_values() -> dict[str, Any]:
    return yaml.safe_load((ROOT / manifests.VALUES_FILE).read_text())


def apply_stack(stack: Stack, fields: dict[str, Any]) -> Stack:
    """stack.yaml with ``fields`` changed: operator, kubernetes, management, pools {name: {stack.yaml fields}}."""
    data = stack.to_dict()
    if "operator" in fields:
        data["operator"]["version"] = fields["operator"]
    if "kubernetes" in fields:
        data["cluster"]["kubernetesVersion"] = str(fields["kubernetes"])
    if "management" in fields:
        data["driver"]["management"] = fields["management"]
        if fields["management"] == "clusterpolicy":
            data["pools"] = [p for p in data["pools"] if p.get("default")]
    for name, changes in (fields.get("pools") or {}).items():
        for pool in data["pools"]:
            if pool["name"] == name:
                pool.update(merge(pool, changes))
    return Stack.from_dict(data)


@cache
def load(folder: Path) -> Case:
    data = yaml.safe_load((folder / "case.yaml").read_text())
    before = apply_stack(manifests.load_stack(ROOT), data.get("stack") or {})
    values = merge(shipped_values(), data.get("values") or {})
    observed = datetime.fromisoformat(str(data["observedAt"]).replace("Z", "+00:00"))
    state = ClusterSnapshot.from_objects(recorded_objects(folder / "cluster.yaml"),
                                         source=f"the recording {folder.name}",
                                      observed_at=observed)
    return Case(name=folder.name, data=data, before=before, values_before=values, state=state)


def cases() -> list[Path]:
    return sorted(p for p in CORPUS.iterdir() if p.is_dir() and not p.name.startswith("_"))


def _existing(stack: Stack) -> dict[str, Any]:
    return manifests.existing_drivers({k: v for k, v in manifests.render_drivers(stack).items()})


@cache
def plan(case: Case) -> planning.ChangePlan:
    """The plan ``gpugate stack`` makes of the case's change, the recorded cluster read."""
    change = case.data["change"]
    edit = change.get("edit") or {}
    values_after = merge(case.values_before, edit.get("values") or {})
    skip = bool((case.data.get("application") or {}).get("skipCrds"))
    context = ChangeContext(values=values_after, values_before=case.values_before, cluster=case.state,
                      chart_crds_applied=not skip, application="gpu-operator", chart_crds=chartcrds.known())
    matrix, existing = matrix_data.load(), _existing(case.before)
    if "upgrade" in change:
        args = change["upgrade"]
        request = planning.Request(operator=str(args.get("operator", case.before.operator_version)),
                                   driver=args.get("driver"), pool=args.get("pool"), kubernetes=args.get("kubernetes"),
                                   driver_management=args.get("driverManagement"), waivers=Waivers())
        return planning.plan_upgrade(matrix, case.before, request, existing, context)
    if "promote" in change:
        return planning.plan_promote(matrix, case.before, source=change["promote"]["from"],
                                     to=change["promote"]["to"], existing=existing, context=context)
    return planning.plan_sync(matrix, case.before, apply_stack(case.before, edit), existing=existing,
                              context=context)


def reported(check: Check) -> bool:
    """A check that tells the user about a problem: failed, or passed with a warning, with its fix."""
    return (not check.ok or bool(check.warning)) and bool(check.fix)


def flagged_by(plan_: planning.ChangePlan, name: str) -> list[Check]:
    return [c for c in plan_.checks if c.name == name and reported(c)]
