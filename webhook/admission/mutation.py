"""Compute the pod a GPUPolicy prescribes, then the JSON patch to get there. Pure: no I/O.

The desired pod is built by small steps in a declared order (``STEPS``); the patch is always
derived by comparing the two documents (``webhook.admission.patches``), never written by hand, so
parents are created and ``/`` in keys is escaped.
Every step keeps what the user set and says so in a warning, and a step that finds its work
already done changes nothing, so mutating the output again yields an empty patch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from webhook import names
from webhook.admission import affinity, claimladder, patches, rightsizing
from webhook.admission.results import Mutation
from webhook.errors import InputError
from webhook.kube import affinity as kube_affinity
from webhook.kube import claims, pods, resources, rightsizedclaims
from webhook.kube import demand as kube_demand
from webhook.kube.inventory import EMPTY, MAX_AGE_SECONDS, Inventory
from webhook.kube.quantity import out_of_range, whole_count
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
# pack, for a GPU pod not pinned to a GPU product: prefer products that pinned pods need less, as
# the balancer's GPUInventory says (typePressure). Weight 100, as much as the whole pack ladder:
# an empty node of an unpressured product (pack 10 + 100) beats an empty 2-GPU node of a pressured
# one (pack 60), while among nodes of unpressured products the pack ladder still decides.
# Measured (docs/placement.md): without it, packing drains the small nodes of the product that
# pinned pods need (openb gpuspec lists: 6 points below the stock scheduler); with it, above.
PRODUCT_RELIEF_WEIGHT = 100
PRESSURE_AT_LEAST = 0.25
"""Type pressure from which a product is left to the pods pinned to it (1.0: they alone would
take all of it): a quarter of its supply. Chosen over 0.5 on the openb gpuspec lists, the only
ones with pins (gpuspec10, 42-44 medians with packed shares: 94.03 against 91.50), checked on
all five (docs/placement.md)."""


MAX_GPUS_PER_POD = 64
"""No node offers more GPUs than this (8 on HGX and DGX systems; an NVL72 rack's 72 are never one
node), so a gpus label asking more is a typo such as "1k": it is refused, not injected."""


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
    claims_unread: bool = False
    """The pod references claims the caller did not read: they may hold GPUs (no default is added)."""
    """GPU devices the pod holds at most through the claims it references (``claim_devices``); None
    when it asks no GPU through a claim that was read."""
    _requested: frozenset[str] | None = None
    _owned: set[int] = field(default_factory=set)
    """ids of the desired pod's containers copied for writing (see ``set_request``)."""
    _injected: set[int] = field(default_factory=set)
    """ids of the required node-affinity expressions this pass added (see ``require``): not the pod's own."""

    def requested(self, pod: Pod) -> frozenset[str]:
        """The GPU resources the desired pod asks for, read once and reused by the later steps.

        Several steps ask, and reading every container each time was a tenth of a mutation.
        Requests are written only through ``set_request``, which forgets the answer.
        """
        if self._requested is None:
            self._requested = frozenset(pods.requested_gpu_resources(pod))
        return self._requested

    def set_request(self, pod: Pod, container: dict[str, Any], section: str, resource: str,
                    value: Any) -> dict[str, Any]:
        """Write one resource request or limit of the desired pod: the only way a step does.

        Containers are copied on their first write, not up front (``working_copy``): most pods
        get no request written, and a shared container is one the patch derivation skips at
        once. Returns the container written to, which the caller uses from then on.
        """
        if id(container) not in self._owned:
            container = _own_container(pod, container)
            self._owned.add(id(container))
        _resources(container, section)[resource] = value
        self._requested = None
        return container

    def note(self, message: str) -> None:
        self.warnings.append(f"gpugate {self.ref}: {message}")

    def deny(self, message: str) -> None:
        self.denials.append(f"{message} (policy {self.ref})")


Step = Callable[[Pod, StepContext], None]


