"""Verdicts on a pod as it will be stored: what no policy allows is denied, with a fix. Pure.

Runs on the validating endpoint after every mutating webhook, so it sees the final pod. Each
reason names the container, the resource, the policy and what to do instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from webhook import names
from webhook.admission import affinity, rightsizedtemplate, rightsizing
from webhook.admission.results import Verdict
from webhook.kube import demand as kube_demand
from webhook.kube import pods, units
from webhook.kube.inventory import EMPTY, Inventory
from webhook.kube.quantity import count_problem, out_of_range, whole_count
from webhook.policy import PolicySet, matching
from webhook.policy.model import GPUPolicy, PolicyRef


@dataclass(frozen=True, slots=True)
class _Asks:
    """The pod's GPU asks, read once per validation: every GPU resource each container names,
    in every name form (``kube.demand.gpu_asks``).

    Every rule below reads these instead of walking the containers' resources again (validation
    once read them a dozen times per pod and cost more than decoding the request)."""

    asks: tuple[kube_demand.ContainerAsk, ...]
    requested: frozenset[str]
    asks_for_gpus: bool
    gpus: units.GpuNames

    @classmethod
    def of(cls, pod: pods.Pod, gpus: units.GpuNames) -> _Asks:
        found = kube_demand.gpu_asks(pod, gpus)
        requested = frozenset(a.resource for a in found)
        # "0" asks for none: only when a count reads 0 are the containers walked again for its other section.
        asked = bool(found) and (all(a.count != 0 for a in found) or bool(kube_demand.gpu_resource_names(pod, gpus)))
        return cls(found, requested, asked or pods.labels_ask_for_gpus(pod), gpus)


def validate(pod: pods.Pod, *, namespace: str, policies: PolicySet, inventory: Inventory = EMPTY,
             now: datetime | None = None, classes: units.DeviceClasses = units.ASSUMED) -> Verdict:
    """Deny rules and the selected policy's limits bind every pod: the opt-out label skips shaping,
    never the rules (a label a pod author writes must not unlock GPUs). Audit turns a policy's
    denials into warnings without hiding another policy's enforced deny. ``classes`` are the
    cluster's DeviceClasses: a DRA extended-resource name of one that can hold GPUs is a GPU ask."""
    asks = _Asks.of(pod, matching.gpu_names(policies, classes))
    denials, warnings = _deny_rules(pod, namespace, policies, asks)
    policy = matching.select(policies, pod, namespace=namespace, honor_skip=False, asks_for_gpus=asks.asks_for_gpus)
    ref = PolicyRef(policy.name, policies.revision) if policy else None
    if policy is not None:
        own = _policy_rules(pod, policy, ref, asks) + _rightsizing_rules(pod, policy, ref, inventory, now) \
            + rightsizedtemplate.rules(pod, policy, ref)
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
    """Which containers ask for which GPU resources, or the gpus label when none does yet."""
    by_container: dict[tuple[str, str], list[str]] = {}
    for ask in asks.asks:
        by_container.setdefault((ask.kind, ask.container), []).append(ask.resource)
    asked = [f"{kind} '{name}' asks {', '.join(resources)}" for (kind, name), resources in by_container.items()]
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
    containers = {(kind, str(c.get("name"))): c for kind, c in pods.all_containers(pod)}
    for ask in asks.asks:
        out.extend(_container_rules(ask, containers.get((ask.kind, ask.container), {}), policy, ref))
    if asks.requested:
        out.extend(_node_requirement_rules(pod, policy, ref))
    out.extend(_max_rule(pod, policy, ref, asks))
    return out


def _max_rule(pod: pods.Pod, policy: GPUPolicy, ref: PolicyRef | None, asks: _Asks) -> list[str]:
    """``max`` in GPU units over every GPU the pod's containers ask, whatever the name: whole GPUs,
    MIG slices and slots as their share of a GPU (``kube.units``), by Kubernetes' rule for init
    containers and sidecars. A container over the limit by itself is named by the container rules."""
    limit = policy.gpu.max
    if limit is None or not asks.asks:
        return []
    total = kube_demand.gpu_units(pod, asks.gpus)
    if total <= limit or any(a.amount > limit for a in asks.asks):
        return []
    return [f"pod '{pods.display_name(pod)}' asks {units.describe(total)} GPUs in all ({counted(asks.asks)}); "
            f"policy {ref} allows {limit} per pod. Ask for {limit} or fewer in total, or split the job into "
            f"several pods"]


