"""Verdicts on a pod as it will be stored: what no policy allows is denied, with a fix. Pure.

Runs on the validating endpoint after every mutating webhook, so it sees the final pod. Each
reason names the container, the resource, the policy and what to do instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from webhook import names
from webhook.admission import affinity, rightsizing
from webhook.admission.results import Verdict
from webhook.kube import demand as kube_demand
from webhook.kube import pods
from webhook.kube.inventory import EMPTY, Inventory
from webhook.kube.quantity import QuantityError, count_problem, out_of_range, whole_count
from webhook.policy import PolicySet, matching
from webhook.policy.model import GPUPolicy, PolicyRef


@dataclass(frozen=True, slots=True)
class _Asks:
    """The pod's GPU asks, read once per validation: each container with the GPU resources it names.

    Every rule below reads these instead of walking the containers' resources again (once
    validation read them a dozen times per pod and cost more than decoding the request)."""

    containers: tuple[tuple[str, pods.Container, frozenset[str]], ...]
    requested: frozenset[str]
    asks_for_gpus: bool

    @classmethod
    def of(cls, pod: pods.Pod) -> _Asks:
        found = tuple((kind, c, frozenset(pods.gpu_resources(c))) for kind, c in pods.all_containers(pod))
        requested = frozenset().union(*(resources for _, _, resources in found))
        asked = bool(requested) and bool(pods.requested_gpu_resources(pod))  # "0" asks for none
        return cls(found, requested, asked or pods.labels_ask_for_gpus(pod))


def validate(pod: pods.Pod, *, namespace: str, policies: PolicySet, inventory: Inventory = EMPTY,
             now: datetime | None = None) -> Verdict:
    """Deny rules and the selected policy's limits bind every pod: the opt-out label skips shaping,
    never the rules (a label a pod author writes must not unlock GPUs). Audit turns a policy's
    denials into warnings without hiding another policy's enforced deny."""
    asks = _Asks.of(pod)
    denials, warnings = _deny_rules(pod, namespace, policies, asks)
    policy = matching.select(policies, pod, namespace=namespace, honor_skip=False, asks_for_gpus=asks.asks_for_gpus)
    ref = PolicyRef(policy.name, policies.revision) if policy else None
    if policy is not None:
        own = _policy_rules(pod, policy, ref, asks) + _rightsizing_rules(pod, policy, ref, inventory, now)
        if policy.mode == "audit":
            warnings += [f"audit: would deny: {r}" for r in own]
        else:
            denials += own
    return Verdict(allowed=not denials, reasons=tuple(denials), policy=ref, warnings=tuple(warnings))


def _deny_rules(pod: pods.Pod, namespace: str, policies: PolicySet, asks: _Asks) -> tuple[list[str], list[str]]:
    """Deny rules of every policy whose namespaces and podSelector match: a deny is never hidden
    by priority, and a rule written in a profile's policy binds that profile's pods only.

    Returns (denials from enforcing policies, warnings from audit ones).
    """
    if not asks.asks_for_gpus:
        return [], []
    where = f"pod '{pods.display_name(pod)}' in namespace '{namespace}'"
    return deny_rule_reasons(pod, namespace, policies, lambda: f"{where}: {_what_is_asked(asks)}")


def deny_rule_reasons(subject: pods.Pod, namespace: str, policies: PolicySet,
                      what: Callable[[], str]) -> tuple[list[str], list[str]]:
    """The deny rules of every policy whose namespaces and podSelector match ``subject`` (a pod, or
    what matching reads of a DRA claim), each as "<what>; <message> (policy NAME@REVISION)".

    Returns (denials from enforcing policies, warnings from audit ones). ``what`` is called only
    when a rule applies.
    """
    denials: list[str] = []
    warnings: list[str] = []
    for policy, rule in matching.applicable_denies(policies, subject, namespace):
        reason = f"{what()}; {rule.message} (policy {policy.name}@{policies.revision})"
        if policy.mode == "audit":
            warnings.append(f"audit: would deny: {reason}")
        else:
            denials.append(reason)
    return denials, warnings


