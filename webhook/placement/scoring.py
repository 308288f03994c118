"""The extender's answer: a 0..10 priority per candidate node, from FGD's measure, type pressure and cpu.

How kube-scheduler v1.36 uses it (``pkg/scheduler/schedule_one.go``, ``prioritizeNodes``): each
node's extender score is multiplied by the extender's ``weight`` and by MaxNodeScore /
MaxExtenderPriority = 100 / 10, then added to the score plugins' weighted sum; nothing is clipped
or normalized, and nodes with equal totals are picked at random (a ``Randomizer`` is drawn for
every node an extender scored). The extender is called only when more than one node is feasible.
The documented range is ``MinExtenderPriority`` 0 .. ``MaxExtenderPriority`` 10
(``k8s.io/kube-scheduler/extender/v1/types.go``); the scores here stay in it.

Each candidate gets a key, compared as a tuple. For a pod that uses GPUs (whole or a share):

1. Type pressure: prefer a node whose GPU product the mix's type-constrained pods need least
   (``pressures``, in steps of ``PRESSURE_STEP``). FGD's measure is per node and cannot see that an
   unconstrained pod on the last free T4 strands a T4-only pod later; worse, it counts a node that
   few shapes may use as fragment already, so it prefers to fill exactly the scarce products. On
   lists without constraints the pressure is 0 everywhere and this changes nothing.
2. FGD's own score, ``int(100 * sigmoid(-dF / 1000))`` (``fragment.fgd_points``). Its coarseness is
   part of why FGD works: every large drop scores 99, and the tie-break decides among them.
3. Best fit: the least cpu and GPU left after the pod, half weight each, over the largest node
   (the artifact's BestFit normaliser). The FGD artifact breaks its ties in a fixed node order,
   which packs; kube-scheduler would break them with LeastAllocated, which spreads.

For a CPU-only pod: FGD's score, then the type pressure of the node's product (the highest
first), then best fit. FGD scores a CPU pod alike on every node where no typical shape's cpu stops
fitting; among those, the nodes of a product that unconstrained GPU pods are steered away from
(point 1) are where cpu stays idle, since only the few pods pinned to that product will ask for it.
Without a constrained product it is best fit.

A node that takes shares only (a time-sliced node advertising only ``nvidia.com/gpu.shared``)
carries no type pressure, for either kind of pod. Type pressure keeps unconstrained pods off what
the pinned pods need, but such a node has slots to spare and runs out of cpu first: steering
unconstrained shares off a pressured product's share-only nodes (on the gpuspec lists, T4 nodes
with 13 cores per slot) leaves their cpu to CPU pods (which the pressure sends there) and packs the
shares onto nodes poor in cpu per slot, where they fail for cpu. Its slots and cpu are weighed by
the fragment measure instead (``fragment``'s stranded slots). On a node that takes whole GPUs or
either kind (every DRA device) nothing changes. docs/placement.md measures it.

(An earlier CPU-pod key, the cpu a node has beyond what its idle GPUs will ask, did worse on every
pod list measured: docs/placement.md.)

Eleven levels are coarse for such a key, so the levels are a rank, not a rescaling: the best
distinct key gets 10, the next 9, and so on; the 11th and later get 0. With a weight whose level
(10 x weight points) outweighs what the default profile's resource scorers can add (at most 200:
NodeResourcesFit and BalancedAllocation, 100 each), the scheduler's choice is exactly the node
with the best key: the integer resolution loses nothing of the order that decides, the argmax.
A linear rescaling of the same keys onto 0..10 lumps the best nodes with merely good ones and
lets LeastAllocated choose among them; docs/placement.md measures both.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat

from webhook.kube.demand import PodDemand
from webhook.placement.devices import MILLI
from webhook.placement.fragment import NO_FIT, Fragmenter
from webhook.placement.inputs import NodeView
from webhook.placement.shapes import ShapeMix

MAX_EXTENDER_PRIORITY = 10
"""k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority; MinExtenderPriority is 0."""
MAX_NODE_SCORE = 100
"""k8s.io/kube-scheduler/framework MaxNodeScore: an extender score counts x weight x 100/10."""
RECOMMENDED_WEIGHT = 25
"""The extender's weight in the scheduler profile: one level (10 x 25 = 250 points) outweighs the
default profile's resource scorers together (<= 200), so among feasible nodes fragmentation decides;
a PreferNoSchedule taint the pod does not tolerate (TaintToleration weight 3: 300) still outweighs one
level, so the balancer's congested taint keeps its meaning; preferred node affinity (<= 200) and the
default spreading plugins break ties among the nodes the extender ranks equal."""

_FIT_BITS = 20                       # best fit: leftover in 2^20 steps
_POINT_BITS = 7                      # FGD's score: 0..100
_PRESSURE_LEVELS = 1 << 10           # type pressure: 0..1023, in steps of PRESSURE_STEP
PRESSURE_STEP = 0.1
"""Type pressures closer than this count as equal, so best fit still orders nodes whose products
the constrained pods need about equally (or not at all)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreSettings:
    """How keys become priorities."""

    levels: str = "rank"
    """rank: the k-th best distinct key gets 10-k (the argmax survives); linear: keys rescaled onto
    0..10 (kept to measure what the rank buys; never the served default)."""