def counted(asks: tuple[kube_demand.ContainerAsk, ...]) -> str:
    """What ``max`` counted of a pod's containers, for a message: each ask in GPU units, and the
    rule for init containers when the pod has any."""
    text = "; ".join(a.describe() for a in asks)
    if any(a.kind == "initContainer" for a in asks):
        text += "; sidecars add to the other containers, an init container runs beside the sidecars before it"
    return text


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
            if units.is_plugin_gpu(resource) and _only_single_strategy_nodes(pod):
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


def allowed_classes(policy: GPUPolicy) -> frozenset[str]:
    """``spec.claims.deviceClasses``, or the classes ``spec.gpu``'s resources map to: whole or shared
    GPUs -> ``gpu.nvidia.com``, a MIG resource -> ``mig.nvidia.com``."""
    if policy.claims.device_classes is not None:
        return frozenset(policy.claims.device_classes)
    kinds = (units.kind_of(r) for r in allowed_resources(policy))
    return frozenset(k.dra_class for k in kinds if k is not None and k.dra_class is not None)


def _allowed(ask: kube_demand.ContainerAsk, policy: GPUPolicy, ref: PolicyRef | None) -> str | None:
    """Why the policy does not allow the resource ``ask`` names, or None when it does: a device
    plugin name by ``allowedResources``, a DRA extended-resource name by the class it is served through."""
    where = f"{ask.kind} '{ask.container}'"
    resource = ask.resource
    if ask.name.device_class is None:
        if resource in allowed_resources(policy):
            return None
        allowed = ", ".join(sorted(allowed_resources(policy)))
        return (f"{where} asks {resource}, which policy {ref} does not allow; ask for {allowed} instead, "
                f"or use a profile whose policy offers {resource}")
    offered = ", ".join(sorted(allowed_resources(policy)))
    if not ask.name.known:
        return (f"{where} asks {resource}, the extended resource of DeviceClass {ask.name.device_class}, which "
                f"gpugate does not know (not in the cluster, or not read yet), so it is judged as a GPU ask that "
                f"policy {ref} does not allow; ask for {offered} instead")
    if ask.name.device_class in allowed_classes(policy):
        return None
    return (f"{where} asks {resource}, devices of DeviceClass {ask.name.device_class}, which policy {ref} does not "
            f"allow; ask for {offered} instead, or use a profile whose policy offers that class")


def _container_rules(ask: kube_demand.ContainerAsk, container: pods.Container, policy: GPUPolicy,
                     ref: PolicyRef | None) -> list[str]:
    out = []
    where = f"{ask.kind} '{ask.container}'"
    resource = ask.resource
    requests = pods.resource_section(container, "requests").get(resource)
    limits = pods.resource_section(container, "limits").get(resource)
    refused = _allowed(ask, policy, ref)
    if refused is not None:
        return [refused]
    count = ask.count
    if count is None:
        value = limits if limits is not None else requests
        out.append(f"{where} asks {resource}: {value}, which {count_problem(value)} (policy {ref}); GPUs are "
                   f"counted in whole devices")
        return out
    if requests is not None and limits is not None and whole_count(requests) != whole_count(limits):
        out.append(f"{where} asks {resource} requests {requests} but limits {limits} (policy {ref}); "
                   f"set requests equal to limits")
    limit = policy.gpu.max
    if limit is not None and ask.amount > limit:
        held = "" if ask.name.share == 1 else f" ({units.describe(ask.amount)} GPUs)"
        out.append(f"{where} asks {resource}: {count}{held}; policy {ref} allows {limit}. "
                   f"Ask for {limit} or fewer, or use a profile whose policy allows more")
    if resource.endswith(".shared") and count > 1 and policy.gpu.fail_requests_greater_than_one:
        out.append(f"{where} asks {resource}: {count}; policy {ref} allows one shared GPU per container "
                   f"(time-sliced replicas share one GPU, so more adds no compute). Ask for 1, or for "
                   f"{names.GPU_RESOURCE} if you need whole GPUs")
    return out