def governed_classes(policies: PolicySet) -> frozenset[str]:
    """The NVIDIA DeviceClasses and every class a policy of the set lists: asks of these are GPU asks."""
    listed = {c for p in policies.policies for c in (p.claims.device_classes or ())}
    return frozenset(claims.NVIDIA_DEVICE_CLASSES) | listed


def claim_devices(pod: Pod, policies: PolicySet, resolved: kube_demand.Resolved | None) -> int | None:
    """GPU devices ``pod`` holds at most through the claims it references that ``resolved`` holds
    (asks of a governed class); None when none of them asks a GPU (or none could be read).

    A pod that asks GPUs only through claims (``spec.resourceClaims``, a claim or a template of
    ``gpu.nvidia.com``) is a GPU pod: it gets the policy's tolerations and placement terms as a
    pod asking ``nvidia.com/gpu`` does. An ``allocationMode: All`` ask counts 0 devices here.
    """
    if not resolved:
        return None
    governed = governed_classes(policies)
    held = kube_demand.claim_asks(kube_demand.claim_refs(pod), resolved, governed)
    if not held:
        return None
    return sum(ask.most_devices(governed) for _, ask in held)


def mutate(pod: Pod, *, namespace: str, policies: PolicySet, inventory: Inventory = EMPTY,
           now: datetime | None = None, resolved: kube_demand.Resolved | None = None) -> Mutation:
    """The desired pod and patch under the policy that applies to ``pod`` in ``namespace``.

    ``inventory`` is what the cluster offers (the balancer's GPUInventory) and ``now`` the time to
    judge its age by (None: taken as fresh); both only refine choices, never cause a denial.
    ``resolved`` holds the ResourceClaims and templates the pod references that the caller read
    (``claim_devices``): a pod asking GPUs through them is shaped as a GPU pod.
    """
    requested = frozenset(pods.requested_gpu_resources(pod))
    through_claims = claim_devices(pod, policies, resolved)
    gpu_pod = bool(requested) or pods.labels_ask_for_gpus(pod) or through_claims is not None
    policy = matching.select(policies, pod, namespace=namespace, asks_for_gpus=gpu_pod)
    if policy is None:
        return Mutation(desired=pod, patch=(), policy=None)
    if gpu_pod and any(denier.mode == "enforce" for denier, _ in matching.applicable_denies(policies, pod, namespace)):
        # Validation denies this pod whatever is injected: shaping it would only add warnings
        # ("set nvidia.com/gpu: 4") before the denial, which the author should read alone.
        return Mutation(desired=pod, patch=(), policy=PolicyRef(policy.name, policies.revision))
    refs = kube_demand.claim_refs(pod)
    unread = any(ref.key is not None and ref.key not in (resolved or {}) for ref in refs)
    desired, context = _shape(pod, policy, namespace, policies, inventory, now, requested=requested, gpu_pod=gpu_pod,
                              claim_devices=through_claims, claims_unread=unread)
    ref = context.ref
    policy = context.policy
    if policy.mode == "audit":
        patch = patches.make_patch(pod, desired)
        warnings = tuple(f"audit: {w}" for w in context.warnings)
        warnings += tuple(f"audit: would deny: {d}" for d in context.denials)
        if patch:
            warnings += (f"audit: gpugate {ref} would apply {len(patch)} patch operation(s); mode is audit",)
        return Mutation(desired=pod, patch=(), policy=ref, warnings=warnings, mode="audit")
    if context.denials:
        return Mutation(desired=pod, patch=(), policy=ref, warnings=tuple(context.warnings),
                        denials=tuple(context.denials))
    patch = patches.make_patch(pod, desired)
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


class PolicyLoopError(RuntimeError):
    """Mutation switched policies more often than there are policies: a bug, never a user's error."""


