"""What the extender keeps between calls, and the wire shapes of kube-scheduler's extender API.

``ExtenderState`` is the state the balancer feeds from the watches it already runs: nodes
(allocatable, GPU product), pods as they are bound or go away, and pod shapes as pods are created.
``prioritize`` answers one ExtenderArgs. Pure: no I/O, no clock (``now`` is an argument in the
caller's unit, seconds for the balancer, placements for the replay), so the replay runs exactly
the code the balancer serves.

The scheduler's view runs ahead of the watch's: it assumes a pod on its node at once and binds it
asynchronously, so a pod the extender just scored is not yet bound when the next pod arrives.
Scoring the next pod against the stale view would send it to the same node, again and again. So
the state assumes each pod it scores on its best node (the scheduler's choice whenever the
extender's weight decides and that node is the only best), until the watch shows the pod bound
(wherever it went) or ``assume_ttl`` passes. docs/placement.md measures what this buys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any, TypedDict

from webhook.kube.demand import PodDemand
from webhook.placement import scoring
from webhook.placement.devices import MILLI, DevicePolicy, Serves
from webhook.placement.fragment import NO_FIT, Fragmenter
from webhook.placement.inputs import Counts, NodeView
from webhook.placement.shapes import POPULARITY, ShapeMix, ShapeWindow, shape_of


class ExtenderArgs(TypedDict, total=False):
    """k8s.io/kube-scheduler/extender/v1 ExtenderArgs: only the keys read here."""

    Pod: dict[str, Any]
    Nodes: dict[str, Any] | None
    """A NodeList when the extender is not nodeCacheCapable."""
    NodeNames: list[str] | None
    """Node names when it is (``nodeCacheCapable: true``, what gpugate configures)."""


class HostPriority(TypedDict):
    """k8s.io/kube-scheduler/extender/v1 HostPriority; a HostPriorityList is a JSON list of these."""

    Host: str
    Score: int


def candidate_names(args: ExtenderArgs) -> list[str]:
    """The candidate nodes of a call: NodeNames, or the names in Nodes.items."""
    found = args.get("NodeNames")
    if isinstance(found, list):
        return [str(name) for name in found]
    items = (args.get("Nodes") or {}).get("items") or []
    return [str((item.get("metadata") or {}).get("name", "")) for item in items if isinstance(item, dict)]


def host_priorities(names: Sequence[str], scores: Sequence[int]) -> list[HostPriority]:
    return [HostPriority(Host=name, Score=score) for name, score in zip(names, scores, strict=True)]


@dataclass(frozen=True, kw_only=True)
class ExtenderSettings:
    """How the extender models the cluster and learns the pod mix."""

    device_policy: DevicePolicy = "distributed"
    """The device plugin's allocation policy for time-sliced shares, as the cluster runs it
    (distributed is its default; a wrong model misplaces shares in the measure, never a pod)."""
    levels: str = "rank"
    """How keys become 0..10: rank (served) or linear (measured for comparison)."""
    mix: ShapeMix | None = None
    """A configured pod-shape mix; None learns it from the last ``window`` pods created."""
    window: int = 2000
    refresh: int = 100
    """Look at the learned mix every this many pods (the measure's memos live as long as a mix)."""
    tolerance: float = 0.05
    """Take a new mix only when it moved this far (total variation distance) from the current one."""
    popularity: float = POPULARITY
    assume_ttl: float = 30.0
    """Forget an assumption not confirmed by a bind after this long (``now`` units): the pod went
    unschedulable or its binding failed."""
    assume: bool = True
    warm_keys: bool = True
    """Precompute each node's key for the mix's shapes when the mix changes (off the request path);
    the replay turns it off: same scores, less work when latency is not measured."""


class ExtenderState:
    """Nodes, bound and assumed pods, the shape window, and the measure for the current mix."""

    def __init__(self, settings: ExtenderSettings | None = None) -> None:
        self.settings = settings or ExtenderSettings()
        self.nodes: dict[str, NodeView] = {}
        self.window = ShapeWindow(size=self.settings.window, refresh=self.settings.refresh,
                                  popularity=self.settings.popularity, tolerance=self.settings.tolerance)
        self._where: dict[str, str] = {}
        self._assumed: dict[str, tuple[str, PodDemand, float]] = {}
        self._fragmenter = Fragmenter(self.settings.mix or ShapeMix(), self.settings.device_policy)
        self._score = scoring.ScoreSettings(levels=self.settings.levels)
        self._context = scoring.Context()
        # Per node: the view as scored (bound pods plus assumed ones) and its memory left; per pod
        # shape (cpu, gpus, share): each node's key. A bind or an assumption makes a new view and
        # drops the node's keys; a new mix or a new largest node empties every memo. Memos are per
        # shape, so a call reads all its candidates' keys in one pass at C speed.
        self._entries: dict[str, NodeView] = {}
        self._memory_left: dict[str, int] = {}
        self._memos: dict[tuple[int, int, int], dict[str, int]] = {}

    # --- what the watches report -----------------------------------------------------------

    def set_node(self, name: str, *, cpu: int, memory: int = 0, product: str = "", gpus: int = 0,
                 mig: Counts = (), ordered: bool = False, serves: Serves = "any") -> None:
        """A node appeared or its allocatable changed; its bound pods stay, in their order.
        ``ordered``: its GPUs are DRA devices (allocated first fit in device order); ``serves``: which
        pod shapes its GPUs take (``devices.serves_of``, from its allocatable)."""
        node = self.nodes.get(name)
        policy = self.settings.device_policy
        if node is None:
            self.nodes[name] = NodeView.empty(name, cpu=cpu, memory=memory, product=product, gpus=gpus, mig=mig,
                                              ordered=ordered, serves=serves)
        elif (node.cpu, node.memory, node.product, node.gpus, node.mig, node.ordered, node.serves) != \
                (cpu, memory, product, gpus, tuple(mig), ordered, serves):
            self.nodes[name] = node.resized(cpu=cpu, memory=memory, product=product, gpus=gpus, mig=mig,
                                            policy=policy, ordered=ordered, serves=serves)
        self._update(name)
        self._rescale()

    def remove_node(self, name: str) -> None:
        node = self.nodes.pop(name, None)
        for bound in node.pods if node else ():
            self._where.pop(bound.key, None)
        self._drop(name)
        self._rescale()

    def _rescale(self) -> None:
        """Recompute the tie-breaks' context (largest node, type pressure); a change empties the key memos."""
        found = scoring.context(self.nodes.values(), self._fragmenter.mix)
        if found != self._context:
            self._context = found
            self._forget_keys()

    def _forget_keys(self) -> None:
        self._memos.clear()

    def _drop(self, name: str) -> None:
        """Forget the node's view and keys (it changed or went away)."""
        self._entries.pop(name, None)
        self._memory_left.pop(name, None)
        for memo in self._memos.values():
            memo.pop(name, None)

    def bind(self, key: str, node: str, demand: PodDemand) -> None:
        """The watch shows pod ``key`` bound to ``node`` (again is harmless): it counts there from now on."""
        if self._where.get(key) == node:
            return
        self.unbind(key)
        assumed = self._assumed.pop(key, None)
        view = self.nodes.get(node)
        if view is not None:
            self.nodes[node] = view.bind(key, demand, self.settings.device_policy)
            self._where[key] = node
            self._update(node)
        if assumed is not None and assumed[0] != node:
            self._update(assumed[0])

    def hold(self, key: str, node: str, taken: tuple[int, ...]) -> None:
        """What DRA claims hold on ``node``, per GPU in device order (thousandths), under ``key``:
        replaces what ``key`` held before. Claims say which device, so nothing is modelled."""
        self.unbind(key)
        view = self.nodes.get(node)
        if view is not None and any(taken):
            self.nodes[node] = view.hold(key, taken)
            self._where[key] = node
            self._update(node)

    def unbind(self, key: str) -> None:
        """Pod ``key`` was deleted or finished (Succeeded, Failed): its resources are free."""
        node = self._where.pop(key, None)
        if node is not None and node in self.nodes:
            self.nodes[node] = self.nodes[node].release(key)
            self._update(node)

    def seen(self, demand: PodDemand) -> None:
        """A pod was created: its shape joins the learned mix (pending pods count: they are the demand).

        When the window rebuilds the mix, the measure is rebuilt and warmed for every node here, in
        the watch's thread, so a prioritize call never pays for it.
        """
        if self.settings.mix is None and self.window.add(shape_of(demand)):
            self.refresh()

    def refresh(self) -> None:
        """Take the current mix and warm the measure for every node as it is now.

        Tables for every (product, GPUs left), and with ``warm_keys`` each node's key for every
        shape of the mix (95% of pods), so a prioritize call mostly reads memos.
        """
        mix = self.settings.mix or self.window.mix()
        if mix != self._fragmenter.mix:
            self._fragmenter = Fragmenter(mix, self.settings.device_policy)
            self._forget_keys()
            self._rescale()
        self._fragmenter.warm({(view.product, view.signature, view.serves) for view in self.nodes.values()})
        if self.settings.warm_keys:
            names = list(self.nodes)
            for shape in mix.shapes:
                milli = shape.milli if shape.gpus == 1 and shape.milli < MILLI else 0
                self.keys(PodDemand(cpu=shape.cpu, gpus=0 if milli else shape.gpus, share_milli=milli), names)

    # --- the extender's call --------------------------------------------------------------

    def view(self, name: str) -> NodeView | None:
        """The node as scored: bound pods plus the pods assumed there."""
        return self._entries.get(name)

    @property
    def fragmenter(self) -> Fragmenter:
        return self._fragmenter

    @property
    def context(self) -> scoring.Context:
        return self._context

    def type_pressure(self) -> dict[str, float]:
        """Per GPU product with any, its type pressure in the current mix (1.0: the pinned pods alone
        would take all of it), as the GPUInventory publishes it for the webhook."""
        return {product: round(level * scoring.PRESSURE_STEP, 3)
                for product, level in sorted(self._context.pressure.items()) if level > 0}

    def keys(self, demand: PodDemand, names: Sequence[str]) -> list[int]:
        """``scoring.node_keys`` per name (``NO_FIT`` for unknown nodes).

        Cached per (node view, pod cpu and GPUs): between two binds a node's key for a pod shape
        cannot change. Memory only has to fit, so it is checked here and left out of the cache's
        key. The nodes missing from the cache are computed in one batch.
        """
        wanted = (demand.cpu, demand.gpus, demand.share_milli)
        memo = self._memos.setdefault(wanted, {})
        keys: list[int] = list(map(memo.get, names, repeat(NO_FIT - 1, len(names))))
        missing = [index for index, found in enumerate(keys) if found == NO_FIT - 1]
        if missing:
            entries = self._entries
            known = [index for index in missing if names[index] in entries]
            computed = scoring.node_keys(self._fragmenter, replace(demand, memory_bytes=0),
                                         [entries[names[index]] for index in known], self._context)
            for index, value in zip(known, computed, strict=True):
                keys[index] = memo[names[index]] = value
            for index in missing:
                if keys[index] == NO_FIT - 1:  # an unknown node
                    keys[index] = NO_FIT
        memory = demand.memory_bytes
        if memory:
            lefts = list(map(self._memory_left.get, names, repeat(-1, len(names))))
            return [NO_FIT if left < memory else found for found, left in zip(keys, lefts, strict=True)]
        return keys

    def prioritize(self, key: str, demand: PodDemand, names: Sequence[str], *, now: float = 0.0) -> list[int]:
        """0..10 per name (unknown nodes 0); assumes the pod on its best node until it is bound."""
        self.expire(now)
        if demand.extended:  # MIG slices are not in the memo's key
            keys = [NO_FIT if view is None else scoring.node_key(self._fragmenter, demand, view, self._context)
                    for view in map(self.view, names)]
        else:
            keys = self.keys(demand, names)
        scores = scoring.levels(keys, self._score.levels)
        if self.settings.assume and names and key not in self._where:
            top = max(scores)
            if top > 0:
                self._assume(key, names[scores.index(top)], demand, now)
        return scores

    def expire(self, now: float) -> None:
        stale = [key for key, (_, _, since) in self._assumed.items() if now - since > self.settings.assume_ttl]
        for key in stale:
            node, _, _ = self._assumed.pop(key)
            self._update(node)

    @property
    def assumed(self) -> int:
        """Pods scored and not yet seen bound (a gauge for the balancer's metrics)."""
        return len(self._assumed)

    def _assume(self, key: str, node: str, demand: PodDemand, now: float) -> None:
        previous = self._assumed.get(key)
        self._assumed[key] = (node, demand, now)
        if previous is not None and previous[0] != node:
            self._update(previous[0])
        self._update(node)

    def _update(self, name: str) -> None:
        """Recompute the node's view as scored (bound plus assumed); a changed view starts an empty memo."""
        view = self.nodes.get(name)
        if view is None:
            self._drop(name)
            return
        for key, (node, demand, _) in self._assumed.items():
            if node == name:
                view = view.bind(key, demand, self.settings.device_policy)
        if self._entries.get(name) is not view:
            self._drop(name)
            self._entries[name] = view
            self._memory_left[name] = view.memory_left
