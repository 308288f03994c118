"""DRA in the balancer's counts: the slice and claim caches, and a node's load with both stacks (pure).

The balancer watches ResourceSlices (driver ``gpu.nvidia.com`` only, by field selector) and
ResourceClaims next to nodes and pods. :class:`DraCache` keeps them reduced
(``kube.slices.Slice``, ``kube.allocations.Claim``) and the per-node result
(``kube.nodedevices.NodeDevices``), recomputed only for the pools a change touches, and says
which nodes changed so only their marks are recomputed.

A node served by both the device plugin and the DRA driver is counted once. Detection: the node
has NVIDIA DRA devices in its pool's current slices (``NodeDevices.devices`` non-empty) whatever
its allocatable says. Such a node's GPUs are the DRA driver's physical GPUs (it names each by
UUID, and sees MIG partitioning); the device plugin's allocatable is the same silicon, so it adds
no GPUs, but what bound pods request through it still takes GPUs, since neither stack knows what
the other handed out: whole free = DRA whole-free GPUs minus whole GPUs device-plugin pods take;
the allocated share = (device-plugin share + DRA-held share) / physical GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from webhook.kube import allocations, nodedevices, slices, units
from webhook.kube.allocations import DeviceKey
from webhook.kube.gpunode import NodeInfo
from webhook.kube.nodedevices import NodeDevices
from webhook.placement import marks

Pool = tuple[str, str]  # (driver, pool name)


def reduce_slice(obj: dict) -> tuple[str, slices.Slice | None]:
    """An informer's reduce: the slice, or None for one that cannot be read (logged by the caller's
    counts, never fatal: the API server validated it, so only a newer schema can get here)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    try:
        return name, slices.parse(obj)
    except slices.SliceError:
        return name, None


def reduce_claim(obj: dict) -> tuple[str, allocations.Claim | None]:
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    try:
        found = allocations.parse(obj)
    except allocations.ClaimError:
        return key, None
    return key, found if found.results else None  # unallocated: holds nothing, costs nothing