def _shape(pod: Pod, policy: GPUPolicy, namespace: str, policies: PolicySet,
           inventory: Inventory, now: datetime | None, *, requested: frozenset[str],
           gpu_pod: bool, claim_devices: int | None = None, claims_unread: bool = False
           ) -> tuple[Pod, StepContext]:
    """Run the steps, then again under whichever policy matches the shaped pod, until it is stable.

    A gpuOnly:false policy that injects a GPU can make a higher-priority gpuOnly policy match the
    result. The validating endpoint (and a reinvocation) see that result, so mutation converges on
    the policy that matches it. The switch starts again from the pod as it came, keeping only the
    GPUs the first policy gave it, so the result is what the policy it is annotated with
    prescribes and nothing of the other. Each switch goes to a higher priority, so there are at
    most as many as policies; more is a bug, reported as PolicyLoopError (Gatekeeper's way).
    ``requested`` and ``gpu_pod`` are what ``mutate`` read of ``pod``: the GPU resources it asks
    for, and whether it asks for GPUs at all (resources or labels).
    """
    check_shape(pod)
    carried: list[str] = []
    given: Pod | None = None
    for _ in range(len(policies.policies) + 1):
        desired = working_copy(pod)
        context = StepContext(policy=policy, ref=PolicyRef(policy.name, policies.revision), namespace=namespace,
                              inventory=inventory, now=now, claim_devices=claim_devices, claims_unread=claims_unread,
                              _requested=requested)
        if given is not None:
            _carry_gpu_requests(given, desired, context)
        for step in STEPS:
            step(desired, context)
        # Selection reads the namespace, the labels (no step writes them) and whether the pod asks
        # for GPUs: only a pod that did not, and now does, can match another policy.
        final = policy if gpu_pod else matching.select(policies, desired, namespace=namespace)
        if final is None or final is policy or final.priority <= policy.priority:
            context.warnings = carried + context.warnings
            return desired, context
        carried.append(f"gpugate: the pod as policy {policy.name} shapes it matches policy {final.name} "
                       f"(priority {final.priority}), which applies instead")
        given, policy = desired, final
    raise PolicyLoopError(f"mutation did not settle on a policy within {len(policies.policies) + 1} passes")


def _carry_gpu_requests(source: Pod, target: Pod, context: StepContext) -> None:
    """Copy the GPU requests a previous policy injected (container by container) into ``target``."""
    for theirs, ours in zip(pods.containers(source), pods.containers(target), strict=False):
        for section in ("requests", "limits"):
            for resource, value in pods.resource_section(theirs, section).items():
                if resources.is_gpu_resource(resource) and resource not in pods.resource_section(ours, section):
                    ours = context.set_request(target, ours, section, resource, value)


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
            if context is not None and context.claim_devices is not None:
                return None  # a claim holds its GPUs already
            if context is not None and context.claims_unread:
                context.note(f"the pod references ResourceClaims that were not read (gpugate serve "
                             f"--resolve-claims reads them); they may hold its GPUs, so the policy's default "
                             f"{policy.gpu.resource}: {policy.gpu.default} was not added")
                return None
            return policy.gpu.default
        return None
    if label == "":
        return policy.gpu.default or 1
    count = whole_count(label)
    if count is None:
        if context:
            if out_of_range(label):
                context.deny(f"label {names.GPUS_LABEL}={label!r} asks for more GPUs than any node has "
                             f"(at most {MAX_GPUS_PER_POD} per pod)")
            else:
                context.note(f"label {names.GPUS_LABEL}={label!r} is not a whole number; no GPU was added")
        return None
    limit = min(policy.gpu.max if policy.gpu.max is not None else MAX_GPUS_PER_POD, MAX_GPUS_PER_POD)
    if count > limit:
        if context:
            why = (f"policy {policy.name} allows {limit}" if policy.gpu.max is not None and count > policy.gpu.max
                   else f"no node has more than {MAX_GPUS_PER_POD}")
            context.deny(f"label {names.GPUS_LABEL}={label!r} asks for {count} GPUs; {why}. Ask for {limit} or fewer")
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
    if context.claim_devices is not None:
        context.note(f"the pod holds GPUs through its ResourceClaims; the {names.GPUS_LABEL} label added no "
                     f"{context.policy.gpu.resource}")
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
    container = context.set_request(pod, container, "requests", resource, str(count))
    context.set_request(pod, container, "limits", resource, str(count))
    context.note(f"set {resource}: {count} (requests = limits) on container '{container.get('name')}'")