def _what_is_asked(asks: _Asks) -> str:
    """Which containers ask for which NVIDIA resources, or the gpus label when none does yet."""
    asked = [f"{kind} '{c.get('name')}' asks {', '.join(sorted(resources))}"
             for kind, c, resources in asks.containers if resources]
    return "; ".join(asked) or f"it asks for GPUs with label {names.GPUS_LABEL}"


def _policy_rules(pod: pods.Pod, policy: GPUPolicy, ref: PolicyRef | None, asks: _Asks) -> list[str]:
    out: list[str] = []
    label = pods.labels(pod).get(names.GPUS_LABEL)
    if label not in (None, "") and whole_count(label) is None:
        if out_of_range(label):
            out.append(f"label {names.GPUS_LABEL}={label!r} asks for more GPUs than any node has (policy {ref}); "
                       f"write a count such as {names.GPUS_LABEL}: \"1\"")
        else:
            out.append(f"label {names.GPUS_LABEL}={label!r} {count_problem(label)} (policy {ref}); "
                       f"write e.g. {names.GPUS_LABEL}: \"1\"")
    wanted = pods.annotations_of(pod).get(names.CONTAINER_ANNOTATION)
    if wanted and all(c.get("name") != wanted for c in pods.containers(pod)):
        out.append(f"annotation {names.CONTAINER_ANNOTATION}={wanted!r} names no regular container of pod "
                   f"'{pods.display_name(pod)}' (policy {ref}); name one of "
                   f"{', '.join(repr(c.get('name')) for c in pods.containers(pod))}")
    for kind, container, resources in asks.containers:
        name = container.get("name")
        for resource in sorted(resources):
            out.extend(_container_rules(kind, name, container, resource, policy, ref))
    if asks.requested:
        out.extend(_node_requirement_rules(pod, policy, ref))
    limit = policy.gpu.max
    resource = policy.gpu.resource
    if limit is None or resource not in asks.requested:
        return out
    total = pod_total(pod, resource)
    one_over = any((pods.gpu_count(c, resource) or 0) > limit for _, c, named in asks.containers if resource in named)
    if total > limit and not one_over:  # a container over the limit is named already
        out.append(f"pod '{pods.display_name(pod)}' asks {resource}: {total} across its containers (sidecars "
                   f"add to the others; an init container runs beside the sidecars before it); policy {ref} "
                   f"allows {limit} per pod. Ask for {limit} or fewer in total, or split the job into several pods")
    return out


def _node_requirement_rules(pod: pods.Pod, policy: GPUPolicy, ref: PolicyRef | None) -> list[str]:
    """The policy's GPU-model and memory requirements must hold whichever node selector term applies
    (to a pod that requests a GPU resource: the caller checks)."""
    out = []
    for expression in affinity.required_expressions(policy, limits_only=True):
        escapes = affinity.unmet(pods.spec(pod), expression)
        if escapes:
            out.append(f"pod '{pods.display_name(pod)}' may run on nodes outside {affinity.describe(expression)} "
                       f"({', '.join(escapes)}); policy {ref} requires it on every node the pod can use. "
                       f"Remove the conflicting node selection, or add the requirement to each "
                       f"nodeSelectorTerm (terms are ORed)")
    return out


def allowed_resources(policy: GPUPolicy) -> frozenset[str]:
    """The policy's resource, its allowedResources, and every resource its right-sizing ladder gives."""
    if policy.rightsizing is None:
        return policy.gpu.allowed
    return policy.gpu.allowed | rightsizing.resources_of(policy.rightsizing)