@dataclass(frozen=True, slots=True)
class Context:
    """What the tie-breaks need of the whole cluster, computed when the nodes or the mix change.

    ``per_cpu`` and ``per_milli`` turn leftover millicores and GPU thousandths into key units
    (half the best-fit range each, over the largest node); ``pressure`` is each GPU product's
    type-pressure level.
    """

    per_cpu: float = 0.0
    per_milli: float = 0.0
    pressure: dict[str, int] = field(default_factory=dict)


def pressures(nodes: Iterable[NodeView], mix: ShapeMix) -> dict[str, int]:
    """Per GPU product: how much the mix's type-constrained pods need it, relative to its supply.

    A constrained shape's GPU demand spreads over the products it allows in proportion to their
    GPUs, so each of those products carries demand/supply(allowed products) per GPU. Divided by
    the whole mix's demand per GPU of the cluster, 1.0 means "constrained pods alone would take
    all of it if the cluster filled with this mix"; levels are steps of ``PRESSURE_STEP``.
    """
    supply: dict[str, int] = {}
    for node in nodes:
        if node.gpus:
            supply[node.product] = supply.get(node.product, 0) + node.gpus
    total_supply = sum(supply.values())
    total_demand = sum(w * s.gpus * s.milli for s, w in zip(mix.shapes, mix.weights, strict=True))
    if not total_supply or not total_demand:
        return {}
    load: dict[str, float] = {}
    for shape, weight in zip(mix.shapes, mix.weights, strict=True):
        allowed = [product for product in shape.products if product in supply]
        if not allowed or not shape.milli:
            continue
        share = weight * shape.gpus * shape.milli / sum(supply[product] for product in allowed)
        for product in allowed:
            load[product] = load.get(product, 0.0) + share
    per_gpu = total_demand / total_supply
    return {product: min(_PRESSURE_LEVELS - 1, int(value / per_gpu / PRESSURE_STEP))
            for product, value in load.items()}


def context(nodes: Iterable[NodeView], mix: ShapeMix) -> Context:
    """The tie-breaks' view of the cluster (the largest node; each product's type pressure)."""
    listed = list(nodes)
    cpu = max((node.cpu for node in listed), default=1)
    gpus = max((node.gpus for node in listed), default=1)
    half = 0.5 * (1 << _FIT_BITS)
    return Context(per_cpu=half / max(1, cpu), per_milli=half / (max(1, gpus) * MILLI),
                   pressure=pressures(listed, mix))


