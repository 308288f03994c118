"""The mutation steps that steer a pod by preference: placement terms and job co-location. Pure.

Preferred node affinity on the balancer's labels (``pack``, ``spread``, ``avoidCongested``, and
product relief from the GPUInventory's type pressure) and pod affinity for one job on one topology
domain: a stale label only tilts the score, it never strands a pod.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from webhook import names
from webhook.admission import affinity
from webhook.admission.desiredpod import Pod, StepContext, child, spec_of
from webhook.kube import affinity as kube_affinity
from webhook.kube import pods, units
from webhook.kube.inventory import EMPTY, MAX_AGE_SECONDS, Inventory
from webhook.policy.model import GPUPolicy

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


def whole_gpus_asked(pod: Pod) -> int:
    """Whole GPUs the regular containers ask for (0 for shared or MIG pods): what a pack term must fit."""
    total = 0
    for container in pods.long_running_containers(pod):
        total += sum(pods.gpu_count(container, r) or 0 for r in pods.gpu_resources(container) if units.is_plugin_gpu(r))
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
        # A policy naming products pins the pod to them: by required node affinity for a device-plugin
        # ask, by its claims' selectors for a DRA one; either way it is not free to run on any.
        relieved = () if policy.gpu.products else pressured_products(pod, inventory, now)
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
    node_affinity = child(child(spec_of(pod), "affinity"), "nodeAffinity")
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
    child(child(spec_of(pod), "affinity"), "podAffinity")[key] = list(existing) + [term]
    context.note(f"{topology.mode} co-location of job {label}={value} on {topology.key}")