def _match_requests_and_limits(pod: Pod, context: StepContext) -> None:
    """Fill a missing request or limit of an NVIDIA resource with its twin: same count, now explicit."""
    for _, container in pods.all_containers(pod):
        for resource in sorted(pods.gpu_resources(container)):
            requests = pods.resource_section(container, "requests")
            limits = pods.resource_section(container, "limits")
            if resource in limits and resource not in requests:
                container = context.set_request(pod, container, "requests", resource, limits[resource])
                context.note(f"set requests {resource}: {limits[resource]} to match limits on container "
                             f"'{container.get('name')}'")
            elif resource in requests and resource not in limits:
                container = context.set_request(pod, container, "limits", resource, requests[resource])
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


def wanted_tolerations(requested: frozenset[str], policy: GPUPolicy, *, through_claims: bool = False
                       ) -> list[dict[str, Any]]:
    """The tolerations the policy prescribes for a pod asking for the GPU resources ``requested``
    (``through_claims``: and for GPUs through ResourceClaims, which tolerates the GPU taint ``auto`` adds)."""
    if policy.tolerations == "none":
        return []
    if policy.tolerations == "auto":
        if not requested and not through_claims:
            return []
        keys = [names.GPU_TAINT_KEY] + sorted(r for r in requested if r != names.GPU_TAINT_KEY)
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
        _spec(pod)["tolerations"] = list(existing) + added
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
            required = _child(_child(_child(_spec(pod), "affinity"), "nodeAffinity"),
                              "requiredDuringSchedulingIgnoredDuringExecution")
            first = _copy(expression)
            required["nodeSelectorTerms"] = [{"matchExpressions": [first]}]
            context._injected.add(id(first))
            added.append(affinity.describe(expression))
            continue
        for index, term in enumerate(terms):
            if affinity.is_empty(term) or affinity.term_meets(term, expression):
                continue
            expressions = _child(term, "matchExpressions", list)
            same = [e for e in expressions if isinstance(e, dict) and e.get("key") == expression["key"]]
            ours = next((e for e in same if id(e) in context._injected), None)
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
            context._injected.add(id(appended))
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


def right_size(pod: Pod, context: StepContext) -> None:
    """A pod that says how much GPU it needs gets the smallest rung of the policy's ladder that gives it."""
    sizing = context.policy.rightsizing
    if sizing is None:
        return
    try:
        ask = kube_demand.size_of(pod)
    except kube_demand.SizeError as err:
        context.note(f"{err}; not right-sized")
        return
    if ask is None:
        return
    if context.claim_devices is not None:
        context.note(f"the pod holds GPUs through its ResourceClaims: {ask.describe()} is not right-sized")
        return
    own = set().union(*(pods.gpu_resources(c) for c in pods.long_running_containers(pod)))
    if own:
        return  # the pod (or a previous pass) chose its GPU; validation judges it against the ladder
    if names.GPUS_LABEL in pods.labels(pod):
        context.note(f"{names.GPUS_LABEL} is given: {ask.describe()} is not right-sized")
        return
    if sizing.through == "dra":
        right_size_claim(pod, ask, context)
        return
    choice = rightsizing.choose(ask, sizing, context.inventory, context.now)
    if isinstance(choice, str):
        context.deny(f"pod '{pods.display_name(pod)}' {choice}")
        return
    container = target_container(pod, context)
    if container is None:
        return
    container = context.set_request(pod, container, "requests", choice.resource, "1")
    context.set_request(pod, container, "limits", choice.resource, "1")
    require(pod, list(choice.expressions), context)
    form = f" ({choice.rung.name})" if choice.resource != choice.rung.name else ""
    context.note(f"right-sized {ask.describe()} to {choice.resource}: 1{form} on container "
                 f"'{container.get('name')}': {choice.why}")


