"""Golden test cases for a policy folder, the way ``kyverno test`` runs them.

A case is a folder under ``<policies>/tests/``::

    case.yaml      namespace: ml-train
                   pod: pod.yaml                    # default; a Pod (then the claims it references), or
                                                    # a ResourceClaim or ResourceClaimTemplate
                   inventory: inventory.json        # optional: the balancer's GPUInventory, taken as fresh
                   expect: {mutated: expected.yaml} | {denied: "part of the message"} | {unchanged: true}

The pod is mutated, the patch applied, the result validated, and the result mutated again (it
must not change: the webhook is reinvoked). ``gpugate policy test`` and the pytest suite call
this same runner, so the CLI cannot drift from CI. Revisions in the policy annotation are
written ``NAME@REVISION`` in expected files, so a policy edit does not rewrite every golden file.

It runs the admission chain on files, so it is an edge above the pure core: not in
``webhook/admission/`` (which opens no file) nor in ``webhook/policy/`` (which sits below admission
and imports nothing of it).
"""

from __future__ import annotations

import difflib
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from webhook import names
from webhook.admission import chain, dra
from webhook.errors import InputError
from webhook.kube.documents import read_admission_file, read_one
from webhook.kube.inventory import EMPTY, Inventory
from webhook.policy import PolicySet, loading
from webhook.server import inventoryfile

CASE_FILE = "case.yaml"


@dataclass(frozen=True, slots=True)
class CaseResult:
    name: str
    passed: bool
    detail: str = ""
    seconds: float = 0.0


def find_cases(policy_dir: Path) -> list[Path]:
    root = policy_dir / "tests"
    if not root.is_dir():
        return []
    return sorted(p.parent for p in root.rglob(CASE_FILE))


def mask_revision(pod: dict[str, Any]) -> dict[str, Any]:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(names.POLICY_ANNOTATION)
    if isinstance(value, str):
        annotations[names.POLICY_ANNOTATION] = re.sub(r"@[0-9a-f]+$", "@REVISION", value)
    return pod


def _dump(obj: object) -> list[str]:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False).splitlines(keepends=True)


def run_case(case_dir: Path, policies: PolicySet, *, root: Path | None = None, inventory: Inventory = EMPTY,
             now: datetime | None = None) -> CaseResult:
    """One case; ``inventory`` (judged at ``now``, as the server does) unless the case names its own."""
    name = str(case_dir.relative_to(root)) if root else case_dir.name
    started = time.perf_counter()
    try:
        detail = _check(case_dir, policies, inventory, now)
    except InputError as err:
        detail = str(err)
    return CaseResult(name=name, passed=detail == "", detail=detail, seconds=time.perf_counter() - started)


def _check(case_dir: Path, policies: PolicySet, inventory: Inventory, now: datetime | None) -> str:
    spec = _read_case(case_dir)
    document = read_admission_file(case_dir / spec.get("pod", "pod.yaml"))
    pod = document.subject
    namespace = spec["namespace"]
    if spec.get("inventory"):
        # A committed file's generatedAt ages; the case means "as just published".
        inventory, now = inventoryfile.read(case_dir / str(spec["inventory"])), None
    outcome = chain.admit(pod, namespace=namespace, policies=policies, inventory=inventory, now=now,
                          resolved=dra.resolve_documents(document.claims))
    result = outcome.mutation
    mutated = jsonpatch.apply_patch(pod, list(result.patch)) if result.patch else pod
    again = chain.mutate(mutated, namespace=namespace, policies=policies, inventory=inventory, now=now)
    if again.patch:
        return f"not idempotent: mutating the result again patches {list(again.patch)}"
    expect = spec["expect"]
    message = "; ".join(outcome.reasons)
    if "denied" in expect:
        if outcome.allowed:
            return f"expected a denial containing {expect['denied']!r}, but the pod was allowed"
        if str(expect["denied"]) not in message:
            return f"denial message {message!r} does not contain {expect['denied']!r}"
        return ""
    if not outcome.allowed:
        return f"unexpected denial: {message}"
    expected = pod if expect.get("unchanged") else read_admission_file(case_dir / expect["mutated"]).subject
    actual = mask_revision(mutated)
    if actual != mask_revision(expected):
        diff = difflib.unified_diff(_dump(mask_revision(expected)), _dump(actual), "expected", "actual")
        return "mutated pod differs:\n" + "".join(diff)
    return ""


def _read_case(case_dir: Path) -> dict[str, Any]:
    path = case_dir / CASE_FILE
    spec = read_one(path)  # errors name the file, and the line of a YAML error
    if "namespace" not in spec or not isinstance(spec.get("expect"), dict):
        raise InputError(f"{path}: a case needs 'namespace' and 'expect' "
                         f"({{mutated: FILE}}, {{denied: TEXT}} or {{unchanged: true}})")
    keys = set(spec["expect"])
    if len(keys & {"mutated", "denied", "unchanged"}) != 1 or keys - {"mutated", "denied", "unchanged"}:
        raise InputError(f"{path}: expect must hold exactly one of mutated, denied, unchanged; got {sorted(keys)}")
    return spec


def run_all(policy_dir: Path, *, inventory: Inventory = EMPTY, now: datetime | None = None) -> list[CaseResult]:
    policies = loading.load_dir(policy_dir)
    root = policy_dir / "tests"
    return [run_case(case, policies, root=root, inventory=inventory, now=now) for case in find_cases(policy_dir)]


def junit_xml(results: list[CaseResult], *, suite: str = "gpugate-policy-tests") -> bytes:
    failures = sum(not r.passed for r in results)
    element = ET.Element("testsuite", name=suite, tests=str(len(results)), failures=str(failures),
                         errors="0", time=f"{sum(r.seconds for r in results):.3f}")
    for result in results:
        case = ET.SubElement(element, "testcase", classname=suite, name=result.name, time=f"{result.seconds:.3f}")
        if not result.passed:
            failure = ET.SubElement(case, "failure", message=result.detail.splitlines()[0] if result.detail else "")
            failure.text = result.detail
    return ET.tostring(element, encoding="utf-8", xml_declaration=True)
