"""The mutation steps that say where and how a pod is scheduled. Pure.

Tolerations of the GPU taints, the policy's required node affinity ANDed into every term, and the
runtime class, priority class and scheduler the policy names. Each keeps what the user set.
"""

from __future__ import annotations

from typing import Any

from webhook import names
from webhook.admission import affinity
from webhook.admission.desiredpod import Pod, StepContext, child, spec_of
from webhook.kube import pods
from webhook.kube.inventory import Inventory
from webhook.policy.model import GPUPolicy


def _tolerates(existing: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Does an existing toleration already cover the wanted one (as kube-scheduler would see it)?"""
    key = existing.get("key")
    operator = existing.get("operator") or "Equal"
    if key in (None, "") and operator == "Exists":
        key_ok = True
    else:
        key_ok = key == wanted.get("key")
    if not key_ok:
        return False
    if operator == "Exists":
        value_ok = True  # any value of that key
    else:
        value_ok = wanted.get("operator", "Equal") == "Equal" and existing.get("value") == wanted.get("value")
    effect = existing.get("effect")
    return value_ok and (effect in (None, "") or effect == wanted.get("effect"))


def wanted_tolerations(requested: frozenset[str], policy: GPUPolicy, *, through_claims: bool = False
                       ) -> list[dict[str, Any]]:
    """The tolerations the policy prescribes for a pod asking for the GPU resources ``requested``
    (``through_claims``: and for GPUs through ResourceClaims, which tolerates the GPU taint ``auto`` adds)."""
    if policy.tolerations == "none":
        return []
    if policy.tolerations == "auto":
        if not requested and not through_claims:
            return []
        # A taint named after each NVIDIA resource; a DRA extended-resource name is served by the
        # NVIDIA driver's devices on GPU nodes, which carry the GPU taint.
        keys = [names.GPU_TAINT_KEY] + sorted(r for r in requested if r != names.GPU_TAINT_KEY
                                              and r.startswith(names.NVIDIA_PREFIX))
        return [{"key": key, "operator": "Exists", "effect": "NoSchedule"} for key in keys]
    return [t.as_k8s() for t in policy.tolerations]


def add_tolerations(pod: Pod, context: StepContext) -> None:
    """Tolerate the GPU taints as a set: nothing duplicated, nothing the user wrote removed."""
    wanted = wanted_tolerations(context.requested(pod), context.policy,
                                through_claims=context.claim_devices is not None)
    if not wanted:
        return
    existing = pods.spec(pod).get("tolerations") or []
    added = [w for w in wanted if not any(isinstance(e, dict) and _tolerates(e, w) for e in existing)]
    if added:
        spec_of(pod)["tolerations"] = list(existing) + added
        context.note("added tolerations for " + ", ".join(f"{t.get('key')}:{t.get('effect')}" for t in added))

def add_required_node_affinity(pod: Pod, context: StepContext) -> None:
    """AND each policy requirement into every non-empty nodeSelectorTerm that does not already imply it.

    Terms are ORed: a requirement missing from one term would let the pod escape through it.
    An empty term matches no node and stays empty (adding to it would make it match).
    """
    if not context.requested(pod):
        return
    added = require(pod, affinity.required_expressions(context.policy), context)
    if added:
        context.note("required node affinity " + ", ".join(added))


def require(pod: Pod, wanted: list[dict[str, Any]], context: StepContext) -> list[str]:
    """AND ``wanted`` into the pod's required node affinity, term by term; what was added, described."""
    spec = pods.spec(pod)
    selector = spec.get("nodeSelector")
    node_selector = selector if isinstance(selector, dict) else {}
    added: list[str] = []
    for expression in wanted:
        if affinity.selector_meets(node_selector, expression):
            continue  # the nodeSelector applies to every term already
        if affinity.selector_contradicts(node_selector, expression):
            context.note(f"the pod's nodeSelector {expression['key']}={node_selector[expression['key']]!r} "
                         f"contradicts the policy's {affinity.describe(expression)}; not changed for it "
                         f"(validation refuses such a pod)")
            continue
        terms = affinity.terms_of(pods.spec(pod))
        if terms is None:
            required = child(child(child(spec_of(pod), "affinity"), "nodeAffinity"),
                              "requiredDuringSchedulingIgnoredDuringExecution")
            first = _copy(expression)
            required["nodeSelectorTerms"] = [{"matchExpressions": [first]}]
            context.injected.add(id(first))
            added.append(affinity.describe(expression))
            continue
        for index, term in enumerate(terms):
            if affinity.is_empty(term) or affinity.term_meets(term, expression):
                continue
            expressions = child(term, "matchExpressions", list)
            same = [e for e in expressions if isinstance(e, dict) and e.get("key") == expression["key"]]
            ours = next((e for e in same if id(e) in context.injected), None)
            if ours is not None and _tighten(ours, expression):
                # Two lower bounds of this pass on one key (right-sizing's memory, the policy's
                # minMemoryMiB): one term with the larger, not two, and no word about the pod's own.
                added.append(f"{affinity.describe(ours)} in term {index + 1}")
                continue
            if same and ours is None:
                context.note(f"ANDed the policy's {affinity.describe(expression)} with the pod's own expression "
                             f"on {expression['key']} in node selector term {index + 1}")
            appended = _copy(expression)
            expressions.append(appended)
            context.injected.add(id(appended))
            added.append(f"{affinity.describe(expression)} in term {index + 1}")
    return added


def _tighten(ours: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Raise ``ours`` (a ``Gt`` this pass wrote) to ``wanted``'s bound when both are ``Gt`` on one
    key; False (nothing changed) for any other pair."""
    if ours.get("operator") != "Gt" or wanted.get("operator") != "Gt":
        return False
    try:
        bound = max(int(ours["values"][0]), int(wanted["values"][0]))
    except (KeyError, IndexError, TypeError, ValueError):
        return False
    ours["values"] = [str(bound)]
    return True

def _copy(expression: dict[str, Any]) -> dict[str, Any]:
    return {**expression, "values": list(expression.get("values") or ())}

# The API server defaults schedulerName before admission, so that value means "not chosen".
_UNSET = {"schedulerName": {"default-scheduler"}}


def _unchosen(field_name: str, current: Any, inventory: Inventory) -> bool:
    """The pod did not choose this value: empty, or what the API server filled in for it."""
    if current in (None, "") or current in _UNSET.get(field_name, ()):
        return True
    # The Priority admission plugin runs before any webhook and writes the globalDefault class
    # into every pod that names none (plugin/pkg/admission/priority/admission.go).
    return field_name == "priorityClassName" and current == inventory.default_priority_class


def set_scheduling_fields(pod: Pod, context: StepContext) -> None:
    """runtimeClassName, priorityClassName and schedulerName: only when the policy sets them and the user did not."""
    policy = context.policy
    for field_name, value in (("runtimeClassName", policy.runtime_class_name),
                              ("priorityClassName", policy.priority_class_name),
                              ("schedulerName", policy.scheduler_name)):
        if value is None:
            continue
        current = pods.spec(pod).get(field_name)
        if current == value:
            continue
        if _unchosen(field_name, current, context.inventory):
            spec_of(pod)[field_name] = value
            if field_name == "priorityClassName":
                # The Priority plugin filled spec.priority and spec.preemptionPolicy from the old
                # class. It runs again after a webhook changes the pod (reinvocation) and refuses
                # a value that differs from what the new class gives, so both go and it computes
                # them: removing only priority left a PreemptLowerPriority that a class with
                # preemptionPolicy Never then refused.
                spec_of(pod).pop("priority", None)
                spec_of(pod).pop("preemptionPolicy", None)
            context.note(f"set {field_name}: {value}")
        else:
            context.note(f"kept the pod's {field_name}: {current} instead of the policy's {value}")
