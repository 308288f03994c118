"""The rebalancer's decision: which running pods to evict so that waiting GPU pods fit (pure).

Inputs are observed state and nothing else: every node as the extender models it
(``placement.inputs.NodeView``, bound pods keyed ``namespace/name``), the running pods that may be
considered (``Candidate``: movable or not, their unit, where a replacement may go), the pods that
wait for GPUs (``Waiting``), the moves the budget still allows, and ``now`` in the caller's
seconds. The output is a ``Plan``: the moves, and why each waiting pod got none.

For each pod that has waited ``threshold`` seconds, oldest first, and that fits no node now:

1. on every node it may use, ``freeing.cheapest`` finds the fewest movable pods whose eviction lets
   it fit (whole units: a distributed job's pods all go, or none of them);
2. the nodes are tried fewest evictions first (then the fewest GPU thousandths evicted, then by
   name); a choice is taken only when every evicted pod's replacement fits a node none of the
   evicted pods leaves (``rehome``: the nodes they leave are marked, so the replacements cannot
   land back), after the waiting pod is bound, and within the budget (the cluster's and each
   namespace's, and no PodDisruptionBudget's allowance exceeded);
3. the views are updated as if the move had happened, so the next waiting pod sees it.

A pod that waits for anything but GPUs, or fits somewhere already (the scheduler will bind it),
gets no move: a move must let a waiting pod bind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from webhook.kube.demand import PodDemand
from webhook.placement import freeing, rooms
from webhook.placement.devices import DevicePolicy
from webhook.placement.inputs import NodeView
from webhook.placement.rooms import Memo

WAITING, FITS, NO_ROOM, BUDGET, NO_REPLACEMENT = "waiting", "fits", "no-room", "budget", "no-replacement"
"""Why a waiting pod got no move: not waited long enough; fits a node already; no set of movable
pods frees a node for it; the budget is spent; the evicted pods' replacements would fit nowhere."""
TRIED = 12
"""Nodes tried per waiting pod before it is given up for this round (each try places replacements)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running pod the rebalancer may consider, as the edge judged it."""

    key: str
    namespace: str
    unit: str
    """Pods with the same unit move together (a distributed job); a pod alone is its own unit."""
    movable: bool
    """A policy marks it movable, a controller recreates it, it ran its minimum runtime, and no
    eviction of it was refused lately."""
    nodes: frozenset[str] | None = None
    """Nodes its replacement may use (its affinity and tolerations); None: any."""
    node: str = ""
    """The node it is bound to, when the caller knows it (else it is looked up in the views)."""
    disruption_budgets: tuple[str, ...] = ()
    """The PodDisruptionBudgets that select it (``Budget.disruptions`` says how many each allows)."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pod kube-scheduler could not place for lack of GPUs, since ``since``."""

    key: str
    demand: PodDemand
    since: float
    nodes: frozenset[str] | None = None
    """Nodes it may use (its affinity and tolerations); None: any."""


@dataclass(frozen=True, slots=True)
class Settings:
    threshold: float = 60.0
    """Seconds a pod waits before a move is sought for it: kube-scheduler retries it meanwhile."""
    max_pods: int = 8
    """The most pods one move evicts."""
    device_policy: DevicePolicy = "distributed"


@dataclass(frozen=True, slots=True)
class Budget:
    cluster: int
    """Evictions left in the cluster's budget."""
    namespaces: tuple[tuple[str, int], ...] = ()
    """Evictions left per namespace whose policy sets a budget (others: the cluster's only)."""
    disruptions: tuple[tuple[str, int], ...] = ()
    """Per PodDisruptionBudget, the disruptions it allows now (its ``status.disruptionsAllowed``)."""


@dataclass(frozen=True, slots=True)
class Move:
    pending: str
    node: str
    """Where the evictions make room for the waiting pod."""
    evict: tuple[str, ...]
    replacements: tuple[tuple[str, str], ...]
    """(evicted pod, a node its replacement fits): the proof that it fits elsewhere."""
    left: tuple[str, ...]
    """Every node an evicted pod leaves: marked until the waiting pod binds."""


@dataclass(frozen=True, slots=True)
class Skip:
    pending: str
    reason: str


@dataclass(frozen=True)
class Plan:
    moves: tuple[Move, ...] = ()
    skipped: tuple[Skip, ...] = ()


@dataclass
class _World:
    """The views as the plan changes them, where each pod is, and the budget left."""

    views: dict[str, NodeView]
    where: dict[str, str]
    unit_of: dict[str, str]
    sizes: dict[str, int]
    members: dict[str, list[str]]
    namespace_of: dict[str, str]
    allowed: dict[str, frozenset[str] | None]
    cluster: int
    namespaces: dict[str, int]
    disruptions: dict[str, int]
    guarded_by: dict[str, tuple[str, ...]]


