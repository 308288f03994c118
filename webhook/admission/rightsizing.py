"""From "I need 20 GiB of GPU memory" to the smallest GPU resource the cluster offers that gives it. Pure.

A pod says how much it needs with a label: ``gpugate.io/gpu-memory: 20Gi`` (a Kubernetes
quantity) and/or ``gpugate.io/gpu-fraction: "0.25"`` (a share of one GPU's compute). A policy's
``rightsizing.ladder`` lists what it may give, in the order it prefers (smallest first): MIG
profiles, time-sliced shares, whole GPUs. The first rung that gives enough memory and compute and
that the cluster offers now wins. "Offers now" comes from the balancer's inventory; without a
fresh one a whole GPU rung (what every GPU node offers) is preferred, else the ladder's order
decides; a missing inventory never denies a pod.

How each rung is asked for, as the NVIDIA device plugin advertises it:

- a MIG profile under the ``mixed`` strategy: ``nvidia.com/mig-<profile>`` (only nodes with such
  slices have it, so no affinity is needed);
- a MIG profile under the ``single`` strategy: ``nvidia.com/gpu`` on nodes labelled
  ``nvidia.com/mig.strategy=single`` whose slices (``nvidia.com/gpu.memory``) are large enough;
- a whole GPU: ``nvidia.com/gpu`` on nodes that are not single-strategy MIG nodes (there
  ``nvidia.com/gpu`` is a slice), with enough memory (``nvidia.com/gpu.memory``);
- a time-sliced share: ``nvidia.com/gpu.shared``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhook import names
from webhook.kube import units
from webhook.kube.demand import Size, human_bytes
from webhook.kube.inventory import Inventory, Offer
from webhook.policy.model import RightSizing, Rung

MIB = 2**20
Expression = dict[str, Any]


def fits(rung: Rung, ask: Size) -> bool:
    return ((ask.memory_bytes is None or rung.memory_bytes >= ask.memory_bytes)
            and (ask.fraction is None or rung.compute + 1e-9 >= ask.fraction))


@dataclass(frozen=True, slots=True)
class Choice:
    """The rung picked, how it is asked for, and why (the warning the pod's author reads)."""

    rung: Rung
    resource: str
    expressions: tuple[Expression, ...]
    why: str


def largest(ladder: tuple[Rung, ...]) -> Rung:
    return max(ladder, key=lambda r: (r.memory_bytes, r.compute))


def fitting_rungs(ask: Size, sizing: RightSizing) -> list[Rung] | str:
    """The rungs of the ladder large enough for ``ask``, smallest first; a str is the denial message
    when none is (the same words whether the pod is right-sized to a resource or to a claim)."""
    fitting = [rung for rung in sizing.ladder if fits(rung, ask)]
    if fitting:
        return fitting
    top = largest(sizing.ladder)
    return (f"asks {ask.describe()}; the largest the policy offers is {top.name} "
            f"({human_bytes(top.memory_bytes)}, {top.compute:.2g} of a GPU). Ask for less, or use a profile "
            f"whose policy offers more")


def choose(ask: Size, sizing: RightSizing, inventory: Inventory, now: datetime | None,
           own_resource: str | None = None) -> Choice | str:
    """The rung for ``ask``; a str is the denial message when no rung of the ladder is large enough.

    ``own_resource`` is what the policy gives every pod it shapes (``gpu.resource``): without a
    fresh inventory it is the rung the cluster surely offers after a whole GPU.
    """
    fitting = fitting_rungs(ask, sizing)
    if isinstance(fitting, str):
        return fitting
    if inventory.fresh(now, sizing.max_inventory_age_seconds):
        unavailable: list[str] = []
        for rung in fitting:
            form = offered_form(rung, ask, inventory)
            if form is not None:
                busy = f" ({', '.join(unavailable)} taken)" if unavailable else ""
                return _choice(rung, form, ask, f"the smallest that fits and is free now{busy}")
            unavailable.append(rung.name)
        return _choice(fitting[0], sizing.mig_strategy, ask,
                       "Pending until one frees up: the smallest that fits, and none that fits is free now")
    return _without_inventory(fitting, sizing, ask, stale(inventory, now, sizing.max_inventory_age_seconds),
                              own_resource)


def stale(inventory: Inventory, now: datetime | None, max_age_seconds: float) -> str:
    """Why the inventory is not used, in a few words: none was read, or the one read is too old."""
    if inventory.generated_at is None or now is None:
        return "no inventory from the balancer"
    age = int((now - inventory.generated_at).total_seconds())
    return f"the balancer's inventory is {_duration(age)} old (limit {_duration(int(max_age_seconds))})"


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _without_inventory(fitting: list[Rung], sizing: RightSizing, ask: Size, why_not: str,
                       own_resource: str | None) -> Choice:
    """No fresh inventory: nothing says which slices the cluster has, so prefer what it surely offers.

    ``nvidia.com/gpu`` is what every GPU node offers under the device plugin's default config; a
    MIG slice or a time-sliced share exists only on nodes configured for it, and a pod given one
    on a cluster without such nodes stays Pending. After a whole GPU, the policy's own resource
    (``gpu.resource``) is what every other pod of the policy gets, so a cluster the policy serves
    offers it. A ladder with neither keeps its order, and the warning says first that the pod may
    wait.
    """
    whole = next((r for r in fitting if units.is_plugin_gpu(r.resource)), None)
    own = next((r for r in fitting if own_resource is not None and r.resource == own_resource), None)
    for rung, what in ((whole, "a whole GPU, which every GPU node has"),
                       (own, "the policy's own resource, not a slice only some nodes have")):
        if rung is not None:
            return _choice(rung, "plain", ask, f"{why_not}, so {what}")
    first = fitting[0]
    return _choice(first, sizing.mig_strategy, ask,
                   f"Pending until a node configured for {first.name} has one free ({why_not}; the ladder's order)")


def offered_form(rung: Rung, ask: Size, inventory: Inventory) -> str | None:
    """How the cluster offers the rung now ("mixed", "single", "plain"), or None if nowhere free."""
    if rung.mig:
        if any(o.resource == units.mig_resource(rung.mig) and o.free > 0 for o in inventory.offers):
            return "mixed"
        if any(units.is_plugin_gpu(o.resource) and o.product.endswith(f"-MIG-{rung.mig}") and o.free > 0
               for o in inventory.offers):
            return "single"
        return None
    for offer in inventory.offers:
        if offer.resource != rung.resource or offer.free <= 0:
            continue
        if units.is_plugin_gpu(rung.resource) and ("-MIG-" in offer.product or not _memory_enough(offer, ask)):
            continue
        return "plain"
    return None


def _memory_enough(offer: Offer, ask: Size) -> bool:
    return ask.memory_bytes is None or offer.memory_mib is None or offer.memory_mib * MIB >= ask.memory_bytes


def _choice(rung: Rung, form: str, ask: Size, why: str) -> Choice:
    memory_mib = (ask.memory_bytes or 0) // MIB
    if rung.mig and form == "mixed":
        return Choice(rung, units.mig_resource(rung.mig), (), why)
    if rung.mig:  # single strategy: a slice is nvidia.com/gpu on a node whose slices are big enough
        bound = max(memory_mib, rung.memory_bytes // MIB)
        return Choice(rung, names.GPU_RESOURCE, (
            {"key": names.NVIDIA_MIG_STRATEGY_LABEL, "operator": "In", "values": ["single"]},
            {"key": names.NVIDIA_MEMORY_LABEL, "operator": "Gt", "values": [str(bound - 1)]},
        ), why)
    assert rung.resource is not None
    if units.is_plugin_gpu(rung.resource):  # a whole GPU: not a single-strategy slice, memory enough
        expressions: list[Expression] = [
            {"key": names.NVIDIA_MIG_STRATEGY_LABEL, "operator": "NotIn", "values": ["single"]}]
        if memory_mib:
            expressions.append({"key": names.NVIDIA_MEMORY_LABEL, "operator": "Gt", "values": [str(memory_mib - 1)]})
        return Choice(rung, rung.resource, tuple(expressions), why)
    return Choice(rung, rung.resource, (), why)


def rung_of(resource: str, sizing: RightSizing) -> Rung | None:
    """The ladder rung a directly requested resource is (nvidia.com/gpu: the whole-GPU rung, if any)."""
    for rung in sizing.ladder:
        if rung.resource == resource or (rung.mig and resource == units.mig_resource(rung.mig)):
            return rung
    return None


def resources_of(sizing: RightSizing) -> frozenset[str]:
    """Every resource name the ladder may put on a pod."""
    out = set()
    for rung in sizing.ladder:
        if rung.mig:
            out |= {units.mig_resource(rung.mig), names.GPU_RESOURCE}
        elif rung.resource:
            out.add(rung.resource)
    return frozenset(out)
