"""The mutation steps that write a pod's GPU requests: the count the policy gives, and right-sizing. Pure.

``inject_gpu_requests`` puts the ``gpugate.io/gpus`` label's count (or the policy's default) of the
policy's resource on one container; ``right_size`` gives a pod that says how much GPU memory it
needs the smallest rung of the policy's ladder, as a resource or, through DRA, as a claim.
"""

from __future__ import annotations

from typing import Any

from webhook import names
from webhook.admission import rightsizedtemplate, rightsizing
from webhook.admission.desiredpod import Pod, StepContext, child
from webhook.admission.schedulingsteps import require
from webhook.kube import demand as kube_demand
from webhook.kube import pods, rightsizedclaims
from webhook.kube.quantity import count_problem, out_of_range, whole_count
from webhook.policy.model import GPUPolicy

MAX_GPUS_PER_POD = 64
"""No node offers more GPUs than this (8 on HGX and DGX systems; an NVL72 rack's 72 are never one
node), so a gpus label asking more is a typo such as "1k": it is refused, not injected."""


def requested_gpu_count(pod: Pod, policy: GPUPolicy, context: StepContext | None = None) -> int | None:
    """How many of the policy's resource the pod asks for through the label or the default."""
    label = pods.labels(pod).get(names.GPUS_LABEL)
    if label is None:
        if not policy.match.gpu_only and policy.gpu.default and not pods.named_gpu_resources(pod):
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
            else:  # refused here, not shaped first: the author reads the one reason alone
                context.deny(f"label {names.GPUS_LABEL}={label!r} {count_problem(label)}; write a count such "
                             f"as {names.GPUS_LABEL}: \"1\"")
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
    already |= context.dra_named(pod)
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


def right_size(pod: Pod, context: StepContext) -> None:
    """A pod that says how much GPU it needs gets the smallest rung of the policy's ladder that gives it."""
    sizing = context.policy.rightsizing
    if sizing is None:
        return
    try:
        ask = kube_demand.size_of(pod)
    except kube_demand.SizeError as err:
        context.deny(str(err))  # validation refuses it too: the reason alone, not shaped first
        return
    if ask is None:
        return
    if context.claim_devices is not None:
        context.note(f"the pod holds GPUs through its ResourceClaims: {ask.describe()} is not right-sized")
        return
    own = set().union(*(pods.gpu_resources(c) for c in pods.long_running_containers(pod)))
    if own or context.dra_named(pod):
        return  # the pod (or a previous pass) chose its GPU; validation judges it against the ladder
    if names.GPUS_LABEL in pods.labels(pod):
        context.note(f"{names.GPUS_LABEL} is given: {ask.describe()} is not right-sized")
        return
    if sizing.through == "dra":
        right_size_claim(pod, ask, context)
        return
    choice = rightsizing.choose(ask, sizing, context.inventory, context.now, own_resource=context.policy.gpu.resource)
    container = _sized_container(pod, choice, context)
    if container is None or isinstance(choice, str):
        return
    container = context.set_request(pod, container, "requests", choice.resource, "1")
    context.set_request(pod, container, "limits", choice.resource, "1")
    require(pod, list(choice.expressions), context)
    form = f" ({choice.rung.name})" if choice.rung.mig and choice.rung.mig not in choice.resource else ""
    context.note(f"gave {choice.resource}: 1{form} to container '{container.get('name')}' for "
                 f"{ask.describe()}: {choice.why}")


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
    made = rightsizedtemplate.expected(pod, context.policy)
    if made is None:
        return
    container = _sized_container(pod, made, context)
    if container is None or isinstance(made, str):
        return
    container = context.own(pod, container)
    resources = child(container, "resources", dict)
    resources["claims"] = [*(resources.get("claims") or ()), {"name": names.RIGHTSIZED_CLAIM}]
    spec = pods.spec(pod)
    rightsizedclaims.add_reference(spec, made.name)
    meta = child(pod, "metadata", dict)
    meta["labels"] = {**(meta.get("labels") or {}), names.CLAIM_TEMPLATE_LABEL: made.name}
    annotations = child(meta, "annotations", dict)
    annotations[names.CLAIM_TEMPLATE_ANNOTATION] = rightsizedclaims.encode(made.template)
    context.note(f"right-sized {ask.describe()} to ResourceClaimTemplate {made.name} (claim "
                 f"'{names.RIGHTSIZED_CLAIM}' on container '{container.get('name')}'): {made.why}")


def _sized_container(pod: Pod, sized: object, context: StepContext) -> dict[str, Any] | None:
    """The container a right-sized ask goes on; None when ``sized`` is a denial (the pod is refused
    with it) or the pod has no such container."""
    if isinstance(sized, str):
        context.deny(f"pod '{pods.display_name(pod)}' {sized}")
        return None
    return target_container(pod, context)