def right_size_claim(pod: Pod, ask: kube_demand.Size, context: StepContext) -> None:
    """Right-sizing through DRA: the pod references the ladder's ResourceClaimTemplate (its name
    labelled, its content annotated, for the balancer to create it) and its container uses the claim.

    A pod that already references a claim of its own chose its devices: it is left as it is."""
    sizing = context.policy.rightsizing
    assert sizing is not None
    refs = kube_demand.claim_refs(pod)
    if any(ref.name == names.RIGHTSIZED_CLAIM for ref in refs):
        return  # a previous pass (reinvocation) did it
    if refs:
        context.note(f"the pod references claims of its own ({', '.join(r.name for r in refs)}): "
                     f"{ask.describe()} is not right-sized")
        return
    profile = pods.labels(pod).get(names.PROFILE_LABEL)
    made = claimladder.ladder(ask, sizing, selectors=claimladder.required_selectors(context.policy),
                              min_memory_mib=context.policy.gpu.min_memory_mib,
                              labels={names.PROFILE_LABEL: profile} if profile else None)
    if isinstance(made, str):
        context.deny(f"pod '{pods.display_name(pod)}' {made}")
        return
    container = target_container(pod, context)
    if container is None:
        return
    if id(container) not in context._owned:
        container = _own_container(pod, container)
        context._owned.add(id(container))
    resources = _child(container, "resources", dict)
    resources["claims"] = [*(resources.get("claims") or ()), {"name": names.RIGHTSIZED_CLAIM}]
    spec = pods.spec(pod)
    rightsizedclaims.add_reference(spec, made.name)
    meta = _child(pod, "metadata", dict)
    meta["labels"] = {**(meta.get("labels") or {}), names.CLAIM_TEMPLATE_LABEL: made.name}
    annotations = _child(meta, "annotations", dict)
    annotations[names.CLAIM_TEMPLATE_ANNOTATION] = rightsizedclaims.encode(made.template)
    context.note(f"right-sized {ask.describe()} to ResourceClaimTemplate {made.name} (claim "
                 f"'{names.RIGHTSIZED_CLAIM}' on container '{container.get('name')}'): {made.why}")


def _copy(expression: dict[str, Any]) -> dict[str, Any]:
    return {**expression, "values": list(expression.get("values") or ())}


def whole_gpus_asked(pod: Pod) -> int:
    """Whole GPUs the regular containers ask for (0 for shared or MIG pods): what a pack term must fit."""
    total = 0
    for container in pods.long_running_containers(pod):
        total += pods.gpu_count(container, names.GPU_RESOURCE) or 0
    return total


def preferred_terms(pod: Pod, requested: frozenset[str], policy: GPUPolicy, inventory: Inventory = EMPTY,
                    now: datetime | None = None, claim_devices: int | None = None) -> list[dict[str, Any]]:
    """The preferred node-affinity terms the policy's placement prescribes for ``pod``, which asks
    for the GPU resources ``requested`` and ``claim_devices`` GPUs through claims (None: none)."""
    placement = policy.placement
    terms: list[dict[str, Any]] = []
    if placement.strategy == "pack" and not requested and claim_devices is None:
        # A CPU pod (shaped by a gpuOnly:false policy): a node without GPUs first, else the GPU
        # node with the fewest free GPUs, so it stops taking the CPU an 8-GPU job needs on an empty node.
        terms.append(_term(CPU_POD_NO_GPU_WEIGHT, names.GPU_FREE_LABEL, "DoesNotExist", []))
        for step, weight in CPU_POD_PACK_TERMS:
            terms.append(_term(weight, names.GPU_FREE_LABEL, "Lt", [str(step)]))
    elif placement.strategy == "pack":
        n = whole_gpus_asked(pod) + (claim_devices or 0)  # gpugate.io/gpu-free counts DRA-held GPUs too
        for step, weight in PACK_TERMS:
            terms.append(_term(weight, names.GPU_FREE_LABEL, "Lt", [str(n + step)]))
        relieved = pressured_products(pod, inventory, now)
        if relieved:
            terms.append(_term(PRODUCT_RELIEF_WEIGHT, names.NVIDIA_PRODUCT_LABEL, "NotIn", list(relieved)))
    elif placement.strategy == "spread":
        terms.append(_term(SPREAD_IDLE_WEIGHT, names.GPU_LOAD_LABEL, "In", ["idle"]))
        terms.append(_term(SPREAD_NOT_CONGESTED_WEIGHT, names.GPU_LOAD_LABEL, "In", ["idle", "busy"]))
    if placement.avoid_congested == "preferred":
        terms.append(_term(AVOID_CONGESTED_WEIGHT, names.GPU_LOAD_LABEL, "NotIn", ["congested"]))
    return terms


