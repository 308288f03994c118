"""What the scheduler extender's state (``webhook.placement.extender.ExtenderState``) learns from the
balancer's node and pod caches (pure: no I/O, no clock).

The extender needs no watch of its own: the balancer already lists and watches every node and the
bound, unfinished pods. Here a node's record becomes the shape the fragmentation measure
reads, and a pod's JSON becomes both what the node labels count (``state.PodUsage``) and what the
measure counts (``kube.demand.PodDemand``: cpu, memory and GPUs, not only GPUs): one reading of the pod.

Physical GPUs from what the device plugin advertises (gpu-operator.md, section 4):

- ``nvidia.com/gpu.shared`` (time-slicing or MPS with ``renameByDefault``): slots / replicas, plus
  any whole ``nvidia.com/gpu`` the node also advertises;
- ``nvidia.com/gpu`` under time-slicing without the rename: slots / replicas;
- otherwise ``nvidia.com/gpu`` as it is (under the single MIG strategy these are slices, each
  counted as a GPU: that is what a pod asking ``nvidia.com/gpu: 1`` gets there);
- MIG slices (mixed strategy) by resource, outside the measure's GPU thousandths.

A time-sliced slot counts as ``kube.demand.DEFAULT_SLOT_MILLI`` of its GPU (4 replicas, the
``time-slicing-4`` config of manifests/gpu-operator); a node with another replica count is measured
as if its slots were that size (a coarser model there, never a misplaced pod: the scheduler's
filters decide fit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.balancer.state import TERMINAL_PHASES, PodUsage, pod_usage
from webhook.kube import demand as kube_demand
from webhook.kube.demand import Counts, PodDemand
from webhook.kube.gpunode import NodeInfo
from webhook.kube.nodedevices import NodeDevices
from webhook.kube.quantity import QuantityError
from webhook.placement import dra as placement_dra
from webhook.placement import marks
from webhook.placement.devices import Serves, serves_of
from webhook.placement.extender import ExtenderArgs, ExtenderState, HostPriority, candidate_names, host_priorities
from webhook.placement.shapes import shape_of


@dataclass(frozen=True, slots=True)
class NodeShape:
    """The arguments of ``ExtenderState.set_node`` for one node; equal shapes need no update."""

    cpu: int
    memory: int
    product: str
    gpus: int
    mig: Counts
    ordered: bool = False
    """Its GPUs are DRA devices: allocated first fit in device order (``placement.devices``)."""
    serves: Serves = "any"
    """Which pod shapes its GPUs take (``placement.devices.serves_of``)."""


def node_shape(info: NodeInfo, devices: NodeDevices | None = None) -> NodeShape:
    """The node as the fragmentation measure sees it (CPU-only nodes too: CPU pods are placed as well).

    A node with NVIDIA DRA devices has the DRA driver's physical GPUs, counted once even when the
    device plugin advertises the same GPUs (``placement.dracount``)."""
    replicas = max(1, info.replicas)
    ordered = devices is not None and bool(devices.devices)
    serves: Serves = "any"
    if devices is not None and devices.devices:
        gpus = devices.gpus
    elif info.slots is not None:
        gpus = info.slots // replicas + info.plugin_gpus
        serves = serves_of(info.plugin_gpus, info.slots)
    elif marks.time_sliced(info):
        gpus = info.plugin_gpus // replicas
    else:
        gpus = info.plugin_gpus
        serves = serves_of(gpus, 0)
    mig = tuple(sorted(info.by_name))
    return NodeShape(cpu=info.cpu_milli, memory=info.memory_bytes, product=info.product, gpus=gpus, mig=mig,
                     ordered=ordered, serves=serves)


@dataclass(frozen=True, slots=True)
class FeedPod:
    """One pod as both caches keep it: the GPUs the labels count, and the demand the measure counts."""

    usage: PodUsage | None
    """None when the pod holds no GPU (the node labels ignore it)."""
    node: str
    """The node it is bound to; empty when unbound or finished (it then holds nothing)."""
    demand: PodDemand | None
    """None when unbound or finished, or when a quantity is unreadable (the API server would not
    have stored it)."""


def feed_pod(pod: dict[str, Any]) -> FeedPod:
    node = (pod.get("spec") or {}).get("nodeName") or ""
    if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        node = ""
    if not node:
        return FeedPod(usage=None, node=node, demand=None)
    try:
        demand = kube_demand.of_pod(pod)
    except QuantityError:
        return FeedPod(usage=None, node=node, demand=None)
    # The GPU requests a DRA claim serves (extended-resource mapping) are held by the node's
    # stand-in for claims (``Feed.dra``): the measure counts the rest.
    return FeedPod(usage=pod_usage(pod, demand), node=node, demand=demand.without_dra_backed())


DRA_HOLDER_PREFIX = "dra:"
"""Key prefix of the stand-in pod that holds a node's DRA-held GPUs in the extender's state (no real
pod key has a colon: it is ``namespace/name``)."""


class ArgsError(ValueError):
    """An ExtenderArgs the scorer cannot read (no pod, an unreadable quantity)."""


class Feed:
    """Keeps an ``ExtenderState`` in step with the balancer's caches, and answers prioritize from it.

    Not thread-safe: the controller holds one lock around every call. The watches deliver nodes
    and pods independently, so a pod may arrive before its node: it is kept by node and bound when
    the node appears. A node event that changes nothing the measure reads (a heartbeat, a label)
    costs a comparison, not a state update.
    """

    def __init__(self, state: ExtenderState) -> None:
        self.state = state
        self._shapes: dict[str, NodeShape] = {}
        self._pods: dict[str, tuple[str, PodDemand]] = {}
        self._on_node: dict[str, set[str]] = {}
        self._infos: dict[str, NodeInfo] = {}
        self._dra: dict[str, NodeDevices] = {}

    # --- nodes -------------------------------------------------------------------------------
    def replace_nodes(self, infos: Mapping[str, NodeInfo]) -> None:
        for name in [n for n in self._shapes if n not in infos]:
            self.node(name, None)
        for name, info in infos.items():
            self.node(name, info)

    def node(self, name: str, info: NodeInfo | None) -> None:
        if info is None:
            self._infos.pop(name, None)
            if self._shapes.pop(name, None) is not None:
                self.state.remove_node(name)
            return
        self._infos[name] = info
        shape = node_shape(info, self._dra.get(name))
        if self._shapes.get(name) == shape:
            return
        new = name not in self._shapes
        self._shapes[name] = shape
        self.state.set_node(name, cpu=shape.cpu, memory=shape.memory, product=shape.product, gpus=shape.gpus,
                            mig=shape.mig, ordered=shape.ordered, serves=shape.serves)
        if new:  # pods the watch delivered before their node
            for key in sorted(self._on_node.get(name, ())):
                self.state.bind(key, name, self._pods[key][1])
            self._bind_dra(name)

    # --- DRA ---------------------------------------------------------------------------------
    def dra(self, name: str, devices: NodeDevices | None) -> None:
        """The node's DRA devices changed: its GPUs (counted once) and what claims hold there.

        What claims hold is one stand-in per node (key ``dra:<node>``, no cpu or memory) holding,
        per GPU in device order, what the claims there took (``placement.dra.taken_milli``): a whole
        device, or the memory share claims consumed of a device that allows multiple allocations
        (consumable capacity). The measure then reads each device's true thousandths left, with no
        device model, whichever pod the claims belong to."""
        if devices is None or not devices.devices:
            self._dra.pop(name, None)
        else:
            self._dra[name] = devices
        info = self._infos.get(name)
        if info is not None:
            self._shapes.pop(name, None)  # recomputed with the devices; node() then rebinds the stand-in
            self.node(name, info)

    def _bind_dra(self, name: str) -> None:
        key = DRA_HOLDER_PREFIX + name
        devices = self._dra.get(name)
        self.state.hold(key, name, placement_dra.taken_milli(devices) if devices is not None else ())

    # --- pods --------------------------------------------------------------------------------
    def replace_pods(self, records: Mapping[str, FeedPod]) -> None:
        """A (re)list: pods gone are released, the others bound; the newest ``window`` join the shape mix."""
        for key in [k for k in self._pods if k not in records]:
            self.pod(key, None)
        fresh: list[PodDemand] = []
        for key, record in records.items():
            if key not in self._pods and record.demand is not None and record.node:
                fresh.append(record.demand)
            self._set(key, record)
        if not fresh or self.state.settings.mix is not None:
            return
        # The shapes go into the window without ``seen``'s rebuild per 100 pods (and per pod while the
        # window is young), then the mix is taken and the measure warmed once: a first list of
        # thousands of pods would otherwise rebuild and warm it dozens of times. Only the last
        # ``window`` shapes can count, so only those are added.
        for demand in fresh[-self.state.settings.window:]:
            self.state.window.add(shape_of(demand))
        self.state.refresh()

    def pod(self, key: str, record: FeedPod | None) -> None:
        """A watch event: bound or changed (``record``), or gone (None, also for a pod that finished)."""
        if record is not None and key not in self._pods and record.demand is not None and record.node:
            self.state.seen(record.demand)
        self._set(key, record)

    def _set(self, key: str, record: FeedPod | None) -> None:
        old = self._pods.get(key)
        if record is None or not record.node or record.demand is None:
            if old is not None:
                del self._pods[key]
                self._on_node.get(old[0], set()).discard(key)
                self.state.unbind(key)
            return
        if old is not None and old[0] != record.node:
            self._on_node.get(old[0], set()).discard(key)
        self._pods[key] = (record.node, record.demand)
        self._on_node.setdefault(record.node, set()).add(key)
        self.state.bind(key, record.node, record.demand)

    # --- the call ----------------------------------------------------------------------------
    def prioritize(self, args: ExtenderArgs, *, now: float) -> list[HostPriority]:
        """The HostPriorityList for one ExtenderArgs; ArgsError when the pod cannot be read."""
        pod = args.get("Pod")
        if not isinstance(pod, dict):
            raise ArgsError("ExtenderArgs without a Pod")
        try:
            demand = kube_demand.of_pod(pod)
        except QuantityError as err:
            raise ArgsError(f"the pod's requests cannot be read: {err}") from err
        names = candidate_names(args)
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        return host_priorities(names, self.state.prioritize(key, demand, names, now=now))
