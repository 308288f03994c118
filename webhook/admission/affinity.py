"""A policy's node requirements and whether a pod's own node selection already meets them. Pure.

kube-scheduler ORs a pod's ``nodeSelectorTerms`` and ANDs the expressions inside one term, and
ANDs ``spec.nodeSelector`` with all of them (``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``).
So a policy requirement holds only if it holds in *every* term: one term that lacks it lets the
pod escape to any node through that term. An empty term matches no node at all; it needs nothing.

Mutation adds the policy's expression to each non-empty term that does not already imply it;
validation denies a pod with a term that neither carries nor implies it. "Implies" is decided
per expression on the same key, from the operator semantics (``In`` a subset of the allowed
values, ``Gt`` a bound at least as high, ``NotIn`` a superset of the excluded values, or a
``nodeSelector`` value that satisfies the requirement).
"""

from __future__ import annotations

from typing import Any

from webhook import names
from webhook.kube import affinity as node_affinity
from webhook.policy.model import GPUPolicy

Expression = dict[str, Any]
Term = dict[str, Any]


def required_expressions(policy: GPUPolicy, *, limits_only: bool = False) -> list[Expression]:
    """The node requirements the policy prescribes for its GPU pods.

    ``limits_only`` leaves out what is placement, not a limit (``avoidCongested: required``): the
    validating endpoint holds every pod to the limits, including pods that opted out of shaping.
    """
    gpu = policy.gpu
    out: list[Expression] = []
    if gpu.products:
        out.append({"key": names.NVIDIA_PRODUCT_LABEL, "operator": "In", "values": list(gpu.products)})
    if gpu.families:
        out.append({"key": names.NVIDIA_FAMILY_LABEL, "operator": "In", "values": list(gpu.families)})
    if gpu.min_memory_mib:
        # Gt is strict; the label is the GPU's memory in MiB.
        out.append({"key": names.NVIDIA_MEMORY_LABEL, "operator": "Gt", "values": [str(gpu.min_memory_mib - 1)]})
    if policy.placement.avoid_congested == "required" and not limits_only:
        out.append({"key": names.GPU_LOAD_LABEL, "operator": "NotIn", "values": ["congested"]})
    return out


def is_empty(term: Term) -> bool:
    """A term without expressions or fields matches no node (it selects nothing, not everything)."""
    return not term.get("matchExpressions") and not term.get("matchFields")


def _int(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _value_satisfies(value: str, wanted: Expression) -> bool:
    operator, values = wanted["operator"], [str(v) for v in wanted.get("values") or ()]
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Gt":
        number, bound = _int(value), _int(values[0]) if values else None
        return number is not None and bound is not None and number > bound
    if operator == "Lt":
        number, bound = _int(value), _int(values[0]) if values else None
        return number is not None and bound is not None and number < bound
    if operator == "Exists":
        return True
    return False


def implies(existing: Any, wanted: Expression) -> bool:
    """Does the expression ``existing`` (same key) only admit nodes that ``wanted`` admits?"""
    if not isinstance(existing, dict) or existing.get("key") != wanted["key"]:
        return False
    if existing == wanted:
        return True
    operator = existing.get("operator")
    values = [str(v) for v in existing.get("values") or ()]
    if operator == "In":
        return bool(values) and all(_value_satisfies(v, wanted) for v in values)
    if wanted["operator"] == "Gt" and operator == "Gt" and values:
        mine, bound = _int(values[0]), _int(wanted["values"][0])
        return mine is not None and bound is not None and mine >= bound
    if wanted["operator"] == "NotIn" and operator == "NotIn":
        return set(str(v) for v in wanted.get("values") or ()) <= set(values)
    return False


def term_meets(term: Term, wanted: Expression) -> bool:
    expressions = term.get("matchExpressions") or []
    return any(implies(e, wanted) for e in expressions)


def selector_meets(node_selector: dict[str, Any], wanted: Expression) -> bool:
    value = node_selector.get(wanted["key"])
    return value is not None and _value_satisfies(str(value), wanted)


def selector_contradicts(node_selector: dict[str, Any], wanted: Expression) -> bool:
    """The pod's nodeSelector names the key with a value the requirement refuses."""
    value = node_selector.get(wanted["key"])
    return value is not None and not _value_satisfies(str(value), wanted)


def terms_of(pod_spec: dict[str, Any]) -> list[Term] | None:
    """The required nodeSelectorTerms, or None when the pod has no required node affinity."""
    required = node_affinity.field(pod_spec, node_affinity.REQUIRED)
    if not isinstance(required, dict):
        return None
    terms = required.get("nodeSelectorTerms")
    return [t for t in terms if isinstance(t, dict)] if isinstance(terms, list) else None


def _names_key(term: Any, key: str) -> bool:
    """A node selector term (``matchExpressions``) with an expression on ``key``."""
    expressions = term.get("matchExpressions") if isinstance(term, dict) else None
    return isinstance(expressions, list) and any(isinstance(e, dict) and e.get("key") == key for e in expressions)


def constrains(pod_spec: dict[str, Any], key: str) -> bool:
    """The pod's nodeSelector or one of its required node-affinity terms names ``key``."""
    selector = pod_spec.get("nodeSelector")
    if isinstance(selector, dict) and key in selector:
        return True
    return any(_names_key(term, key) for term in terms_of(pod_spec) or [])


def prefers(pod_spec: dict[str, Any], key: str) -> bool:
    """One of the pod's preferred node-affinity terms names ``key``."""
    preferred = node_affinity.field(pod_spec, node_affinity.PREFERRED)
    if not isinstance(preferred, list):
        return False
    return any(_names_key(item.get("preference"), key) for item in preferred if isinstance(item, dict))


def unmet(pod_spec: dict[str, Any], wanted: Expression) -> list[str]:
    """Where the pod's node selection lets it escape ``wanted``: 'nodeSelector' or 'term N'."""
    found = pod_spec.get("nodeSelector")
    node_selector: dict[str, Any] = found if isinstance(found, dict) else {}
    if selector_contradicts(node_selector, wanted):
        return ["nodeSelector"]
    if selector_meets(node_selector, wanted):
        return []
    terms = terms_of(pod_spec)
    if not terms:
        return ["no required node affinity"]
    return [f"term {i + 1}" for i, term in enumerate(terms) if not is_empty(term) and not term_meets(term, wanted)]


def describe(expression: Expression) -> str:
    """``key Op value`` or ``key In (a, b)``, as a person writes it (not a Python list)."""
    values = expression.get("values") or []
    listed = values if isinstance(values, list) else [values]
    tail = f" ({', '.join(map(str, listed))})" if len(listed) > 1 else f" {listed[0]}" if listed else ""
    return f"{expression['key']} {expression['operator']}{tail}"
