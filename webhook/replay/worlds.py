"""The two sharing worlds a trace's GPU shares are replayed in (``--sharing``). Pure.

The trace's fractional pods (``gpu_milli`` < 1000) ask part of a GPU. Kubernetes has no fractional
GPU quantity, so what a share *is* depends on how the cluster serves it:

* **timeslice** (what ``manifests/`` ship): NVIDIA's device plugin with the ``time-slicing-4``
  config of ``manifests/gpu-operator/values.yaml``: ``renameByDefault: true``, 4 replicas,
  ``sharedDevicesAllocationPolicy: packed``. A node with that config advertises only
  ``nvidia.com/gpu.shared: 4 x GPUs`` (no ``nvidia.com/gpu``), so whole-GPU pods never land on
  it and a share is one slot, an integer kube-scheduler counts like any extended resource,
  whatever the trace says it needs. The device plugin gives the slot to the GPU with the most
  replicas taken (``packed``). A slot isolates no memory: a share whose trace ask is larger
  than a slot (1/4 GPU) is *overcommitted*. Which nodes carry the config is the operator's
  choice; here (``sliced_nodes``) each GPU model gets time-sliced nodes in proportion to what the
  pod list asks of it in slots against whole GPUs, the nodes taken in one fixed permutation
  (seed 0), so every arm and seed of a list sees the same cluster. The pod carries no size:
  nothing but ``nvidia.com/gpu.shared: 1`` reaches the scheduler or the extender.
* **dra**: every GPU is a DRA device of NVIDIA's driver (``gpu.nvidia.com``) that allows multiple
  allocations (consumable capacity, KEP-5075), with a ``memory`` capacity. A share is a
  ResourceClaim for the trace's fraction of the GPU's memory: one ``firstAvailable`` sub-request
  per GPU product, each selecting that product and asking that fraction of its memory
  (``share_template``), so on every node the claim is the trace's fraction of that node's GPU.
  kube-scheduler's DynamicResources plugin allocates it on the first device, in name order,
  with that much memory left (``placement.devices`` ``first``). Whole-GPU pods keep
  ``nvidia.com/gpu: N``, which the chart's DeviceClass maps onto DRA (extended-resource
  mapping): whole devices, again first fit. The extender reads the devices from the
  ResourceSlices each node publishes (``node_slice``) and the allocated claims
  (``allocated_claim``) through ``kube.nodedevices`` and ``placement.dra``, as the balancer does.

Memory per GPU model: the FGD artifact's table (``workload.MEMORY_MIB``); the undisclosed G2/G3
are given 16 GiB. Any value gives the same decisions, since every ask is a fraction of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from webhook import names
from webhook.kube import allocations, claims, slices, units
from webhook.kube import demand as kube_demand
from webhook.kube.allocations import DeviceKey
from webhook.kube.demand import PodDemand
from webhook.placement import dra as placement_dra
from webhook.placement.devices import Serves, serves_of
from webhook.replay import demand as demand_reading
from webhook.replay import workload
from webhook.replay.cluster import ClusterState
from webhook.replay.kubescheduler import KubeCluster, PodView
from webhook.replay.nodelabels import NodeLabels
from webhook.replay.records import MILLI, NodeRecord, Trace, TracePod
from webhook.replay.runspec import DRA, PUBLISHED, TIMESLICE, RunSpec

MIB = 2**20
UNDISCLOSED_MEMORY_MIB = 16384
SHARE_CLAIM = "gpu-share"
"""The pod's ``spec.resourceClaims`` entry (and ``resources.claims``) a DRA share uses."""
TEMPLATE_PREFIX = "gpu-share-"


# --- timeslice ------------------------------------------------------------------------------------

def slot_milli(replicas: int = units.DEFAULT_SLOT_REPLICAS) -> int:
    return units.slot_milli(replicas)


def sliced_nodes(nodes: Sequence[NodeRecord], pods: Sequence[TracePod],
                 replicas: int = units.DEFAULT_SLOT_REPLICAS) -> tuple[bool, ...]:
    """Which nodes carry the time-slicing config (see the module docstring)."""
    gpus_of: dict[str, int] = {}
    for node in nodes:
        if node.gpus:
            gpus_of[node.model] = gpus_of.get(node.model, 0) + node.gpus
    slots = dict.fromkeys(gpus_of, 0.0)
    whole = dict.fromkeys(gpus_of, 0.0)
    slot = slot_milli(replicas)
    for pod in pods:
        if not pod.num_gpu:
            continue
        allowed = [m for m in pod.gpu_spec if m in gpus_of] or list(gpus_of)
        supply = sum(gpus_of[m] for m in allowed)
        for model in allowed:
            part = gpus_of[model] / supply
            if pod.shares_gpu:
                slots[model] += slot * part
            else:
                whole[model] += pod.num_gpu * MILLI * part
    order = np.random.default_rng(0).permutation(len(nodes)).tolist()
    out = [False] * len(nodes)
    for model, total in gpus_of.items():
        asked = slots[model] + whole[model]
        target = total * slots[model] / asked if asked else 0.0
        taken = 0
        for index in order:
            node = nodes[index]
            if node.gpus and node.model == model and taken + node.gpus / 2 <= target:
                out[index] = True
                taken += node.gpus
    return tuple(out)