def plan(nodes: Sequence[NodeView], candidates: Sequence[Candidate], waiting: Sequence[Waiting], *,
         now: float, settings: Settings, budget: Budget, memo: Memo | None = None) -> Plan:
    """The moves for this round (see the module docstring); ``memo``: kept from earlier rounds."""
    world = _world(nodes, candidates, budget)
    moves: list[Move] = []
    skipped: list[Skip] = []
    memo = memo or Memo()
    going = {name: rooms.going_from(view, world.unit_of, world.sizes) for name, view in world.views.items()}
    table = rooms.Table(list(world.views), {name: memo.room(view, going[name], world.unit_of)
                                            for name, view in world.views.items()})
    # Pods that ask the same on the same nodes get the same answer until a move changes the views.
    answered: dict[tuple[PodDemand, frozenset[str] | None], str] = {}
    homes_now: dict[PodDemand, frozenset[str]] = {}
    for pod in sorted(waiting, key=lambda w: (w.since, w.key)):
        shape = (pod.demand, pod.nodes)
        reason = WAITING if now - pod.since < settings.threshold else BUDGET if world.cluster <= 0 \
            else answered.get(shape, "")
        if not reason and any(freeing.fits(world.views[name], pod.demand, settings.device_policy)
                              for name in table.could_fit(pod.demand, pod.nodes, now=True)):
            reason = answered[shape] = FITS
        if reason:
            skipped.append(Skip(pod.key, reason))
            continue
        found, reason = _move_for(pod, world, settings, (memo, going, table), homes_now)
        if found is None:
            answered[shape] = reason
            skipped.append(Skip(pod.key, reason))
            continue
        moves.append(found)
        answered.clear()
        homes_now.clear()
        _apply(found, pod, world, settings)
        for name in {found.node, *found.left, *(home for _, home in found.replacements)}:
            going[name] = rooms.going_from(world.views[name], world.unit_of, world.sizes)
            table.update(name, memo.room(world.views[name], going[name], world.unit_of))
    return Plan(moves=tuple(moves), skipped=tuple(skipped))


def _world(nodes: Sequence[NodeView], candidates: Sequence[Candidate], budget: Budget) -> _World:
    names = {view.name for view in nodes}
    if all(c.node for c in candidates):
        where = {c.key: c.node for c in candidates if c.node in names}
    else:
        where = {bound.key: view.name for view in nodes for bound in view.pods}
    members: dict[str, list[str]] = {}
    for found in candidates:
        members.setdefault(found.unit, []).append(found.key)
    # A unit moves only whole: every member known, movable and bound somewhere.
    movable = {found.key for found in candidates if found.movable}
    whole = {unit for unit, keys in members.items() if all(k in movable and k in where for k in keys)}
    unit_of = {found.key: found.unit for found in candidates if found.unit in whole}
    return _World(views={v.name: v for v in nodes}, where=where, unit_of=unit_of,
                  sizes={unit: len(members[unit]) for unit in whole}, members=members,
                  namespace_of={c.key: c.namespace for c in candidates}, allowed={c.key: c.nodes for c in candidates},
                  cluster=budget.cluster, namespaces=dict(budget.namespaces), disruptions=dict(budget.disruptions),
                  guarded_by={c.key: c.disruption_budgets for c in candidates})


def _may_rehome(evict: tuple[str, ...], world: _World, settings: Settings,
                homes_now: dict[PodDemand, frozenset[str]]) -> bool:
    """A quick necessary condition for ``rehome``: each evicted pod fits, as the views are now, some
    node that no evicted pod leaves (the exact answer also binds them one after another)."""
    leaving = {world.where[key] for key in evict}
    for key in evict:
        demand = _demand_of(world.views, world.where, key)
        if demand not in homes_now:
            homes_now[demand] = frozenset(name for name, view in world.views.items()
                                          if view.cpu_left >= demand.cpu and view.gpu_free >= demand.gpu_request_milli
                                          and freeing.fits(view, demand, settings.device_policy))
        allowed = world.allowed.get(key)
        if not any(name not in leaving and (allowed is None or name in allowed) for name in homes_now[demand]):
            return False
    return True


Known = tuple[Memo, dict[str, rooms.Going], rooms.Table]
"""The memo, and per node the pods that may leave it and its room, as the plan stands."""