def node_keys(fragmenter: Fragmenter, demand: PodDemand, nodes: Sequence[NodeView],
              where: Context | None = None) -> list[int]:
    """Per node, higher is better, packed into one int: (low type pressure, FGD's score, best fit) for a
    GPU pod, (FGD's score, cpu surplus, best fit) for a CPU pod (the module docstring says why).

    ``NO_FIT`` where the pod does not fit the view (memory only has to fit: FGD ignores it).
    ``where`` defaults to the context of ``nodes`` themselves. The loop is the extender's hot
    path, written for CPython: locals, one memo lookup per node.
    """
    where = where or context(nodes, fragmenter.mix)
    if demand.extended:
        return [_mig_key(demand, node, where) for node in nodes]
    per_cpu, per_milli, pressure = where.per_cpu, where.per_milli, where.pressure
    cpu, gpus, share, memory = demand.cpu, demand.gpus, demand.share_milli, demand.memory_bytes
    milli = demand.gpu_request_milli
    thresholds, memo, points = fragmenter.thresholds, fragmenter.memo, fragmenter.points
    top = (1 << _FIT_BITS) - 1
    calm = _PRESSURE_LEVELS - 1
    keys: list[int] = []
    append = keys.append
    for node in nodes:
        left = node.cpu_left
        if node.memory_left < memory or left < cpu:
            append(NO_FIT)
            continue
        product = node.product
        found = memo.get((product, node.signature, bisect_right(thresholds, left),
                          bisect_right(thresholds, left - cpu), gpus, share, node.ordered, node.serves))
        if found is None:
            found = points(product, node.signature, left, cpu, gpus, share, node.ordered, node.serves)
        if found < 0:
            append(NO_FIT)
            continue
        waste = int((left - cpu) * per_cpu + (node.gpu_free - milli) * per_milli)
        fit = top - (top if waste > top else waste if waste > 0 else 0)
        # A share-only node carries no type pressure (the module docstring says why).
        level = 0 if node.serves == "shares" else pressure.get(product, 0)
        if milli:
            # A GPU pod: low type pressure first, then FGD's score, then best fit.
            append((((((calm - level) << _POINT_BITS) | found)) << _FIT_BITS) | fit)
        else:
            # A CPU pod: FGD's score, then the product constrained GPU pods need most (the cpu that GPU
            # pods steered away from it leave idle), then best fit.
            append((((found << 10) | level) << _FIT_BITS) | fit)
    return keys


def node_key(fragmenter: Fragmenter, demand: PodDemand, node: NodeView, where: Context) -> int:
    """``node_keys`` for one node."""
    return node_keys(fragmenter, demand, (node,), where)[0]


def _mig_key(demand: PodDemand, node: NodeView, where: Context) -> int:
    """MIG slices are fixed partitions FGD's measure does not cover: a neutral 50, then best fit on slices."""
    if (node.memory_left < demand.memory_bytes or node.cpu_left < demand.cpu
            or any(node.mig_free(resource) < count for resource, count in demand.extended)):
        return NO_FIT
    spare = sum(node.mig_free(resource) - count for resource, count in demand.extended)
    waste = int((node.cpu_left - demand.cpu) * where.per_cpu
                + 0.5 * (1 << _FIT_BITS) * spare / max(1, sum(count for _, count in node.mig)))
    top = (1 << _FIT_BITS) - 1
    return ((((MAX_NODE_SCORE // 2) << 10) | (_PRESSURE_LEVELS - 1)) << _FIT_BITS) | (top - min(top, max(0, waste)))


def levels(keys: Sequence[int], how: str = "rank") -> list[int]:
    """Keys to extender priorities 0..10 (see the module docstring); a node that does not fit gets 0."""
    if how == "linear":
        fitting = [k for k in keys if k != NO_FIT]
        if not fitting:
            return [0] * len(keys)
        low, high = min(fitting), max(fitting)
        span = high - low
        return [0 if k == NO_FIT else (MAX_EXTENDER_PRIORITY if span == 0
                                      else round(MAX_EXTENDER_PRIORITY * (k - low) / span)) for k in keys]
    distinct = set(keys)
    distinct.discard(NO_FIT)
    best = heapq.nlargest(MAX_EXTENDER_PRIORITY, distinct)
    level = {key: MAX_EXTENDER_PRIORITY - rank for rank, key in enumerate(best)}
    return list(map(level.get, keys, repeat(0, len(keys))))


def prioritize(demand: PodDemand, nodes: Sequence[NodeView], fragmenter: Fragmenter,
               settings: ScoreSettings | None = None, where: Context | None = None) -> list[int]:
    """The extender's priorities for ``nodes`` (same order), 0..10, for a pod of ``demand``.

    ``fragmenter`` carries the shape mix and the device policy its deltas assume; ``where`` the
    cluster-wide context (default: the candidates'). Pure: the same inputs give the same scores.
    """
    settings = settings or ScoreSettings()
    return levels(node_keys(fragmenter, demand, nodes, where), settings.levels)