@dataclass
class DraCache:
    """Slices, claims and per-node devices; not thread-safe (the controller's lock guards it)."""

    resource_slices: dict[str, slices.Slice] = field(default_factory=dict)
    resource_claims: dict[str, allocations.Claim] = field(default_factory=dict)
    nodes: dict[str, NodeDevices] = field(default_factory=dict)
    _held: dict[DeviceKey, int] = field(default_factory=dict)
    _consumed: dict[DeviceKey, int] = field(default_factory=dict)
    """Memory bytes held claims consumed per shared device (consumable capacity)."""
    # Indexes, so an event costs its pool, not the cluster (benchmarks/dra_counting.py).
    _by_pool: dict[Pool, dict[str, slices.Slice]] = field(default_factory=dict)
    _held_by_pool: dict[Pool, set[DeviceKey]] = field(default_factory=dict)
    _pool_nodes: dict[Pool, set[str]] = field(default_factory=dict)

    # ---- slices ---------------------------------------------------------------------------
    def replace_slices(self, found: Mapping[str, slices.Slice | None]) -> set[str]:
        """A (re)list; returns the nodes whose devices changed."""
        touched = set(self._by_pool)
        self.resource_slices = {k: v for k, v in found.items() if v is not None}
        self._by_pool = {}
        for name, found_slice in self.resource_slices.items():
            self._by_pool.setdefault((found_slice.driver, found_slice.pool), {})[name] = found_slice
        return self._recompute(touched | set(self._by_pool))

    def set_slice(self, name: str, found: slices.Slice | None) -> set[str]:
        old = self.resource_slices.pop(name, None)
        if old is not None:
            pool = self._by_pool.get((old.driver, old.pool), {})
            pool.pop(name, None)
            if not pool:
                self._by_pool.pop((old.driver, old.pool), None)
        if found is not None:
            self.resource_slices[name] = found
            self._by_pool.setdefault((found.driver, found.pool), {})[name] = found
        return self._recompute({(s.driver, s.pool) for s in (old, found) if s is not None})

    # ---- claims ---------------------------------------------------------------------------
    def replace_claims(self, found: Mapping[str, allocations.Claim | None]) -> set[str]:
        before = set(self._held)
        self.resource_claims = {k: v for k, v in found.items() if v is not None}
        self._held = {}
        self._consumed = {}
        self._held_by_pool = {}
        for claim in self.resource_claims.values():
            self._count(claim, +1)
        return self._recompute({(k.driver, k.pool) for k in before | set(self._held)})

    def set_claim(self, key: str, found: allocations.Claim | None) -> set[str]:
        old = self.resource_claims.pop(key, None)
        if found is not None:
            self.resource_claims[key] = found
        if old == found:
            return set()
        keys = set()
        for claim, sign in ((old, -1), (found, +1)):
            if claim is not None:
                keys |= self._count(claim, sign)
        return self._recompute({(k.driver, k.pool) for k in keys})

    def _count(self, claim: allocations.Claim, sign: int) -> set[DeviceKey]:
        keys = {r.key for r in claim.held()}
        for result in claim.held():
            used = nodedevices.consumed_memory(result)
            if used:
                total = self._consumed.get(result.key, 0) + sign * used
                if total > 0:
                    self._consumed[result.key] = total
                else:
                    self._consumed.pop(result.key, None)
        for key in keys:
            left = self._held.get(key, 0) + sign
            pool = (key.driver, key.pool)
            if left > 0:
                self._held[key] = left
                self._held_by_pool.setdefault(pool, set()).add(key)
            else:
                self._held.pop(key, None)
                in_pool = self._held_by_pool.get(pool, set())
                in_pool.discard(key)
                if not in_pool:
                    self._held_by_pool.pop(pool, None)
        return keys

    # ---- per node -------------------------------------------------------------------------
    def _recompute(self, pools: set[Pool]) -> set[str]:
        """Recompute the nodes of ``pools``; return the nodes whose NodeDevices changed."""
        if not pools:
            return set()
        found = [s for pool in pools for s in self._by_pool.get(pool, {}).values()]
        held = frozenset(k for pool in pools for k in self._held_by_pool.get(pool, ()))
        fresh = nodedevices.by_node(found, held, {k: self._consumed[k] for k in held if k in self._consumed})
        # Nodes these pools published before (their slices may be gone now).
        stale = {name for pool in pools for name in self._pool_nodes.pop(pool, ())}
        for name, devs in fresh.items():
            for d in devs.devices:
                self._pool_nodes.setdefault((d.key.driver, d.key.pool), set()).add(name)
        changed = set()
        for name in stale | set(fresh):
            old, new = self.nodes.get(name), self._merge(name, pools, fresh.get(name))
            if new is None:
                self.nodes.pop(name, None)
            else:
                self.nodes[name] = new
            if old != new:
                changed.add(name)
        return changed

    def _merge(self, name: str, pools: set[Pool], fresh: NodeDevices | None) -> NodeDevices | None:
        """The node's devices: those of untouched pools as they were, plus the recomputed ones."""
        kept = tuple(d for d in (self.nodes[name].devices if name in self.nodes else ())
                     if (d.key.driver, d.key.pool) not in pools)
        devices = tuple(sorted(kept + (fresh.devices if fresh else ()), key=lambda d: (d.key.pool, d.key.device)))
        return NodeDevices(node=name, devices=devices) if devices else None

    def node(self, name: str) -> NodeDevices | None:
        return self.nodes.get(name)


def unit_weight(unit: str) -> float:
    """How much of a physical GPU one DRA unit is (``kube.units``): a full GPU 1, a MIG device as the
    device plugin's slice of the same profile; DRA devices are not time-sliced, so no replicas."""
    return units.gpu_share(unit)


def node_load(node: NodeInfo, requested: dict[str, int], utilization: float | None,
              devices: NodeDevices | None) -> marks.NodeLoad:
    """``marks.node_load`` with the node's DRA devices counted in, once (see the module docstring)."""
    if devices is None or not devices.devices:
        return marks.node_load(node, requested, utilization)
    allocatable = dict(node.allocatable)
    plugin_used = sum(min(requested.get(r, 0), n) * marks.gpu_weight(node, r) for r, n in allocatable.items())
    dra_used = sum(count * unit_weight(unit) for unit, count in devices.held_units)
    physical = devices.gpus
    allocated = min((plugin_used + dra_used) / physical, 1.0) if physical else 1.0
    plugin_whole = marks.whole_free_gpus(node, {}) - marks.whole_free_gpus(node, requested)
    free = max(devices.whole_free - plugin_whole, 0)
    return marks.NodeLoad(free_gpus=free, allocated=allocated, utilization=utilization)


def is_gpu_node(node: NodeInfo, devices: NodeDevices | None) -> bool:
    """A node the balancer labels: device-plugin GPU resources, or NVIDIA DRA devices."""
    return node.is_gpu_node or bool(devices and devices.devices)

