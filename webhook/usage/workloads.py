"""A pod that may hold GPUs, reduced to what accounting and idle reclaim read, and its top controller. Pure.

The owner a GPU-hour is billed to is the pod's top controller, not the object that made the pod:
a Deployment's pods are made by a ReplicaSet whose name is the Deployment's plus ``-<hash>``,
and the pods carry that hash as their ``pod-template-hash`` label (the deployment controller's
``pkg/controller/deployment/sync.go`` names the ReplicaSet ``<deployment>-<pod-template-hash>``),
so the Deployment is read off the pod without a ReplicaSet watch. Every other controller is the
top one as far as the pod tells (a StatefulSet, a Job, a DaemonSet, a custom resource); a pod
without a controller is its own owner.

Only some controllers recreate a pod that is evicted, in the same shape, without counting it as
a failure: ReplicaSets (and so Deployments), StatefulSets and ReplicationControllers. A Job counts
an evicted pod against its ``backoffLimit`` unless its pod failure policy says otherwise, and a
DaemonSet's replacement lands on the same node: evicting either gives no GPU back for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from webhook import names
from webhook.kube import demand as kube_demand
from webhook.kube import pods, timestamps
from webhook.kube.demand import PodDemand
from webhook.kube.quantity import QuantityError

TEMPLATE_HASH_LABEL = "pod-template-hash"
RECREATING_CONTROLLERS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})
"""Controller kinds that recreate an evicted pod (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A bound, running-or-pending pod that asks for GPUs (device plugin or DRA claims)."""

    namespace: str
    name: str
    uid: str
    node: str
    owner: Owner
    controller: str
    """Kind of the pod's controlling owner reference; empty for a pod no controller made."""
    labels: tuple[tuple[str, str], ...]
    started: float | None
    """Unix time the kubelet started the pod (``status.startTime``), else its creation; None: unknown."""
    demand: PodDemand
    idle_note: str | None = None
    """The balancer's :data:`names.IDLE_ANNOTATION` on the pod, if any."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def recreated(self) -> bool:
        """A controller recreates this pod when it is evicted (:data:`RECREATING_CONTROLLERS`)."""
        return self.controller in RECREATING_CONTROLLERS

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    def as_pod(self) -> pods.Pod:
        """The pod as policy matching reads it (metadata only)."""
        return {"metadata": {"name": self.name, "namespace": self.namespace, "labels": self.label_map}}


class Owner(NamedTuple):
    """Whom a pod's GPU-hours are billed to: its top controller (``kind``, ``name``) in its namespace."""

    kind: str
    name: str


def owner_of(pod: pods.Pod) -> tuple[Owner, str]:
    """The top controller (see the module docstring) and the kind of the controlling reference."""
    meta = pods.metadata(pod)
    name = str(meta.get("name") or "")
    refs = meta.get("ownerReferences")
    controller = next((r for r in refs if isinstance(r, dict) and r.get("controller")), None) \
        if isinstance(refs, list) else None
    if controller is None:
        return Owner("Pod", name), ""
    kind, owner = str(controller.get("kind") or ""), str(controller.get("name") or "")
    template_hash = pods.labels(pod).get(TEMPLATE_HASH_LABEL)
    if kind == "ReplicaSet" and template_hash and owner.endswith("-" + template_hash):
        return Owner("Deployment", owner.removesuffix("-" + template_hash)), kind
    return Owner(kind, owner), kind


def record_of(pod: pods.Pod) -> PodRecord | None:
    """The record of a bound, non-terminal pod that asks for GPUs or references claims; else None.

    A pod whose quantities cannot be read (the API server refuses such a pod) counts as none.
    """
    spec, status = pods.spec(pod), pod.get("status") or {}
    node = spec.get("nodeName")
    if not node or status.get("phase") in pods.TERMINAL_PHASES:
        return None
    try:
        demand = kube_demand.of_pod(pod)
    except QuantityError:
        return None
    if not demand.gpu_counts() and not demand.claims:
        return None
    meta = pods.metadata(pod)
    owner, controller = owner_of(pod)
    return PodRecord(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""), uid=str(meta.get("uid") or ""),
        node=str(node), owner=owner, controller=controller, labels=tuple(sorted(pods.labels(pod).items())),
        started=timestamps.seconds(status.get("startTime")) or timestamps.seconds(meta.get("creationTimestamp")),
        demand=demand, idle_note=pods.annotations_of(pod).get(names.IDLE_ANNOTATION))


def record_key(pod: pods.Pod) -> str:
    meta = pods.metadata(pod)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
