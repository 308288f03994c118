"""Compute the pod a GPUPolicy prescribes, then the JSON patch to get there. Pure: no I/O.

The desired pod (``desiredpod``) is built by small steps in a declared order (``STEPS``, from
``requeststeps``, ``schedulingsteps`` and ``preferences``); the patch is always derived by
comparing the two documents (``webhook.admission.patches``), never written by hand, so parents are
created and ``/`` in keys is escaped. Every step keeps what the user set and says so in a warning,
and a step that finds its work already done changes nothing, so mutating the output again yields
an empty patch. The result is a typed ``results.Mutation``.
"""

from __future__ import annotations

from datetime import datetime

from webhook import names
from webhook.admission import patches
from webhook.admission.desiredpod import Pod, Step, StepContext, check_field_types, child, working_copy
from webhook.admission.preferences import add_placement_preferences, add_topology_affinity
from webhook.admission.requeststeps import inject_gpu_requests, right_size
from webhook.admission.results import Mutation
from webhook.admission.schedulingsteps import add_required_node_affinity, add_tolerations, set_scheduling_fields
from webhook.kube import demand as kube_demand
from webhook.kube import pods, units
from webhook.kube.inventory import EMPTY, Inventory
from webhook.policy import PolicySet, matching
from webhook.policy.model import GPUPolicy, PolicyRef


def governed_classes(policies: PolicySet, classes: units.DeviceClasses = units.ASSUMED) -> frozenset[str]:
    """The NVIDIA DeviceClasses, every class a policy of the set lists, and every known class that
    can select NVIDIA GPUs (``policy.matching.gpu_names``): asks of these are GPU asks."""
    return matching.gpu_names(policies, classes).governed


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
           now: datetime | None = None, resolved: kube_demand.Resolved | None = None,
           classes: units.DeviceClasses = units.ASSUMED) -> Mutation:
    """The desired pod and patch under the policy that applies to ``pod`` in ``namespace``.

    ``inventory`` is what the cluster offers (the balancer's GPUInventory) and ``now`` the time to
    judge its age by (None: taken as fresh); both only refine choices, never cause a denial.
    ``resolved`` holds the ResourceClaims and templates the pod references that the caller read
    (``claim_devices``): a pod asking GPUs through them is shaped as a GPU pod. ``classes`` are the
    cluster's DeviceClasses: a pod asking one's DRA extended-resource name is a GPU pod.
    """
    gpus = matching.gpu_names(policies, classes)
    requested = kube_demand.gpu_resource_names(pod, gpus)
    through_claims = claim_devices(pod, policies, resolved)
    gpu_pod = bool(requested) or pods.labels_ask_for_gpus(pod) or through_claims is not None
    policy = matching.select(policies, pod, namespace=namespace, asks_for_gpus=gpu_pod)
    if policy is None:
        return Mutation(desired=pod, patch=(), policy=None)
    if gpu_pod and any(denier.mode == "enforce" for denier, _ in matching.applicable_denies(policies, pod, namespace)):
        # Validation denies this pod whatever is injected: shaping it would only add warnings
        # ("set nvidia.com/gpu: 4") before the denial, which the author should read alone.
        return Mutation(desired=pod, patch=(), policy=PolicyRef(policy.name, policies.revision))
    unreadable = pods.count_problems(pod) if requested else []
    if unreadable and policy.mode == "enforce":
        # Validation denies a count that is not whole whatever is injected: say that alone.
        ref = PolicyRef(policy.name, policies.revision)
        return Mutation(desired=pod, patch=(), policy=ref, denials=tuple(
            f"{problem} (policy {ref}); GPUs are counted in whole devices" for problem in unreadable))
    refs = kube_demand.claim_refs(pod)
    unread = any(ref.key is not None and ref.key not in (resolved or {}) for ref in refs)
    desired, context = _settle(pod, policy, namespace, policies, inventory, now, requested=requested, gpu_pod=gpu_pod,
                               claim_devices=through_claims, claims_unread=unread, gpus=gpus)
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


class PolicyLoopError(RuntimeError):
    """Mutation switched policies more often than there are policies: a bug, never a user's error."""


def _settle(pod: Pod, policy: GPUPolicy, namespace: str, policies: PolicySet,
            inventory: Inventory, now: datetime | None, *, requested: frozenset[str],
            gpu_pod: bool, claim_devices: int | None = None, claims_unread: bool = False,
            gpus: units.GpuNames | None = None) -> tuple[Pod, StepContext]:
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
    check_field_types(pod)
    carried: list[str] = []
    given: Pod | None = None
    for _ in range(len(policies.policies) + 1):
        desired = working_copy(pod)
        context = StepContext(policy=policy, ref=PolicyRef(policy.name, policies.revision), namespace=namespace,
                              inventory=inventory, now=now, claim_devices=claim_devices, claims_unread=claims_unread,
                              gpus=gpus or units.GpuNames(), _requested=requested)
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
                if units.is_gpu_resource(resource) and resource not in pods.resource_section(ours, section):
                    ours = context.set_request(target, ours, section, resource, value)


def annotate_policy(pod: Pod, context: StepContext) -> None:
    """Name the policy (and revision) that shaped the pod, for people and for ``gpugate smoke``."""
    annotations = child(child(pod, "metadata"), "annotations")
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