def timeslice_labels(labels: dict[str, str], replicas: int = units.DEFAULT_SLOT_REPLICAS) -> dict[str, str]:
    """A time-sliced node's labels: GPU feature discovery's sharing labels added."""
    return {**labels, names.NVIDIA_SHARING_LABEL: "time-slicing", names.NVIDIA_REPLICAS_LABEL: str(replicas)}


def pod_for(record: TracePod, sharing: str) -> dict[str, Any]:
    """The trace row as its author writes it in this world: no replay-only size annotation; in
    dra a share asks through its claim (``share_template``) instead of a slot."""
    pod = workload.pod_for(record)
    pod["metadata"].get("annotations", {}).pop(workload.GPU_MILLI_ANNOTATION, None)
    if not pod["metadata"].get("annotations"):
        pod["metadata"].pop("annotations", None)
    if sharing == "dra" and record.shares_gpu:
        container = pod["spec"]["containers"][0]
        for key in ("requests", "limits"):
            section = container["resources"].get(key, {})
            for resource in [r for r in section if units.is_shared(r)]:
                del section[resource]
        if not container["resources"].get("limits"):
            container["resources"].pop("limits", None)
        claims.add_template_claim(pod, SHARE_CLAIM, template_name(record.gpu_milli))
    return pod


# --- dra ------------------------------------------------------------------------------------------

def memory_mib(model: str) -> int:
    return workload.MEMORY_MIB.get(model, UNDISCLOSED_MEMORY_MIB)


def memory_bytes(model: str) -> int:
    return memory_mib(model) * MIB


def fraction_bytes(milli: int, model: str) -> int:
    """The memory a share of ``milli`` thousandths asks on ``model``, in bytes, rounded down, so the
    shares that fit a GPU in thousandths fit its memory and the reverse (a capacity of ~10^10
    bytes loses less than one thousandth to the rounding)."""
    return milli * memory_bytes(model) // MILLI


def template_name(milli: int) -> str:
    return f"{TEMPLATE_PREFIX}{milli}"


def subrequest_name(model: str) -> str:
    """A DNS label per GPU model (``v100m16``)."""
    return model.lower().replace("_", "-")


def share_ask(milli: int, models: Sequence[str]) -> claims.ClaimAsk:
    """The claim a share of ``milli`` writes: per model, that fraction of its memory, on that product."""
    subs = tuple(claims.DeviceAsk(name=f"gpu/{subrequest_name(m)}", device_class=names.DRA_GPU_CLASS,
                                  selectors=(claims.product_selector((workload.product_of(m),)),),
                                  capacity=((names.DRA_MEMORY_CAPACITY, str(fraction_bytes(milli, m))),),
                                  sub_request=True)
                 for m in models)
    return claims.ClaimAsk(kind=claims.TEMPLATE_KIND, name=template_name(milli),
                           requests=(claims.ClaimRequest(name="gpu", first_available=subs),))


def share_template(milli: int, models: Sequence[str], namespace: str = workload.NAMESPACE) -> dict[str, Any]:
    """The ResourceClaimTemplate of ``share_ask`` as the API stores it."""
    ask = share_ask(milli, models)
    return {"apiVersion": claims.API_VERSION, "kind": claims.TEMPLATE_KIND,
            "metadata": {"name": ask.name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [claims.render_request(r) for r in ask.requests]}}}}


def memory_by_subrequest(models: Sequence[str]) -> dict[str, int]:
    """What ``placement.dra.share_milli`` divides by: each sub-request's product memory."""
    return {subrequest_name(m): memory_bytes(m) for m in models}


def node_slice(node: NodeRecord) -> slices.Slice:
    """The ResourceSlice NVIDIA's driver would publish for the node: one pool per node, a shared
    (consumable-capacity) device per GPU, ``gpu-0`` ... in minor order."""
    product = workload.product_of(node.model).replace("-", " ")
    memory = str(memory_bytes(node.model))
    devices = tuple(slices.Device(
        name=f"gpu-{minor}",
        attributes=(("productName", slices.Attribute("string", product)), ("type", slices.Attribute("string", "gpu")),
                    ("uuid", slices.Attribute("string", f"GPU-{node.name}-{minor}"))),
        capacity=((names.DRA_MEMORY_CAPACITY, memory),), multiple_allocations=True) for minor in range(node.gpus))
    return slices.Slice(name=f"{node.name}-gpu.nvidia.com", driver=names.DRA_DRIVER, pool=node.name, generation=1,
                        slice_count=1, node=node.name, devices=devices)


