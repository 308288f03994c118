"""The balancer's node labels in the replay, computed by the balancer's own code.

An adapter, not a copy: each replayed node is described to ``webhook.placement.marks`` as the
balancer would see it (``nvidia.com/gpu`` allocatable = its GPUs; requested = the GPUs that are no
longer whole-free, since a GPU carrying a share cannot be handed out whole), and
``marks.desired`` decides ``gpugate.io/gpu-free``, ``gpugate.io/gpu-load`` and the optional
congested taint. There is no utilization in the trace, so tiers come from allocation alone.

Labels lag: the replay relabels every K placements, and then only the nodes that changed since
the last relabel (as the balancer's dirty set does), so K models the balancer's interval.
"""

from __future__ import annotations

from webhook import names
from webhook.kube.gpunode import NodeInfo
from webhook.placement import marks, tiers
from webhook.replay.cluster import ClusterState
from webhook.replay.kubescheduler import KubeCluster, Taint

CONGESTED = Taint(names.CONGESTED_TAINT_KEY, "", "PreferNoSchedule")


class Relabeler:
    """Keeps the replayed nodes' balancer labels (and taint) as the balancer would write them."""

    def __init__(self, *, lag: int, thresholds: tiers.TierThresholds | None = None,
                 taint_congested: bool = False) -> None:
        self.lag = max(1, lag)
        self.thresholds = thresholds or tiers.TierThresholds()
        self.taint_congested = taint_congested
        self.placements = 0
        self.dirty: set[int] = set()
        self._memo: dict[tuple[int, int, str | None], marks.Marks] = {}

    def marks_for(self, state: ClusterState, node: int, previous_load: str | None) -> marks.Marks:
        gpus = int(state.gpu_count[node])
        if gpus == 0:
            return marks.Marks(free=None, load=None, tainted=False)
        touched = gpus - int((state.gpu_left[node] >= 1000).sum())
        # The marks read nothing else of the node (its name only names it): one answer per count.
        key = (gpus, touched, previous_load)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._marks(state, node, gpus, touched, previous_load)
        return found

    def _marks(self, state: ClusterState, node: int, gpus: int, touched: int, previous_load: str | None) -> marks.Marks:
        owned = ((names.GPU_LOAD_LABEL, previous_load),) if previous_load else ()
        info = NodeInfo(name=state.names[node], resource_version="", allocatable=((names.GPU_RESOURCE, gpus),),
                        owned_labels=owned, taints=(), replicas=1, hostnames=(state.names[node],))
        load = marks.node_load(info, {names.GPU_RESOURCE: touched}, None)
        return marks.desired(info, load, thresholds=self.thresholds, taint_congested=self.taint_congested)

    def apply(self, cluster: KubeCluster, nodes: list[int] | range) -> None:
        free: dict[int, str | None] = {}
        load: dict[int, str | None] = {}
        for node in nodes:
            wanted = self.marks_for(cluster.state, node, cluster.labels.value(node, names.GPU_LOAD_LABEL))
            free[node], load[node] = wanted.free, wanted.load
            others = tuple(t for t in cluster.taints[node] if t.key != names.CONGESTED_TAINT_KEY)
            cluster.taints[node] = others + ((CONGESTED,) if wanted.tainted else ())
        cluster.labels.update(names.GPU_FREE_LABEL, free)
        cluster.labels.update(names.GPU_LOAD_LABEL, load)

    def start(self, cluster: KubeCluster) -> None:
        self.apply(cluster, range(cluster.state.size))

    def placed(self, cluster: KubeCluster, node: int) -> None:
        """Count a placement; every ``lag`` placements, relabel the nodes that changed."""
        self.dirty.add(node)
        self.placements += 1
        if self.placements % self.lag == 0:
            self.apply(cluster, sorted(self.dirty))
            self.dirty.clear()
