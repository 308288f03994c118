"""The cluster as a stack change's checks see it: the objects read once, as frozen data. Pure.

``gpugate stack plan --kube`` reads them through the API (``webhook.stack.clusterread``), ``--cluster-state
FILE`` from a recording (``kubectl get ... -o yaml`` output, or any YAML documents); the preflight
rules (``consumers``, ``nodestates``, ``crdstate``, ``dracutover``) only read this value. Objects stay
the API's JSON (TypedDict-like mappings), read through the few accessors below.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhook.errors import GpugateError
from webhook.names import DRIVER_OWNER_LABEL, GPU_PRESENT_LABEL
from webhook.stack.model import Stack

KubeObject = Mapping[str, Any]
NFD_NVIDIA_PCI_LABEL = "feature.node.kubernetes.io/pci-10de.present"
"""What NFD labels a node with an NVIDIA PCI device; the operator finds GPU nodes by it."""
OPERATOR_OWNER_KINDS = ("ClusterPolicy", "NVIDIADriver")
"""The operator's own DaemonSets are owned by one of these (controllers set the owner reference)."""

# kind -> the ClusterSnapshot field it is kept in
_FIELDS = {"Node": "nodes", "Pod": "pods", "DaemonSet": "daemonsets", "CustomResourceDefinition": "crds",
           "ClusterPolicy": "cluster_policies", "NVIDIADriver": "nvidia_drivers", "GPUCluster": "gpu_clusters"}


def meta(obj: KubeObject) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def name_of(obj: KubeObject) -> str:
    return str(meta(obj).get("name") or "")


def labels_of(obj: KubeObject) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def annotations_of(obj: KubeObject) -> Mapping[str, str]:
    return meta(obj).get("annotations") or {}


def spec_of(obj: KubeObject) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def status_of(obj: KubeObject) -> Mapping[str, Any]:
    return obj.get("status") or {}


def qualified(obj: KubeObject) -> str:
    """``namespace/name`` (or ``name`` for a cluster-scoped object), for messages."""
    namespace = meta(obj).get("namespace")
    return f"{namespace}/{name_of(obj)}" if namespace else name_of(obj)


def is_gpu_node(node: KubeObject) -> bool:
    labels = labels_of(node)
    return labels.get(GPU_PRESENT_LABEL) == "true" or labels.get(NFD_NVIDIA_PCI_LABEL) == "true"


def node_ready(node: KubeObject) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status_of(node).get("conditions") or [])


def pool_of_node(labels: Mapping[str, str], stack: Stack) -> str:
    """The pool a GPU node belongs to: the NVIDIADriver that owns it, else the nodeSelector it
    matches, else the default pool (the operator's ownership rule, internal/nvidiadriver AssignOwners)."""
    if stack.management == "nvidiadriver":
        owner = labels.get(DRIVER_OWNER_LABEL)
        for pool in stack.pools:
            if owner and owner == pool.resource_name:
                return pool.name
        for pool in stack.pools:
            if pool.node_selector and all(labels.get(k) == v for k, v in pool.node_selector.items()):
                return pool.name
    return stack.default_pool.name


def controller_of(obj: KubeObject) -> tuple[str, str] | None:
    """(kind, name) of the object's controlling owner reference, if any."""
    for ref in meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind")), str(ref.get("name"))
    return None


