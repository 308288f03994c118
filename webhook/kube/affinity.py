"""A pod's node selection, parsed once: nodeSelector, required and preferred node affinity. Pure.

kube-scheduler ORs ``nodeSelectorTerms``, ANDs the requirements inside one term, and ANDs
``spec.nodeSelector`` with all of them (``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``).
The walk to ``spec.affinity.nodeAffinity.<field>`` used to be written in the admission core, the
mutation steps, the placement inputs and the replay's pod reader; it is here now, with typed
values for the readers that only look (the mutation, which edits the JSON, uses :func:`field`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """A nodeSelectorTerm: all expressions (labels) and fields (metadata.name) must hold."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class PreferredTerm:
    weight: int
    term: SelectorTerm


@dataclass(frozen=True, slots=True)
class NodeAffinity:
    node_selector: tuple[tuple[str, str], ...] = ()
    """``spec.nodeSelector``, sorted."""
    required: tuple[SelectorTerm, ...] | None = None
    """None: no required affinity (every node); () : a required affinity with no terms."""
    preferred: tuple[PreferredTerm, ...] = ()


def field(pod_spec: Mapping[str, Any], name: str) -> Any:
    """``affinity.nodeAffinity.<name>`` of the pod spec, raw, or None where the path is missing or mistyped."""
    affinity = pod_spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    return node_affinity.get(name) if isinstance(node_affinity, dict) else None


def required_terms_raw(pod_spec: Mapping[str, Any]) -> list[Any] | None:
    """The raw ``nodeSelectorTerms`` of the required affinity; None when there is no required affinity."""
    required = field(pod_spec, REQUIRED)
    if not isinstance(required, dict):
        return None
    terms = required.get("nodeSelectorTerms")
    return terms if isinstance(terms, list) else []


def parse(pod_spec: Mapping[str, Any]) -> NodeAffinity:
    """Everything a pod says about which nodes it may and would like to use."""
    terms = required_terms_raw(pod_spec)
    preferred = field(pod_spec, PREFERRED)
    selector = pod_spec.get("nodeSelector")
    return NodeAffinity(
        node_selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())) if isinstance(selector, dict)
        else (),
        required=None if terms is None else tuple(term(t) for t in terms),
        preferred=tuple(PreferredTerm(int(p.get("weight", 0)), term(p.get("preference")))
                        for p in preferred or () if isinstance(p, dict)) if isinstance(preferred, list) else (),
    )


def term(raw: Any) -> SelectorTerm:
    raw = raw if isinstance(raw, dict) else {}
    return SelectorTerm(requirements(raw.get("matchExpressions")), requirements(raw.get("matchFields")))


def requirements(raw: Any) -> tuple[Requirement, ...]:
    out = []
    for item in raw or ():
        if isinstance(item, dict):
            out.append(Requirement(str(item.get("key", "")), str(item.get("operator", "")),
                                   tuple(str(v) for v in item.get("values") or ())))
    return tuple(out)


def admits(selection: NodeAffinity, node: str, labels: Mapping[str, str]) -> bool:
    """Whether a node (its name and labels) passes the pod's nodeSelector and required affinity, as
    kube-scheduler's NodeAffinity filter decides; an empty term matches no node."""
    if any(labels.get(key) != value for key, value in selection.node_selector):
        return False
    if selection.required is None:
        return True
    return any((term.expressions or term.fields)
               and all(_holds(r, labels.get(r.key)) for r in term.expressions)
               and all(r.key == "metadata.name" and _holds(r, node) for r in term.fields)
               for term in selection.required)


def _holds(requirement: Requirement, value: str | None) -> bool:
    operator = requirement.operator
    if operator == "In":
        return value is not None and value in requirement.values
    if operator == "NotIn":
        return value is None or value not in requirement.values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(requirement.values) == 1:
        try:
            have, bound = int(value, 10), int(requirement.values[0], 10)
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False
