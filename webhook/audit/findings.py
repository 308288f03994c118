"""Running pods and workloads judged against today's policies, as findings and PolicyReports. Pure.

Admission decides once; a policy changes later. The audit asks of every pod and workload that
exists what ``gpugate validate`` asks of a file (``admission.judgement``): would the cluster admit
it now, and would today's policies shape a pod differently? Each object is one finding: ``fail``
(admission would refuse it: the reason), ``warn`` (a pod today's mutation would change: the
fields), ``pass``. The findings become one ``PolicyReport`` (``wgpolicyk8s.io/v1alpha2``, the
format Kyverno and Policy Reporter read) per namespace, named ``gpugate``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhook import names
from webhook.admission import judgement, workloads
from webhook.kube import pods
from webhook.kube.inventory import EMPTY, Inventory
from webhook.policy import PolicySet

REPORT_API_VERSION = "wgpolicyk8s.io/v1alpha2"
REPORT_NAME = "gpugate"
SOURCE = "gpugate"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpugate"}


@dataclass(frozen=True, slots=True)
class Finding:
    """One object's result under today's policies."""

    namespace: str
    kind: str
    name: str
    api_version: str
    uid: str
    result: str
    """pass, warn or fail (PolicyReport's words)."""
    policy: str
    """The policy's name (``none`` when no policy applies), its revision in ``revision``."""
    revision: str
    rule: str
    """admission (would it be admitted), or shaping (would mutation change it)."""
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "kind": self.kind, "name": self.name, "result": self.result,
                "policy": self.policy, "revision": self.revision, "rule": self.rule, "message": self.message}


def owned_by_a_judged_workload(obj: Mapping[str, Any]) -> bool:
    """A ReplicaSet of a Deployment or a Job of a CronJob: its owner's template is the same one,
    judged already. Pods are judged all the same: they are what runs."""
    kinds = {ref.get("kind") for ref in pods.metadata(dict(obj)).get("ownerReferences") or [] if isinstance(ref, dict)}
    return (obj.get("kind") == "ReplicaSet" and "Deployment" in kinds) or (obj.get("kind") == "Job"
                                                                              and "CronJob" in kinds)


def audit(objects: Iterable[dict[str, Any]], *, policies: PolicySet, skipped_namespaces: frozenset[str] = frozenset(),
          inventory: Inventory = EMPTY, now: datetime | None = None) -> list[Finding]:
    """A finding per pod (not ended) and per workload of ``objects``, in the order given.

    ``skipped_namespaces`` are those labelled ``gpugate.io/skip``: the mutating webhook is not
    called there, so their pods are judged by validation alone and never found reshaped."""
    found = []
    for obj in objects:
        kind = str(obj.get("kind"))
        if kind == "Pod" and str((obj.get("status") or {}).get("phase")) in pods.TERMINAL_PHASES:
            # A pod that has ended holds nothing and can be admitted no more: not judged.
            continue
        if kind != "Pod" and (workloads.kind_of_document(obj) is None or owned_by_a_judged_workload(obj)):
            continue
        meta = pods.metadata(obj)
        namespace = str(meta.get("namespace") or "default")
        judged = judgement.judge(obj, source=f"{namespace}/{kind}/{pods.display_name(obj)}", namespace=namespace,
                                 policies=policies, inventory=inventory, now=now,
                                 shaped=namespace not in skipped_namespaces)
        found.append(_finding(obj, judged, policies.revision))
    return found


def _finding(obj: Mapping[str, Any], judged: judgement.Judgement, revision: str) -> Finding:
    policy = (judged.policy or "none").split("@", 1)[0]
    if not judged.allowed:
        result, rule, message = "fail", "admission", "; ".join(judged.reasons)
    elif judged.reshaped:
        result, rule = "warn", "shaping"
        message = (f"today's policy {policy} would shape this pod differently: it changes "
                   f"{', '.join(judged.reshaped)}; the pod keeps its shape until it is created again")
    else:
        result, rule = "pass", "admission"
        message = f"admitted as it is by policy {policy}" if judged.policy else "no policy applies"
    meta = pods.metadata(dict(obj))
    return Finding(namespace=judged.namespace, kind=judged.kind, name=judged.name,
                   api_version=str(obj.get("apiVersion") or "v1"), uid=str(meta.get("uid") or ""), result=result,
                   policy=policy, revision=revision, rule=rule, message=message)


def reports(findings: Iterable[Finding], *, now: datetime) -> list[dict[str, Any]]:
    """One PolicyReport per namespace with findings, its results in the findings' order."""
    by_namespace: dict[str, list[Finding]] = {}
    for finding in findings:
        by_namespace.setdefault(finding.namespace, []).append(finding)
    stamp = {"seconds": int(now.timestamp()), "nanos": 0}
    out = []
    for namespace, found in by_namespace.items():
        summary = {key: sum(f.result == key for f in found) for key in ("pass", "fail", "warn", "error", "skip")}
        out.append({
            "apiVersion": REPORT_API_VERSION, "kind": "PolicyReport",
            "metadata": {"name": REPORT_NAME, "namespace": namespace, "labels": dict(MANAGED_BY)},
            "summary": summary,
            "results": [{"policy": f.policy, "rule": f.rule, "result": f.result, "message": f.message,
                         "source": SOURCE, "scored": True, "timestamp": stamp,
                         "category": "GPU", "severity": "high" if f.result == "fail" else "info",
                         "properties": {"revision": f.revision},
                         "resources": [{"apiVersion": f.api_version, "kind": f.kind, "name": f.name,
                                        "namespace": f.namespace, "uid": f.uid}]} for f in found],
        })
    return out


def table(findings: Iterable[Finding]) -> str:
    """``gpugate audit -o table``: one line per finding, failures first."""
    order = {"fail": 0, "warn": 1, "pass": 2}
    rows = [("NAMESPACE", "KIND", "NAME", "RESULT", "POLICY", "MESSAGE")]
    rows += [(f.namespace, f.kind, f.name, f.result.upper(), f.policy, f.message)
             for f in sorted(findings, key=lambda f: (order.get(f.result, 3), f.namespace, f.kind, f.name))]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)) + "  " + row[5]
                     for row in rows)


def skipped(namespaces: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The namespaces labelled ``gpugate.io/skip: "true"`` among Namespace objects."""
    return frozenset(str(pods.metadata(dict(n)).get("name")) for n in namespaces
                     if pods.labels(dict(n)).get(names.SKIP_LABEL) == "true")
