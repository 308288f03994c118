"""The pod templates of workloads, judged as the pods they become, so a forbidden one is refused at apply. Pure.

A Deployment in a namespace where GPUs are denied used to be created, and its ReplicaSet's pods
then refused one by one, seen only in the ReplicaSet's events (Kyverno's "autogen" refuses the
Deployment itself). The validating webhook judges each pod template of a Deployment, StatefulSet,
DaemonSet, ReplicaSet, Job, CronJob or JobSet as the API server will judge the pods its
controller makes: mutation, then validation of the mutated pod (``chain.admit``). A refusal carries
the pod's own reason; an allowed workload carries the warnings its pods will get, which the
controller's pod creations never show anyone.

The webhook's namespace exclusions come from its configuration. ``gpugate.io/skip`` on the
template skips the shaping (so its warnings), never the rules, as on a pod. A namespace's skip
label is not in the review, so a template in such a namespace is judged as shaped: its refusal
is the pod's, since validation ignores the label, but its warnings name shaping the pods will not get.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhook.admission import chain
from webhook.admission.results import Verdict
from webhook.kube import pods
from webhook.kube.inventory import EMPTY, Inventory
from webhook.policy import PolicySet

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    """One kind of workload: its API group, kind and resource, and where its pod template sits."""

    group: str
    version: str
    """The version the webhook configuration registers (matchPolicy Equivalent converts the others)."""
    kind: str
    resource: str
    template: tuple[str, ...]
    """The path to the pod template under the object (JobSet: under each replicated job)."""
    group_label: str = ""
    """The label the controller puts on every pod it makes, naming this workload (one job's pods)."""


WORKLOAD_KINDS: tuple[WorkloadKind, ...] = (
    WorkloadKind("apps", "v1", "Deployment", "deployments", ("spec", "template")),
    WorkloadKind("apps", "v1", "StatefulSet", "statefulsets", ("spec", "template")),
    WorkloadKind("apps", "v1", "DaemonSet", "daemonsets", ("spec", "template")),
    WorkloadKind("apps", "v1", "ReplicaSet", "replicasets", ("spec", "template")),
    WorkloadKind("batch", "v1", "Job", "jobs", ("spec", "template"), group_label=JOB_NAME_LABEL),
    WorkloadKind("batch", "v1", "CronJob", "cronjobs", ("spec", "jobTemplate", "spec", "template")),
    WorkloadKind("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets", ("template", "spec", "template"),
                 group_label=JOBSET_NAME_LABEL),
)
_BY_GROUP_KIND = {(k.group, k.kind): k for k in WORKLOAD_KINDS}


def kind_of(group: str, kind: str) -> WorkloadKind | None:
    """The workload kind (group, kind) names, or None for anything else."""
    return _BY_GROUP_KIND.get((group, kind))


def kind_of_document(obj: dict[str, Any]) -> WorkloadKind | None:
    """The workload kind of a whole object (``apiVersion`` and ``kind``), e.g. read from a file."""
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str):
        return None
    group = api_version.rpartition("/")[0]
    return kind_of(group, str(obj.get("kind")))


def needs_judging(kind: WorkloadKind, operation: str, obj: dict[str, Any] | None,
                  old: dict[str, Any] | None) -> bool:
    """A CREATE, or an UPDATE that changes a pod template, of an object that has one. Controllers
    update their workload's metadata (the deployment controller's revision annotation,
    finalizers): judging those could only ever block a controller under a policy written after
    the workload, never a GPU."""
    if obj is None or not any(True for _ in _templates(kind, obj)):
        return False  # no pod template: nothing its pods could be refused for
    if operation == "CREATE":
        return True
    if operation != "UPDATE":
        return False
    return old is None or [t for _, t in _templates(kind, old)] != [t for _, t in _templates(kind, obj)]


def template_pods(kind: WorkloadKind, obj: dict[str, Any]) -> list[tuple[str, pods.Pod]]:
    """(where, pod) for each pod template of ``obj``: the pod its controller would make, named by
    ``generateName`` as controllers name them, with the label the controller adds naming the job."""
    name = str(pods.metadata(obj).get("name") or pods.metadata(obj).get("generateName") or kind.kind.lower())
    out = []
    for where, template in _templates(kind, obj):
        found = template.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        labels = dict(meta["labels"]) if isinstance(meta.get("labels"), dict) else {}
        if kind.group_label:
            labels.setdefault(kind.group_label, name)
        metadata: dict[str, Any] = {**meta, "generateName": f"{name}-", "labels": labels}
        metadata.pop("name", None)
        out.append((where, {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                            "spec": template.get("spec") if isinstance(template.get("spec"), dict) else {}}))
    return out


def _templates(kind: WorkloadKind, obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, template) for each pod template: where is "" for the one template of most kinds,
    "replicatedJob 'NAME'" for each of a JobSet's."""
    if kind.kind == "JobSet":
        jobs = pods.spec(obj).get("replicatedJobs")
        for job in jobs if isinstance(jobs, list) else []:
            if isinstance(job, dict):
                found = _at(job, kind.template)
                if found is not None:
                    yield f"replicatedJob '{job.get('name')}'", found
        return
    found = _at(obj, kind.template)
    if found is not None:
        yield "", found


def _at(obj: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node: Any = obj
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def judge(kind: WorkloadKind, obj: dict[str, Any], *, namespace: str, policies: PolicySet,
          inventory: Inventory = EMPTY, now: datetime | None = None) -> Verdict:
    """The verdict on a workload: refused when a pod of any of its templates would be, with that
    pod's reasons; allowed with the warnings its pods will get. Each reason and warning names the
    template it comes from when the workload has several (a JobSet)."""
    name = pods.display_name(obj)
    reasons: list[str] = []
    warnings: list[str] = []
    policy = None
    for where, pod in template_pods(kind, obj):
        admitted = chain.admit(pod, namespace=namespace, policies=policies, inventory=inventory, now=now)
        prefix = f"{where}: " if where else ""
        reasons += [f"{kind.kind} '{name}': {prefix}{reason}" for reason in admitted.reasons
                    if not admitted.allowed]
        warnings += [f"{prefix}{warning}" for warning in admitted.warnings]
        if policy is None:
            policy = admitted.mutation.policy or (admitted.verdict.policy if admitted.verdict else None)
    return Verdict(allowed=not reasons, reasons=tuple(reasons), policy=policy, warnings=tuple(warnings))

