"""Compute the pod a GPUPolicy prescribes, then the JSON patch to get there. Pure: no I/O.

The desired pod is built by small steps in a declared order (``STEPS``); the patch is always
derived with ``jsonpatch.make_patch`` (``webhook.admission.patches``) so parents are created and ``/`` in
keys is escaped.
Every step keeps what the user set and says so in a warning, and a step that finds its work
already done changes nothing, so mutating the output again yields an empty patch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from webhook import names
from webhook.admission import patches
from webhook.errors import InputError
from webhook.kube import pods
from webhook.kube.quantity import whole_count
from webhook.policy import PolicySet, matching
from webhook.policy.model import GPUPolicy, PolicyRef

Pod = pods.Pod
PatchOp = patches.PatchOp

# Preferred node-affinity weights. kube-scheduler sums the weights of matching terms, then
# normalizes per pod over the feasible nodes (best node -> 100) and multiplies by the
# NodeAffinity plugin weight 2, so only the ratios between these numbers matter; the best
# node gains up to 200 points, more than LeastAllocated (<= 100) or BalancedAllocation (<= 100)
# can give back, so the policy's preference wins while ties still fall to the stock scorers.
#
# pack: cumulative "fewer free GPUs than n + 2^k" terms, so the tightest fit scores highest:
#   free == n -> 100, n+1 -> 60, n+2..n+3 -> 30, n+4..n+7 -> 10, more -> 0.
PACK_TERMS: tuple[tuple[int, int], ...] = ((1, 40), (2, 30), (4, 20), (8, 10))
# pack, for a CPU pod: no GPU node 100, else free == 0 -> 60, 1 -> 30, 2..3 -> 10, more -> 0.
CPU_POD_NO_GPU_WEIGHT = 100
CPU_POD_PACK_TERMS: tuple[tuple[int, int], ...] = ((1, 30), (2, 20), (4, 10))
# spread: idle 100+50=150, busy 50, congested 0 (normalized: idle 100, busy 33).
SPREAD_IDLE_WEIGHT = 100
SPREAD_NOT_CONGESTED_WEIGHT = 50
# avoidCongested: preferred -> a term every non-congested node matches.
AVOID_CONGESTED_WEIGHT = 100
# Pod affinity for one job on one topology domain (InterPodAffinity plugin weight 2).
TOPOLOGY_WEIGHT = 100


@dataclass(frozen=True, slots=True)
class Mutation:
    """Everything one mutation decided: the desired pod, the patch to it and why."""

    desired: Pod
    patch: tuple[PatchOp, ...]
    policy: PolicyRef | None
    warnings: tuple[str, ...] = ()
    mode: str = "enforce"


@dataclass(slots=True)
class StepContext:
    policy: GPUPolicy
    ref: PolicyRef
    namespace: str
    warnings: list[str] = field(default_factory=list)

    def note(self, message: str) -> None:
        self.warnings.append(f"gpugate {self.ref}: {message}")


Step = Callable[[Pod, StepContext], None]


def mutate(pod: Pod, *, namespace: str, policies: PolicySet) -> Mutation:
    """The desired pod and patch under the policy that applies to ``pod`` in ``namespace``."""
    policy = matching.select(policies, pod, namespace=namespace)
    if policy is None:
        return Mutation(desired=pod, patch=(), policy=None)
    desired, context = _shape(pod, policy, namespace, policies)
    ref = context.ref
    policy = context.policy
    patch = patches.make_patch(pod, desired)
    if policy.mode == "audit":
        warnings = tuple(f"audit: {w}" for w in context.warnings)
        if patch:
            warnings += (f"audit: gpugate {ref} would apply {len(patch)} patch operation(s); mode is audit",)
        return Mutation(desired=pod, patch=(), policy=ref, warnings=warnings, mode="audit")
    return Mutation(desired=desired, patch=patch, policy=ref, warnings=tuple(context.warnings))


# The fields the steps read or write, as a tree: each name maps to (its JSON type, its children);
# "*" stands for every member of a list.
_Shape = dict[str, tuple[type, "_Shape"]]
_RESOURCES: _Shape = {"resources": (dict, {"requests": (dict, {}), "limits": (dict, {})})}
_TERMS: _Shape = {"*": (dict, {"matchExpressions": (list, {})})}
_SHAPE: _Shape = {
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


def check_shape(pod: Pod) -> None:
    """Refuse, naming the field, a pod whose fields the steps touch have the wrong JSON type.

    The API server never sends such a pod (it decodes into typed structs first); a pod file or a
    hand-made review can, and it must get a message, not an AttributeError deep in a step (or a
    tolerations mapping silently turned into a list of its keys).
    """
    _check(pod, _SHAPE, "")


def _check(node: Any, shape: _Shape, where: str) -> None:
    if isinstance(node, list):
        expected, children = shape["*"]
        for i, member in enumerate(node):
            _check_value(member, expected, children, f"{where}[{i}]")
        return
    for key, (expected, children) in shape.items():
        value = node.get(key)
        if value is not None:
            _check_value(value, expected, children, f"{where}.{key}" if where else key)


def _check_value(value: Any, expected: type, children: _Shape, where: str) -> None:
    if not isinstance(value, expected):
        raise InputError(f"pod field {where} is a {type(value).__name__}, expected a "
                         f"{'mapping' if expected is dict else 'list'}; the API server would refuse this pod")
    if children:
        _check(value, children, where)


def working_copy(pod: Pod) -> Pod:
    """A copy of the parts of ``pod`` the steps may edit in place; everything else is shared.

    The steps edit metadata, the spec's top level, tolerations, affinity and each container's
    resources; env, volumes, commands and the rest are only read, so copying them (most of a
    pod's bytes) would be wasted. A test proves mutate() never changes its input.
    """
    desired = dict(pod)
    if isinstance(pod.get("metadata"), dict):
        desired["metadata"] = patches.clone(pod["metadata"])
    spec = pod.get("spec")
    if isinstance(spec, dict):
        spec = dict(spec)
        for key in ("tolerations", "affinity", "nodeSelector"):
            if key in spec:
                spec[key] = patches.clone(spec[key])
        for key in ("containers", "initContainers"):
            if isinstance(spec.get(key), list):
                spec[key] = [_container_copy(c) for c in spec[key]]
        desired["spec"] = spec
    return desired


def _container_copy(container: Any) -> Any:
    if not isinstance(container, dict):
        return container
    copied = dict(container)
    if "resources" in copied:
        copied["resources"] = patches.clone(copied["resources"])
    return copied


def _shape(pod: Pod, policy: GPUPolicy, namespace: str, policies: PolicySet) -> tuple[Pod, StepContext]:
    """Run the steps, then again under whichever policy matches the shaped pod, until it is stable.

    A gpuOnly:false policy that injects a GPU can make a higher-priority gpuOnly policy match the
    result. The validating endpoint (and a reinvocation) see that result, so mutation converges on
    the policy that matches it. Each switch goes to a higher priority, so this ends.
    """
    check_shape(pod)
    desired = working_copy(pod)
    warnings: list[str] = []
    while True:
        context = StepContext(policy=policy, ref=PolicyRef(policy.name, policies.revision), namespace=namespace)
        for step in STEPS:
            step(desired, context)
        warnings.extend(context.warnings)
        final = matching.select(policies, desired, namespace=namespace)
        if final is None or final is policy or final.priority <= policy.priority:
            context.warnings = warnings
            return desired, context
        warnings.append(f"gpugate: the shaped pod matches policy {final.name} (priority {final.priority}), "
                        f"which now applies")
        policy = final


# --- helpers over the desired pod (it is our own copy: steps edit it in place) -------------

def _child(parent: dict[str, Any], key: str, default_factory: Callable[[], Any] = dict) -> Any:
    """``parent[key]``, created empty when missing (check_shape vouched for its type)."""
    value = parent.get(key)
    if value is None:
        value = default_factory()
        parent[key] = value
    return value


def _spec(pod: Pod) -> dict[str, Any]:
    return _child(pod, "spec")


def _resources(container: dict[str, Any], section: str) -> dict[str, Any]:
    return _child(_child(container, "resources"), section)


def requested_gpu_count(pod: Pod, policy: GPUPolicy, context: StepContext | None = None) -> int | None:
    """How many of the policy's resource the pod asks for through the label or the default."""
    label = pods.labels(pod).get(names.GPUS_LABEL)
    if label is None:
        if not policy.match.gpu_only and policy.gpu.default and not pods.requested_gpu_resources(pod):
            return policy.gpu.default
        return None
    if label == "":
        return policy.gpu.default or 1
    count = whole_count(label)
    if count is None:
        if context:
            context.note(f"label {names.GPUS_LABEL}={label!r} is not a whole number; no GPU was added")
        return None
    return count or None


def target_container(pod: Pod, context: StepContext | None = None) -> dict[str, Any] | None:
    """The container named by the gpugate.io/container annotation, else the first regular one."""
    regular = pods.containers(pod)
    wanted = pods.annotations_of(pod).get(names.CONTAINER_ANNOTATION)
    if wanted:
        found = next((c for c in regular if c.get("name") == wanted), None)
        if found is None and context:
            context.note(f"annotation {names.CONTAINER_ANNOTATION}={wanted!r} names no regular container; "
                         f"no GPU was added")
        return found
    return regular[0] if regular else None


# --- the steps -------------------------------------------------------------------------------

def inject_gpu_requests(pod: Pod, context: StepContext) -> None:
    """Put the asked count of the policy's resource on one regular container, requests == limits."""
    _match_requests_and_limits(pod, context)
    count = requested_gpu_count(pod, context.policy, context)
    if count is None:
        return
    resource = context.policy.gpu.resource
    # Regular containers and sidecars count; an init container's GPU is released before they start.
    already = set().union(*(pods.gpu_resources(c) for c in pods.long_running_containers(pod)))
    if already:
        existing = [pods.gpu_count(c, resource) for c in pods.long_running_containers(pod)
                    if resource in pods.gpu_resources(c)]
        if resource not in already:
            context.note(f"kept the pod's own {', '.join(sorted(already))} request; the policy's {resource} "
                         f"was not added")
        elif existing and sum(x or 0 for x in existing) != count:
            context.note(f"kept the pod's own {resource}: {sum(x or 0 for x in existing)} instead of {count} "
                         f"from the {names.GPUS_LABEL} label")
        return
    container = target_container(pod, context)
    if container is None:
        return
    _resources(container, "requests")[resource] = str(count)
    _resources(container, "limits")[resource] = str(count)
    context.note(f"set {resource}: {count} (requests = limits) on container '{container.get('name')}'")


def _match_requests_and_limits(pod: Pod, context: StepContext) -> None:
    """Fill a missing request or limit of an NVIDIA resource with its twin: same count, now explicit."""
    for _, container in pods.all_containers(pod):
        requests = pods.resource_section(container, "requests")
        limits = pods.resource_section(container, "limits")
        for resource in sorted(pods.gpu_resources(container)):
            if resource in limits and resource not in requests:
                _resources(container, "requests")[resource] = limits[resource]
                context.note(f"set requests {resource}: {limits[resource]} to match limits on container "
                             f"'{container.get('name')}'")
            elif resource in requests and resource not in limits:
                _resources(container, "limits")[resource] = requests[resource]
                context.note(f"set limits {resource}: {requests[resource]} to match requests on container "
                             f"'{container.get('name')}'")


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


def wanted_tolerations(pod: Pod, policy: GPUPolicy) -> list[dict[str, Any]]:
    if policy.tolerations == "none":
        return []
    if policy.tolerations == "auto":
        requested = pods.requested_gpu_resources(pod)
        if not requested:
            return []
        keys = [names.GPU_TAINT_KEY] + sorted(r for r in requested if r != names.GPU_TAINT_KEY)
        return [{"key": key, "operator": "Exists", "effect": "NoSchedule"} for key in keys]
    return [t.as_k8s() for t in policy.tolerations]


def add_tolerations(pod: Pod, context: StepContext) -> None:
    """Tolerate the GPU taints as a set: nothing duplicated, nothing the user wrote removed."""
    wanted = wanted_tolerations(pod, context.policy)
    if not wanted:
        return
    existing = pods.spec(pod).get("tolerations") or []
    added = [w for w in wanted if not any(isinstance(e, dict) and _tolerates(e, w) for e in existing)]
    if added:
        _spec(pod)["tolerations"] = list(existing) + added
        context.note("added tolerations for " + ", ".join(f"{t.get('key')}:{t.get('effect')}" for t in added))


def required_expressions(policy: GPUPolicy) -> list[dict[str, Any]]:
    gpu = policy.gpu
    out: list[dict[str, Any]] = []
    if gpu.products:
        out.append({"key": names.NVIDIA_PRODUCT_LABEL, "operator": "In", "values": list(gpu.products)})
    if gpu.families:
        out.append({"key": names.NVIDIA_FAMILY_LABEL, "operator": "In", "values": list(gpu.families)})
    if gpu.min_memory_mib:
        # Gt is strict; the label is the GPU's memory in MiB.
        out.append({"key": names.NVIDIA_MEMORY_LABEL, "operator": "Gt", "values": [str(gpu.min_memory_mib - 1)]})
    if policy.placement.avoid_congested == "required":
        out.append({"key": names.GPU_LOAD_LABEL, "operator": "NotIn", "values": ["congested"]})
    return out


def add_required_node_affinity(pod: Pod, context: StepContext) -> None:
    """AND the policy's node requirements into every nodeSelectorTerm (OR across terms is kept)."""
    if not pods.requested_gpu_resources(pod):
        return
    wanted = required_expressions(context.policy)
    if not wanted:
        return
    spec = pods.spec(pod)
    node_selector = spec.get("nodeSelector") or {}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [t for t in (required.get("nodeSelectorTerms") or []) if isinstance(t, dict)]
    to_add = []
    for expression in wanted:
        key = expression["key"]
        if key in node_selector:
            context.note(f"kept the pod's nodeSelector {key}={node_selector[key]!r} instead of the policy's "
                         f"{expression['operator']} {expression['values']}")
            continue
        in_terms = [e for t in terms for e in (t.get("matchExpressions") or []) if isinstance(e, dict) and e.get("key") == key]
        if in_terms and all(e == expression for e in in_terms) and all(expression in (t.get("matchExpressions") or []) for t in terms):
            continue  # already ours, in every term
        if in_terms:
            context.note(f"kept the pod's own node affinity on {key} instead of the policy's "
                         f"{expression['operator']} {expression['values']}")
            continue
        to_add.append(expression)
    if not to_add:
        return
    affinity = _child(_child(_spec(pod), "affinity"), "nodeAffinity")
    required = _child(affinity, "requiredDuringSchedulingIgnoredDuringExecution")
    terms = required.get("nodeSelectorTerms")
    if not terms:
        required["nodeSelectorTerms"] = [{"matchExpressions": list(to_add)}]
    else:
        for term in terms:
            _child(term, "matchExpressions", list).extend(patches.clone(to_add))
    context.note("required node affinity " + ", ".join(f"{e['key']} {e['operator']} {e['values']}" for e in to_add))


def whole_gpus_asked(pod: Pod) -> int:
    """Whole GPUs the regular containers ask for (0 for shared or MIG pods): what a pack term must fit."""
    total = 0
    for container in pods.long_running_containers(pod):
        total += pods.gpu_count(container, names.GPU_RESOURCE) or 0
    return total


def preferred_terms(pod: Pod, policy: GPUPolicy) -> list[dict[str, Any]]:
    placement = policy.placement
    terms: list[dict[str, Any]] = []
    if placement.strategy == "pack" and not pods.requested_gpu_resources(pod):
        # A CPU pod (shaped by a gpuOnly:false policy): a node without GPUs first, else the GPU
        # node with the fewest free GPUs, so it stops taking the CPU an 8-GPU job needs on an empty node.
        terms.append(_term(CPU_POD_NO_GPU_WEIGHT, names.GPU_FREE_LABEL, "DoesNotExist", []))
        for step, weight in CPU_POD_PACK_TERMS:
            terms.append(_term(weight, names.GPU_FREE_LABEL, "Lt", [str(step)]))
    elif placement.strategy == "pack":
        n = whole_gpus_asked(pod)
        for step, weight in PACK_TERMS:
            terms.append(_term(weight, names.GPU_FREE_LABEL, "Lt", [str(n + step)]))
    elif placement.strategy == "spread":
        terms.append(_term(SPREAD_IDLE_WEIGHT, names.GPU_LOAD_LABEL, "In", ["idle"]))
        terms.append(_term(SPREAD_NOT_CONGESTED_WEIGHT, names.GPU_LOAD_LABEL, "In", ["idle", "busy"]))
    if placement.avoid_congested == "preferred":
        terms.append(_term(AVOID_CONGESTED_WEIGHT, names.GPU_LOAD_LABEL, "NotIn", ["congested"]))
    return terms


def _term(weight: int, key: str, operator: str, values: list[str]) -> dict[str, Any]:
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expression["values"] = values
    return {"weight": weight, "preference": {"matchExpressions": [expression]}}


def add_placement_preferences(pod: Pod, context: StepContext) -> None:
    """Preferred node affinity on the balancer's labels: steer, never strand (a stale label only tilts).

    GPU pods always; CPU pods only under a gpuOnly:false policy, which asked to shape them.
    """
    if not pods.requested_gpu_resources(pod) and context.policy.match.gpu_only:
        return
    wanted = preferred_terms(pod, context.policy)
    if not wanted:
        return
    affinity = ((pods.spec(pod).get("affinity") or {}).get("nodeAffinity") or {})
    existing = affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    added = [t for t in wanted if t not in existing]
    if not added:
        return
    node_affinity = _child(_child(_spec(pod), "affinity"), "nodeAffinity")
    node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = list(existing) + added
    context.note(f"prefer nodes for placement '{context.policy.placement.strategy}'"
                 + (" avoiding congested GPUs" if context.policy.placement.avoid_congested == "preferred" else ""))


def add_topology_affinity(pod: Pod, context: StepContext) -> None:
    """Co-locate the pods of one job on one topology domain (e.g. one NVLink clique)."""
    topology = context.policy.placement.topology
    if topology is None:
        return
    group = pods.group_of(pod)
    if group is None:
        return
    label, value = group
    selector = {"matchLabels": {label: value}}
    pod_affinity = ((pods.spec(pod).get("affinity") or {}).get("podAffinity") or {})
    if topology.mode == "required":
        key = "requiredDuringSchedulingIgnoredDuringExecution"
        term: dict[str, Any] = {"labelSelector": selector, "topologyKey": topology.key}
    else:
        key = "preferredDuringSchedulingIgnoredDuringExecution"
        term = {"weight": TOPOLOGY_WEIGHT, "podAffinityTerm": {"labelSelector": selector, "topologyKey": topology.key}}
    existing = pod_affinity.get(key) or []
    if term in existing:
        return
    _child(_child(_spec(pod), "affinity"), "podAffinity")[key] = list(existing) + [term]
    context.note(f"{topology.mode} co-location of job {label}={value} on {topology.key}")


# The API server defaults schedulerName before admission, so that value means "not chosen".
_UNSET = {"schedulerName": {"default-scheduler"}}


def set_scheduling_fields(pod: Pod, context: StepContext) -> None:
    """runtimeClassName, priorityClassName and schedulerName: only when the policy sets them and the user did not."""
    policy = context.policy
    for field_name, value in (("runtimeClassName", policy.runtime_class_name),
                              ("priorityClassName", policy.priority_class_name),
                              ("schedulerName", policy.scheduler_name)):
        if value is None:
            continue
        current = pods.spec(pod).get(field_name)
        if current in (None, "") or current in _UNSET.get(field_name, ()):
            _spec(pod)[field_name] = value
            if field_name == "priorityClassName":
                # The Priority admission plugin filled spec.priority from the old class; it recomputes
                # the value when it is re-run after us, and refuses a stale one.
                _spec(pod).pop("priority", None)
            context.note(f"set {field_name}: {value}")
        elif current != value:
            context.note(f"kept the pod's {field_name}: {current} instead of the policy's {value}")


def annotate_policy(pod: Pod, context: StepContext) -> None:
    annotations = _child(_child(pod, "metadata"), "annotations")
    annotations[names.POLICY_ANNOTATION] = str(context.ref)


STEPS: tuple[Step, ...] = (
    inject_gpu_requests,
    add_tolerations,
    add_required_node_affinity,
    add_placement_preferences,
    add_topology_affinity,
    set_scheduling_fields,
    annotate_policy,
)