def allocated_claim(key: str, node: NodeRecord, gpus: Sequence[int], milli: int) -> allocations.Claim:
    """The claim kube-scheduler allocated for a bound pod: a share's memory on one device, or whole
    devices (their full memory: a request with no capacity asks all of a shared device's)."""
    memory = fraction_bytes(milli, node.model) if milli < MILLI else memory_bytes(node.model)
    results = tuple(allocations.Allocated(request="gpu", key=DeviceKey(names.DRA_DRIVER, node.name, f"gpu-{g}"),
                                          consumed=((names.DRA_MEMORY_CAPACITY, str(memory)),)) for g in gpus)
    namespace, _, name = key.partition("/")
    return allocations.Claim(namespace=namespace, name=f"{name}-gpu", uid=key, results=results, allocated=True,
                             reserved_for=(allocations.Consumer(resource="pods", name=name, uid=key),))


# --- a run's world ---------------------------------------------------------------------------------

class World:
    """What a run's sharing world changes: the nodes, how a pod is written and read, the device rule."""

    def __init__(self, trace: Trace, sharing: str, spec: RunSpec) -> None:
        self.sharing = sharing
        self.replicas = spec.share_replicas
        self.slot = slot_milli(self.replicas) if sharing == TIMESLICE else None
        self.sliced = sliced_nodes(trace.nodes, trace.pods, self.replicas) if sharing == TIMESLICE else None
        self.models = sorted({node.model for node in trace.nodes if node.gpus})
        self.gpus = [node.gpus for node in trace.nodes]
        self.memory_of = memory_by_subrequest(self.models)
        self.device_policy = "first" if sharing == DRA else spec.device_policy
        self._asks: dict[int, int] = {}

    def serves(self, node: int) -> Serves:
        """What the node's allocatable tells the extender it takes (``devices.serves_of``, the rule
        the balancer applies): in timeslice a time-sliced node advertises only
        ``nvidia.com/gpu.shared``, the others only ``nvidia.com/gpu``; in dra and the published
        model any GPU takes either."""
        if self.sliced is None:
            return "any"
        gpus = self.gpus[node]
        return serves_of(0, gpus * self.replicas) if self.sliced[node] else serves_of(gpus, 0)

    def pod_for(self, record: TracePod) -> dict[str, Any]:
        if self.sharing == PUBLISHED:
            return workload.pod_for(record)
        return pod_for(record, self.sharing)

    def claim_milli(self, milli: int) -> int:
        """A share claim's size as the scheduler and the extender read it from its template."""
        if milli not in self._asks:
            self._asks[milli] = placement_dra.share_milli(share_ask(milli, self.models), self.memory_of)
        return self._asks[milli]

    def view(self, pod: dict[str, Any], record: TracePod) -> PodView:
        found = demand_reading.view(pod, slot_milli=self.slot)
        if self.sharing == DRA and record.shares_gpu and kube_demand.claim_refs(pod):
            demand = dataclasses.replace(found.demand, share_milli=self.claim_milli(record.gpu_milli))
            # The claim's sub-requests, one per GPU model in this order (share_ask): what
            # kube-scheduler's DynamicResources plugin scores nodes by (kubescheduler.dynamic_resources_score).
            found = dataclasses.replace(found, demand=demand, claim_models=tuple(self.models))
        return found

    def extender_demand(self, pod: dict[str, Any], view: PodView, record: TracePod) -> PodDemand:
        """The extender's reading of an admitted Pod: its requests, and in dra its share claim; in the
        published model (no world) a share's size from the replay's annotation, via the view."""
        found = kube_demand.of_pod(pod, slot_milli=self.slot or kube_demand.DEFAULT_SLOT_MILLI)
        if self.sharing in (PUBLISHED, DRA) and view.demand.shares_gpu:
            return dataclasses.replace(found, share_milli=view.demand.share_milli, gpus=0)
        return found

    def cluster(self, trace: Trace) -> KubeCluster:
        state = ClusterState(trace.nodes, sliced=self.sliced)
        labels = [workload.node_labels(node) for node in trace.nodes]
        if self.sliced is not None:
            labels = [timeslice_labels(found, self.replicas) if sliced else found
                      for found, sliced in zip(labels, self.sliced, strict=True)]
        return KubeCluster(state=state, labels=NodeLabels(state.names, labels))