def _rightsizing_rules(pod: pods.Pod, policy: GPUPolicy, ref: PolicyRef | None, inventory: Inventory,
                       now: datetime | None) -> list[str]:
    """A right-sizing ask is judged by the same ladder as mutation uses, whoever chose the resource."""
    try:
        ask = kube_demand.size_of(pod)
    except kube_demand.SizeError as err:
        return [f"{err} (policy {ref})"]
    sizing = policy.rightsizing
    if ask is None or sizing is None:
        return []
    if not any(rightsizing.fits(rung, ask) for rung in sizing.ladder):
        choice = rightsizing.choose(ask, sizing, inventory, now)
        return [f"pod '{pods.display_name(pod)}' {choice} (policy {ref})"] if isinstance(choice, str) else []
    out = []
    for container in pods.long_running_containers(pod):
        for resource in sorted(pods.gpu_resources(container)):
            if resource == names.GPU_RESOURCE and _only_single_strategy_nodes(pod):
                continue  # a single-strategy MIG slice, chosen by its memory affinity: not the whole-GPU rung
            rung = rightsizing.rung_of(resource, sizing)
            if rung is None:
                continue  # not a ladder resource (judged by the allowed-resources rule)
            where = f"container '{container.get('name')}' asks {resource}"
            if not rightsizing.fits(rung, ask):
                out.append(f"{where}, which gives less than {ask.describe()} (policy {ref}); drop the resource "
                           f"and let gpugate choose, or ask for a larger one")
                continue
            if not inventory.fresh(now, sizing.max_inventory_age_seconds):
                continue  # without a fresh inventory a larger rung is never refused
            for smaller in sizing.ladder[:sizing.ladder.index(rung)]:
                if rightsizing.fits(smaller, ask) and rightsizing.offered_form(smaller, ask, inventory):
                    out.append(f"{where} for {ask.describe()}, but {smaller.name} also fits and is free now "
                               f"(policy {ref}); ask for it, or drop the resource and let gpugate choose")
                    break
    return out


def _only_single_strategy_nodes(pod: pods.Pod) -> bool:
    """The pod can only run where nvidia.com/gpu is a MIG slice (single strategy), whichever term applies."""
    wanted = {"key": names.NVIDIA_MIG_STRATEGY_LABEL, "operator": "In", "values": ["single"]}
    return not affinity.unmet(pods.spec(pod), wanted)


def pod_total(pod: pods.Pod, resource: str) -> int:
    """What the pod holds of ``resource`` on its node: Kubernetes' effective request, as the balancer
    and the replay count it (0 when a quantity is not a whole number: the container rules say so)."""
    try:
        return kube_demand.gpu_requests(pod).get(resource, 0)
    except QuantityError:
        return 0


def _container_rules(kind: str, name: object, container: pods.Container, resource: str,
                     policy: GPUPolicy, ref: PolicyRef | None) -> list[str]:
    out = []
    where = f"{kind} '{name}'"
    requests = pods.resource_section(container, "requests").get(resource)
    limits = pods.resource_section(container, "limits").get(resource)
    count = pods.gpu_count(container, resource)
    if resource not in allowed_resources(policy):
        allowed = ", ".join(sorted(allowed_resources(policy)))
        out.append(f"{where} asks {resource}, which policy {ref} does not allow; ask for {allowed} instead, "
                   f"or use a profile whose policy offers {resource}")
        return out
    if count is None:
        value = limits if limits is not None else requests
        out.append(f"{where} asks {resource}: {value}, which {count_problem(value)} (policy {ref}); GPUs are "
                   f"counted in whole devices")
        return out
    if requests is not None and limits is not None and whole_count(requests) != whole_count(limits):
        out.append(f"{where} asks {resource} requests {requests} but limits {limits} (policy {ref}); "
                   f"set requests equal to limits")
    if policy.gpu.max is not None and count > policy.gpu.max:
        out.append(f"{where} asks {resource}: {count}; policy {ref} allows {policy.gpu.max}. "
                   f"Ask for {policy.gpu.max} or fewer, or use a profile whose policy allows more")
    if resource.endswith(".shared") and count > 1 and policy.gpu.fail_requests_greater_than_one:
        out.append(f"{where} asks {resource}: {count}; policy {ref} allows one shared GPU per container "
                   f"(time-sliced replicas share one GPU, so more adds no compute). Ask for 1, or for "
                   f"{names.GPU_RESOURCE} if you need whole GPUs")
    return out