def pressured_products(pod: Pod, inventory: Inventory, now: datetime | None) -> tuple[str, ...]:
    """The GPU products a pod free to run on any should stay off: those the pods pinned to a product
    need most (the fresh inventory's type pressure). None for a pod pinned itself, whatever to, or
    one that already states a preference about products (its author's, or ours from an earlier
    pass with another inventory: what is there is kept, so a second pass changes nothing)."""
    if not inventory.fresh(now, MAX_AGE_SECONDS):
        return ()
    spec = pods.spec(pod)
    if affinity.constrains(spec, names.NVIDIA_PRODUCT_LABEL) or affinity.prefers(spec, names.NVIDIA_PRODUCT_LABEL):
        return ()
    return inventory.pressured(PRESSURE_AT_LEAST)


def _term(weight: int, key: str, operator: str, values: list[str]) -> dict[str, Any]:
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expression["values"] = values
    return {"weight": weight, "preference": {"matchExpressions": [expression]}}


def add_placement_preferences(pod: Pod, context: StepContext) -> None:
    """Preferred node affinity on the balancer's labels: steer, never strand (a stale label only tilts).

    GPU pods always; CPU pods only under a gpuOnly:false policy, which asked to shape them.
    """
    requested = context.requested(pod)
    if not requested and context.claim_devices is None and context.policy.match.gpu_only:
        return
    wanted = preferred_terms(pod, requested, context.policy, context.inventory, context.now, context.claim_devices)
    if not wanted:
        return
    existing = kube_affinity.field(pods.spec(pod), kube_affinity.PREFERRED) or []
    added = [t for t in wanted if t not in existing]
    if not added:
        return
    node_affinity = _child(_child(_spec(pod), "affinity"), "nodeAffinity")
    node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = list(existing) + added
    context.note(f"prefer nodes for placement '{context.policy.placement.strategy}'"
                 + (" avoiding congested GPUs" if context.policy.placement.avoid_congested == "preferred" else "")
                 + "".join(f" away from {', '.join(products)}, which pods pinned to a GPU product need most"
                           for products in map(_relieved, added) if products))


def _relieved(term: dict[str, Any]) -> list[str]:
    """The products a preferred term of ours keeps the pod off (empty for any other term)."""
    [expression] = term["preference"]["matchExpressions"]
    return list(expression.get("values", ())) if expression["key"] == names.NVIDIA_PRODUCT_LABEL else []


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
            _spec(pod)[field_name] = value
            if field_name == "priorityClassName":
                # The Priority plugin filled spec.priority and spec.preemptionPolicy from the old
                # class. It runs again after a webhook changes the pod (reinvocation) and refuses
                # a value that differs from what the new class gives, so both go and it computes
                # them: removing only priority left a PreemptLowerPriority that a class with
                # preemptionPolicy Never then refused.
                _spec(pod).pop("priority", None)
                _spec(pod).pop("preemptionPolicy", None)
            context.note(f"set {field_name}: {value}")
        else:
            context.note(f"kept the pod's {field_name}: {current} instead of the policy's {value}")


def annotate_policy(pod: Pod, context: StepContext) -> None:
    annotations = _child(_child(pod, "metadata"), "annotations")
    annotations[names.POLICY_ANNOTATION] = str(context.ref)


STEPS: tuple[Step, ...] = (
    right_size,
    inject_gpu_requests,
    add_tolerations,
    add_required_node_affinity,
    add_placement_preferences,
    add_topology_affinity,
    set_scheduling_fields,
    annotate_policy,
)