@dataclass(frozen=True)
class ClusterSnapshot:
    """What the cluster held when it was read. ``crds`` None: CRDs were not read."""

    nodes: tuple[KubeObject, ...] = ()
    pods: tuple[KubeObject, ...] = ()
    daemonsets: tuple[KubeObject, ...] = ()
    crds: tuple[KubeObject, ...] | None = None
    cluster_policies: tuple[KubeObject, ...] = ()
    nvidia_drivers: tuple[KubeObject, ...] = ()
    gpu_clusters: tuple[KubeObject, ...] = ()
    source: str = "the cluster"
    """Where it was read (a server, a file), said in every reason that cites it."""
    observed_at: datetime | None = None
    """When it was read (timezone-aware): how long a pod has been in a state is measured to it."""

    @classmethod
    def from_objects(cls, objects: Iterable[Any], *, source: str,
                     observed_at: datetime | None = None) -> ClusterSnapshot:
        """Objects by kind; ``List`` objects are opened; any other kind is refused, naming it."""
        found: dict[str, list[KubeObject]] = {field: [] for field in _FIELDS.values()}
        saw_crds = False
        for index, obj in enumerate(_flatten(objects)):
            if not isinstance(obj, Mapping) or not isinstance(obj.get("kind"), str):
                raise GpugateError(f"{source}, object {index + 1}: expected a Kubernetes object with a kind")
            field = _FIELDS.get(obj["kind"])
            if field is None:
                raise GpugateError(f"{source}, object {index + 1}: kind {obj['kind']} is not one the stack checks "
                                   f"read ({', '.join(sorted(_FIELDS))})")
            saw_crds = saw_crds or field == "crds"
            found[field].append(obj)
        values = {field: tuple(items) for field, items in found.items()}
        return cls(**{**values, "crds": values["crds"] if saw_crds else None},  # type: ignore[arg-type]
                   source=source, observed_at=observed_at)

    def age_seconds(self, timestamp: Any) -> float | None:
        """Seconds from an RFC 3339 ``timestamp`` to ``observed_at`` (None if either is unknown)."""
        if self.observed_at is None or not isinstance(timestamp, str):
            return None
        try:
            moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        except ValueError:
            return None
        return (self.observed_at - moment).total_seconds()

    def gpu_nodes(self) -> list[KubeObject]:
        return [n for n in self.nodes if is_gpu_node(n)]

    def pool_nodes(self, stack: Stack, pools: Iterable[str]) -> dict[str, str]:
        """GPU node name -> pool, for the nodes of ``pools`` under ``stack``."""
        wanted = set(pools)
        out = {}
        for node in self.gpu_nodes():
            pool = pool_of_node(labels_of(node), stack)
            if pool in wanted:
                out[name_of(node)] = pool
        return out

    def pods_on(self, nodes: Iterable[str]) -> list[KubeObject]:
        """Running or Pending pods bound to ``nodes`` (a finished pod holds no device)."""
        wanted = set(nodes)
        return [p for p in self.pods if spec_of(p).get("nodeName") in wanted
                and status_of(p).get("phase", "Running") in ("Running", "Pending")]

    def daemonset(self, namespace: str, name: str) -> KubeObject | None:
        for ds in self.daemonsets:
            if meta(ds).get("namespace") == namespace and name_of(ds) == name:
                return ds
        return None

    def operator_owned(self, pod: KubeObject) -> bool:
        """A pod of the operator's own DaemonSets (driver, toolkit, plugin, exporter, validator...):
        the driver manager takes those off the node itself before it unloads the driver."""
        owner = controller_of(pod)
        if owner is None or owner[0] != "DaemonSet":
            return False
        ds = self.daemonset(str(meta(pod).get("namespace")), owner[1])
        by = controller_of(ds) if ds is not None else None
        return by is not None and by[0] in OPERATOR_OWNER_KINDS

    def crd(self, name: str) -> KubeObject | None:
        for crd in self.crds or ():
            if name_of(crd) == name:
                return crd
        return None


def _flatten(objects: Iterable[Any]) -> Iterable[Any]:
    for obj in objects:
        if obj is None:
            continue
        if isinstance(obj, Mapping) and str(obj.get("kind", "")).endswith("List") and "items" in obj:
            kind = str(obj["kind"])[: -len("List")]
            for item in obj.get("items") or []:
                if isinstance(item, Mapping) and "kind" not in item and kind:
                    item = {**item, "kind": kind}
                yield item
        else:
            yield obj
