"""Kubernetes objects for the accounting tests, as the API server stores them, and the snapshot they give.

Nodes as GPU Feature Discovery labels them, pods as controllers make them (owner references, the
``pod-template-hash`` label), ResourceSlices as NVIDIA's DRA driver publishes them
(``tests/e2e/dra_slices.py``) and ResourceClaims as kube-scheduler allocates them. The snapshot
goes through the readers the balancer uses (``kube.gpunode.node_info``, ``usage.workloads.record_of``,
``placement.dracount.DraCache``), so what is tested is what the balancer exports.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tests.e2e import dra_slices
from webhook.kube.gpunode import node_info
from webhook.placement import dracount
from webhook.usage import accounting
from webhook.usage.workloads import PodRecord, record_of

Obj = dict[str, Any]
T0 = 1_800_000_000.0
"""Unix time the test pods started at (2027-01-15)."""


def stamp(unix: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, *, gpus: int = 0, shared: int = 0, replicas: int = 0, mig: dict[str, int] | None = None,
         product: str = "NVIDIA-H100-80GB-HBM3", count: int = 0) -> Obj:
    """A GPU node: ``gpus`` ``nvidia.com/gpu`` units (slots when ``replicas`` > 1), ``shared`` renamed
    slots, MIG slices per profile; ``replicas`` and ``count`` are GFD's ``nvidia.com/gpu.replicas``
    and ``nvidia.com/gpu.count`` (0: the label is absent)."""
    allocatable = {"cpu": "64", "memory": "512Gi"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    if shared:
        allocatable["nvidia.com/gpu.shared"] = str(shared)
    for profile, slices_offered in (mig or {}).items():
        allocatable[f"nvidia.com/mig-{profile}"] = str(slices_offered)
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": product}
    if replicas:
        labels["nvidia.com/gpu.replicas"] = str(replicas)
    if count:
        labels["nvidia.com/gpu.count"] = str(count)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": allocatable}}


def pod(name: str, node_name: str, resources: dict[str, int] | None = None, *, namespace: str = "ml",
        owner: tuple[str, str] | None = None, template_hash: str = "", labels: dict[str, str] | None = None,
        started: float = T0, claims: Iterable[str] = (), phase: str = "Running", uid: str = "",
        annotations: dict[str, str] | None = None) -> Obj:
    """A bound pod; ``owner``: its controller (kind, name); ``claims``: ResourceClaims it names."""
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
                 "labels": {**(labels or {}), **({"pod-template-hash": template_hash} if template_hash else {})},
                 "creationTimestamp": stamp(started - 5), "annotations": dict(annotations or {})}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "uid": "u",
                                    "controller": True}]
    container: Obj = {"name": "main", "image": "cuda"}
    if resources:
        container["resources"] = {"limits": {r: str(n) for r, n in resources.items()}}
    spec: Obj = {"nodeName": node_name, "containers": [container]}
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
        container["resources"] = {**container.get("resources", {}), "claims": [{"name": c} for c in claims]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": phase, "startTime": stamp(started)}}


def dra_node(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}}


def slices(node_name: str, count: int, *, shares: bool = False, mig: bool = False) -> list[Obj]:
    found = dra_slices.gpus(count, node=node_name, mig=mig, **({"consumable_shares": "memory"} if shares else {}))
    return dra_slices.node_slices(node_name, found)


def claim(name: str, node_name: str, devices: Iterable[str], *, pods: Iterable[str], namespace: str = "ml",
          memory: str | None = None) -> Obj:
    """An allocated claim reserved for ``pods``; ``memory``: the consumed capacity of a shared device."""
    results = []
    for i, device in enumerate(devices):
        result: Obj = {"request": "gpus", "driver": "gpu.nvidia.com", "pool": node_name, "device": device}
        if memory:
            result |= {"shareID": f"share-{name}-{i}", "consumedCapacity": {"memory": memory}}
        results.append(result)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name,
                                                                                    "namespace": namespace},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{namespace}-{p}"} for p in pods]}}


def records(pods: Iterable[Obj]) -> list[PodRecord]:
    return [r for r in (record_of(p) for p in pods) if r is not None]


def snapshot(nodes: Iterable[Obj], pods: Iterable[Obj], resource_slices: Iterable[Obj] = (),
             claims: Iterable[Obj] = ()) -> accounting.Snapshot:
    """What the balancer would export for these objects."""
    cache = dracount.DraCache()
    cache.replace_slices(dict(dracount.reduce_slice(s) for s in resource_slices))
    cache.replace_claims(dict(dracount.reduce_claim(c) for c in claims))
    infos = {n["metadata"]["name"]: node_info(n) for n in nodes}
    return accounting.snapshot(records(pods), infos, cache.nodes, cache.resource_claims.values())


def gpus_of(snap: accounting.Snapshot) -> dict[tuple[str, str], float]:
    """(pod, kind) -> GPUs, rounded to 1e-9 (float sums of sevenths)."""
    out: dict[tuple[str, str], float] = {}
    for h in snap.holdings:
        out[(h.pod, h.kind)] = round(out.get((h.pod, h.kind), 0.0) + h.gpus, 9)
    return out