def _move_for(pod: Waiting, world: _World, settings: Settings, known: Known,
              homes_now: dict[PodDemand, frozenset[str]]) -> tuple[Move | None, str]:
    """The cheapest move that lets ``pod`` bind, or None and why not."""
    options = []
    memo, going, table = known
    for name in table.could_fit(pod.demand, pod.nodes, now=False):
        view = world.views[name]
        units = memo.freeing(view, going[name], pod.demand, world.unit_of, world.sizes, settings.device_policy)
        if units is None:
            continue
        keys = tuple(sorted(key for unit in units for key in world.members[unit]))
        milli = sum(_demand_of(world.views, world.where, key).gpu_request_milli for key in keys)
        options.append((len(keys), milli, view.name, keys))
    if not options:
        return None, NO_ROOM
    reason = BUDGET
    for count, _, node, evict in sorted(options)[:TRIED]:
        if count > settings.max_pods or not _affordable(evict, world):
            continue
        if not _may_rehome(evict, world, settings, homes_now):
            reason = NO_REPLACEMENT
            continue
        homes = rehome(world.views, evict, world.where, pod, node, world.allowed, settings.device_policy)
        if homes is None:
            reason = NO_REPLACEMENT
            continue
        left = tuple(sorted({world.where[key] for key in evict}))
        return Move(pending=pod.key, node=node, evict=evict, replacements=homes, left=left), ""
    return None, reason


def _demand_of(views: Mapping[str, NodeView], where: Mapping[str, str], key: str) -> PodDemand:
    return next(b.demand for b in views[where[key]].pods if b.key == key)


def _affordable(evict: tuple[str, ...], world: _World) -> bool:
    if len(evict) > world.cluster:
        return False
    per: dict[str, int] = {}
    guarded: dict[str, int] = {}
    for key in evict:
        per[world.namespace_of[key]] = per.get(world.namespace_of[key], 0) + 1
        for name in world.guarded_by.get(key, ()):
            guarded[name] = guarded.get(name, 0) + 1
    return all(count <= world.namespaces[ns] for ns, count in per.items() if ns in world.namespaces) and \
        all(count <= world.disruptions.get(name, 0) for name, count in guarded.items())


def rehome(views: Mapping[str, NodeView], evict: Sequence[str], where: Mapping[str, str], pod: Waiting, node: str,
           allowed: Mapping[str, frozenset[str] | None],
           policy: DevicePolicy = "distributed") -> tuple[tuple[str, str], ...] | None:
    """Where each evicted pod's replacement fits once the evictions are done and ``pod`` is bound on
    ``node``, none on a node an evicted pod leaves; None when one fits nowhere. Largest first, each
    on the node it leaves fewest GPU thousandths free on (best fit), then by name."""
    after = dict(views)
    leaving = {where[key] for key in evict}
    demands = {}
    for key in evict:
        demands[key] = _demand_of(after, where, key)
        after[where[key]] = after[where[key]].release(key)
    after[node] = after[node].bind(pod.key, pod.demand, policy)
    homes = []
    for key in sorted(evict, key=lambda k: (-demands[k].gpu_request_milli, -demands[k].cpu, k)):
        demand, nodes = demands[key], allowed.get(key)
        best: tuple[int, int, str] | None = None
        for name, view in after.items():
            if name in leaving or view.cpu_left < demand.cpu or view.gpu_free < demand.gpu_request_milli \
                    or (nodes is not None and name not in nodes) or not freeing.fits(view, demand, policy):
                continue
            score = (view.gpu_free - demand.gpu_request_milli, view.cpu_left - demand.cpu, name)
            best = score if best is None or score < best else best
        if best is None:
            return None
        after[best[2]] = after[best[2]].bind(key, demand, policy)
        homes.append((key, best[2]))
    return tuple(sorted(homes))


def _apply(move: Move, pod: Waiting, world: _World, settings: Settings) -> None:
    """The views after the move: evicted pods gone, the waiting pod and the replacements bound."""
    policy = settings.device_policy
    demands = {}
    for key in move.evict:
        demands[key] = _demand_of(world.views, world.where, key)
        name = world.where.pop(key)
        world.views[name] = world.views[name].release(key)
        world.cluster -= 1
        namespace = world.namespace_of[key]
        if namespace in world.namespaces:
            world.namespaces[namespace] -= 1
        for name in world.guarded_by.get(key, ()):
            world.disruptions[name] = world.disruptions.get(name, 0) - 1
        world.unit_of.pop(key, None)
    world.views[move.node] = world.views[move.node].bind(pod.key, pod.demand, policy)
    for key, name in move.replacements:
        world.views[name] = world.views[name].bind(f"{key}~", demands[key], policy)
