"""The desired pod the mutation steps write, and the context they write it through. Pure.

``working_copy`` copies only what the steps edit; ``StepContext`` carries what one pass decided
(warnings, denials) and is the one way a step writes a container's resources (``set_request``,
copy-on-write). ``check_field_types`` refuses, before any step runs, a pod whose fields the steps
touch have the wrong JSON type, which lets the helpers below trust the types they find.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from webhook.admission import patches
from webhook.errors import InputError
from webhook.kube import demand as kube_demand
from webhook.kube import pods, units
from webhook.kube.inventory import EMPTY, Inventory
from webhook.kube.units import is_gpu_resource
from webhook.policy.model import GPUPolicy, PolicyRef

Pod = pods.Pod


@dataclass(slots=True)
class StepContext:
    policy: GPUPolicy
    ref: PolicyRef
    namespace: str
    inventory: Inventory = EMPTY
    now: datetime | None = None
    warnings: list[str] = field(default_factory=list)
    denials: list[str] = field(default_factory=list)
    claim_devices: int | None = None
    """GPU devices the pod holds at most through the claims it references (``mutation.claim_devices``);
    None when it asks no GPU through a claim that was read."""
    claims_unread: bool = False
    """The pod references claims the caller did not read: they may hold GPUs (no default is added)."""
    gpus: units.GpuNames = field(default_factory=units.GpuNames)
    """Which resource names are GPU asks (the DRA extended-resource names of the cluster's classes too)."""
    _requested: frozenset[str] | None = None
    _owned: set[int] = field(default_factory=set)
    """ids of the desired pod's containers copied for writing (see ``own``)."""
    injected: set[int] = field(default_factory=set)
    """ids of the required node-affinity expressions this pass added (see ``require``): not the pod's own."""

    def requested(self, pod: Pod) -> frozenset[str]:
        """The GPU resources the desired pod asks for, read once and reused by the later steps.

        Several steps ask, and reading every container each time was a tenth of a mutation.
        Requests are written only through ``set_request``, which forgets the answer.
        """
        if self._requested is None:
            self._requested = kube_demand.gpu_resource_names(pod, self.gpus)
        return self._requested

    def dra_named(self, pod: Pod) -> frozenset[str]:
        """The GPU resources the pod asks under a DRA extended-resource name (not the device plugin's)."""
        return frozenset(r for r in self.requested(pod) if not is_gpu_resource(r))

    def set_request(self, pod: Pod, container: dict[str, Any], section: str, resource: str,
                    value: Any) -> dict[str, Any]:
        """Write one resource request or limit of the desired pod: the only way a step does.

        Containers are copied on their first write, not up front (``working_copy``): most pods
        get no request written, and a shared container is one the patch derivation skips at
        once. Returns the container written to, which the caller uses from then on.
        """
        container = self.own(pod, container)
        resources_of(container, section)[resource] = value
        self._requested = None
        return container

    def own(self, pod: Pod, container: dict[str, Any]) -> dict[str, Any]:
        """``container`` of the desired pod, replaced by a copy whose resources may be edited on its
        first call (``working_copy`` shares the containers); the copy from then on."""
        if id(container) in self._owned:
            return container
        copied = _own_container(pod, container)
        self._owned.add(id(copied))
        return copied

    def note(self, message: str) -> None:
        self.warnings.append(f"gpugate {self.ref}: {message}")

    def deny(self, message: str) -> None:
        self.denials.append(f"{message} (policy {self.ref})")


Step = Callable[[Pod, StepContext], None]
"""One mutation step: edits the desired pod in place, says what it did through the context."""


# The fields the steps read or write, as a tree: each name maps to (its JSON type, its children);
# "*" stands for every member of a list.
_FieldTypes = dict[str, tuple[type, "_FieldTypes"]]
_RESOURCES: _FieldTypes = {"resources": (dict, {"requests": (dict, {}), "limits": (dict, {})})}
_TERMS: _FieldTypes = {"*": (dict, {"matchExpressions": (list, {})})}
_POD_FIELD_TYPES: _FieldTypes = {
    "metadata": (dict, {"labels": (dict, {}), "annotations": (dict, {})}),
    "spec": (dict, {
        "containers": (list, {"*": (dict, _RESOURCES)}),
        "initContainers": (list, {"*": (dict, _RESOURCES)}),
        "tolerations": (list, {}),
        "nodeSelector": (dict, {}),
        "affinity": (dict, {
            "nodeAffinity": (dict, {
                "requiredDuringSchedulingIgnoredDuringExecution": (dict, {"nodeSelectorTerms": (list, _TERMS)}),
                "preferredDuringSchedulingIgnoredDuringExecution": (list, {}),
            }),
            "podAffinity": (dict, {
                "requiredDuringSchedulingIgnoredDuringExecution": (list, {}),
                "preferredDuringSchedulingIgnoredDuringExecution": (list, {}),
            }),
        }),
    }),
}


def check_field_types(pod: Pod) -> None:
    """Refuse, naming the field, a pod whose fields the steps touch have the wrong JSON type.

    The API server never sends such a pod (it decodes into typed structs first); a pod file or a
    hand-made review can, and it must get a message, not an AttributeError deep in a step (or a
    tolerations mapping silently turned into a list of its keys).
    """
    _check(pod, _POD_FIELD_TYPES, "")


def _check(node: Any, types: _FieldTypes, where: str) -> None:
    if isinstance(node, list):
        expected, children = types["*"]
        for i, member in enumerate(node):
            _check_value(member, expected, children, f"{where}[{i}]")
        return
    for key, (expected, children) in types.items():
        value = node.get(key)
        if value is not None:
            _check_value(value, expected, children, f"{where}.{key}" if where else key)


def _check_value(value: Any, expected: type, children: _FieldTypes, where: str) -> None:
    if not isinstance(value, expected):
        raise InputError(f"pod field {where} is a {type(value).__name__}, expected a "
                         f"{'mapping' if expected is dict else 'list'}; the API server would refuse this pod")
    if children:
        _check(value, children, where)


def working_copy(pod: Pod) -> Pod:
    """A copy of the parts of ``pod`` the steps may edit in place; everything else is shared.

    The steps edit annotations (never labels: policy selection reads them), the spec's top level,
    tolerations, affinity, and the resources of a container (copied when first written:
    ``StepContext.set_request``). Env, volumes, commands, managedFields and the rest are only read,
    so copying them (most of a pod's bytes) would be wasted, and the patch derivation recognises
    the shared subtrees by identity. A test proves mutate() never changes its input.
    """
    desired = dict(pod)
    metadata = pod.get("metadata")
    if isinstance(metadata, dict):
        metadata = dict(metadata)
        if isinstance(metadata.get("annotations"), dict):
            metadata["annotations"] = dict(metadata["annotations"])
        desired["metadata"] = metadata
    spec = pod.get("spec")
    if isinstance(spec, dict):
        spec = dict(spec)
        for key in ("tolerations", "affinity", "nodeSelector"):
            if key in spec:
                spec[key] = patches.clone(spec[key])
        for key in ("containers", "initContainers"):
            if isinstance(spec.get(key), list):
                spec[key] = list(spec[key])  # members are replaced by copies as they are written
        desired["spec"] = spec
    return desired


def _own_container(pod: Pod, container: dict[str, Any]) -> dict[str, Any]:
    """Replace ``container`` in the desired pod's lists by a copy whose resources may be edited."""
    spec = pods.spec(pod)
    for key in ("initContainers", "containers"):
        members = spec.get(key)
        if not isinstance(members, list):
            continue
        for index, member in enumerate(members):
            if member is container:
                copied = dict(container)
                if "resources" in copied:
                    copied["resources"] = patches.clone(copied["resources"])
                members[index] = copied
                return copied
    raise ValueError(f"container {container.get('name')!r} is not one of the desired pod's (a stale reference)")


# --- helpers over the desired pod (it is our own copy: steps edit it in place) -------------

def child(parent: dict[str, Any], key: str, default_factory: Callable[[], Any] = dict) -> Any:
    """``parent[key]``, created empty when missing (``check_field_types`` vouched for its type)."""
    value = parent.get(key)
    if value is None:
        value = default_factory()
        parent[key] = value
    return value


def spec_of(pod: Pod) -> dict[str, Any]:
    return child(pod, "spec")


def resources_of(container: dict[str, Any], section: str) -> dict[str, Any]:
    return child(child(container, "resources"), section)
