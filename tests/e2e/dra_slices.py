"""ResourceSlices and DeviceClasses as NVIDIA's DRA driver publishes them, for fake GPU nodes.

There is no kubelet plugin here: a test publishes, with the admin client, the objects that
kubernetes-sigs/dra-driver-nvidia-gpu's ``gpu-kubelet-plugin`` would publish for the node's GPUs.
The shapes follow its source (read, not copied):

- driver ``gpu.nvidia.com``; one pool per node, named after the node
  (``cmd/gpu-kubelet-plugin/driver.go``, ``GenerateDriverResources``);
- a full GPU ``gpu-<minor>`` with ``type``, ``uuid``, ``productName``, ``brand``, ``architecture``
  (strings), ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion`` (semantic
  versions) and a ``memory`` capacity in bytes (``deviceinfo.go``: ``Attributes``, ``GetDevice``;
  ``partitions.go``: ``fullGpuCapacity``);
- consumable shares (``Gpu.consumable_shares``, the driver's ConsumableShares): the full GPU with
  ``allowMultipleAllocations`` and a ``memory`` capacity with a ``requestPolicy``
  (``consumable_shares.go``), which kube-scheduler's DRAConsumableCapacity (beta, on in 1.36) enforces;
- partitionable (dynamic MIG, Kubernetes >= 1.35): one slice holding only ``sharedCounters``, a
  counter set ``gpu-<minor>-counter-set`` per GPU (its capacities as counters, names in DNS form,
  plus ``memory-slice-<i>``), then one slice of devices per GPU: the full GPU consuming every
  counter, and each possible MIG placement ``gpu-<minor>-mig-<profile without dots>-<profile
  id>-<start>`` (``type: mig``, ``parentUUID``, ``profile``, the parent's product, architecture
  and versions; capacities ``memory``, ``multiprocessors`` and engines) consuming its share and
  its memory slices (``driver.go``: ``generateSplitResourceSlices``; ``partitions.go``;
  ``mig.go``: ``ToCanonicalName``, ``CommonAttributesMig``, ``CommonCapacitiesMig``).

The DeviceClasses are the chart's (``deployments/helm/dra-driver-nvidia-gpu/templates/
deviceclass-gpu.yaml``, ``deviceclass-mig.yaml``): the same CEL selectors, and
``extendedResourceName: nvidia.com/gpu`` on ``gpu.nvidia.com`` as the chart writes for
``resource.k8s.io/v1``.

The GPU figures (SM counts, engine counts, MIG memory) are an H100 80GB's as ``nvidia-smi mig
-lgip`` lists them, rounded where the API does not care; what the tests check is where they go.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from webhook import names

Obj = dict[str, Any]
API_VERSION = "resource.k8s.io/v1"
DRIVER = names.DRA_DRIVER
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile of a MIG-capable GPU, as NVML describes it."""

    name: str
    """``1g.10gb``: compute slices and memory, as nvidia-smi (and the driver's ``profile``) spell it."""
    profile_id: int
    memory_mib: int
    multiprocessors: int
    memory_slices: int
    """How many of the GPU's 8 memory slices one instance takes (its placement size)."""
    starts: tuple[int, ...]
    """Possible placement starts."""
    copy_engines: int = 1
    decoders: int = 1
    jpeg_engines: int = 1
    ofa_engines: int = 0


H100_PROFILES: tuple[MigProfile, ...] = (
    MigProfile("1g.10gb", 19, 9856, 16, 1, (0, 1, 2, 3, 4, 5, 6)),
    MigProfile("2g.20gb", 14, 19968, 32, 2, (0, 2, 4), copy_engines=2, decoders=2, jpeg_engines=2),
    MigProfile("3g.40gb", 9, 40192, 60, 4, (0, 4), copy_engines=3, decoders=3, jpeg_engines=3),
    MigProfile("7g.80gb", 0, 80896, 132, 8, (0,), copy_engines=7, decoders=7, jpeg_engines=7, ofa_engines=1),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    """One physical GPU as NVML reports it on the node."""

    minor: int
    uuid: str = ""
    product: str = "NVIDIA H100 80GB HBM3"
    brand: str = "Nvidia"
    architecture: str = "Hopper"
    cuda_compute_capability: str = "9.0.0"
    driver_version: str = "580.95.5"
    cuda_driver_version: str = "13.0.0"
    memory_mib: int = 81559
    multiprocessors: int = 132
    copy_engines: int = 8
    decoders: int = 7
    jpeg_engines: int = 7
    ofa_engines: int = 1
    memory_slices: int = 8
    mig_profiles: tuple[MigProfile, ...] = field(default=())
    """Non-empty for a MIG-capable GPU published as partitionable devices."""
    consumable_shares: str | None = None
    """The driver's ``--consumable-shares`` (feature gate ConsumableShares): ``memory`` publishes the
    full GPU with ``allowMultipleAllocations`` and a ``memory`` capacity whose requestPolicy is
    default = all of it, valid range 1Mi .. all of it in steps of 1Mi (``consumable_shares.go``,
    ``applyConsumableShares``): a claim asking ``capacity.requests.memory`` takes that much (rounded
    up to a MiB) and the scheduler keeps the sum within the device; a claim asking no capacity takes
    the default, the whole memory. ``unlimited`` is the same with default and minimum 0."""

    @property
    def name(self) -> str:
        return f"gpu-{self.minor}"

    @property
    def counter_set(self) -> str:
        return f"{self.name}-counter-set"


def gpus(count: int, *, node: str, mig: bool = False, first: int = 0, **fields: Any) -> list[Gpu]:
    """``count`` GPUs with stable UUIDs derived from the node name (so a republish is the same GPUs);
    minors from ``first`` (to mix kinds of GPU on one node)."""
    return [Gpu(minor=i, uuid=f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{node}/{i}')}",
                mig_profiles=H100_PROFILES if mig else (), **fields) for i in range(first, first + count)]


def _string(value: str) -> Obj:
    return {"string": value}


def _version(value: str) -> Obj:
    return {"version": value}


def _quantity(value: int) -> Obj:
    return {"value": str(value)}


def _bytes(mib: int) -> Obj:
    return {"value": f"{mib}Mi"}


def gpu_attributes(gpu: Gpu) -> Obj:
    return {"type": _string("gpu"), "uuid": _string(gpu.uuid), "productName": _string(gpu.product),
            "brand": _string(gpu.brand), "architecture": _string(gpu.architecture),
            "cudaComputeCapability": _version(gpu.cuda_compute_capability),
            "driverVersion": _version(gpu.driver_version), "cudaDriverVersion": _version(gpu.cuda_driver_version)}


def gpu_capacity(gpu: Gpu) -> Obj:
    """A full GPU's capacity: only ``memory`` without MIG, every dimension with partitions."""
    if not gpu.mig_profiles:
        return {"memory": _bytes(gpu.memory_mib)}
    return {"memory": _bytes(gpu.memory_mib), "multiprocessors": _quantity(gpu.multiprocessors),
            "copyEngines": _quantity(gpu.copy_engines), "decoders": _quantity(gpu.decoders),
            "encoders": _quantity(0), "jpegEngines": _quantity(gpu.jpeg_engines),
            "ofaEngines": _quantity(gpu.ofa_engines)}


def _counters(capacity: Obj, start: int, size: int) -> Obj:
    """Capacities as counters (names in DNS form, ``copyEngines`` -> ``copy-engines``) plus memory slices."""
    out: Obj = {}
    for name, value in capacity.items():
        dns = "".join(f"-{c.lower()}" if c.isupper() else c for c in name)
        out[dns] = dict(value)
    for i in range(start, start + size):
        out[f"memory-slice-{i}"] = {"value": "1"}
    return out


def shareable_memory(gpu: Gpu) -> Obj:
    """The ``memory`` capacity of a GPU published with consumable shares (see ``Gpu.consumable_shares``)."""
    whole = f"{gpu.memory_mib}Mi"
    floor = "1Mi" if gpu.consumable_shares == "memory" else "0"
    default = whole if gpu.consumable_shares == "memory" else "0"
    return {"value": whole, "requestPolicy": {"default": default,
                                              "validRange": {"min": floor, "max": whole, "step": "1Mi"}}}


def gpu_device(gpu: Gpu) -> Obj:
    device: Obj = {"name": gpu.name, "attributes": gpu_attributes(gpu), "capacity": gpu_capacity(gpu)}
    if gpu.consumable_shares:
        device["allowMultipleAllocations"] = True
        device["capacity"]["memory"] = shareable_memory(gpu)
    if gpu.mig_profiles:
        device["consumesCounters"] = [{"counterSet": gpu.counter_set,
                                       "counters": _counters(gpu_capacity(gpu), 0, gpu.memory_slices)}]
    return device


def mig_name(gpu: Gpu, profile: MigProfile, start: int) -> str:
    return f"{gpu.name}-mig-{profile.name.replace('.', '')}-{profile.profile_id}-{start}"


def mig_device(gpu: Gpu, profile: MigProfile, start: int) -> Obj:
    capacity = {"memory": _bytes(profile.memory_mib), "multiprocessors": _quantity(profile.multiprocessors),
                "copyEngines": _quantity(profile.copy_engines), "decoders": _quantity(profile.decoders),
                "encoders": _quantity(0), "jpegEngines": _quantity(profile.jpeg_engines),
                "ofaEngines": _quantity(profile.ofa_engines)}
    attributes = {"type": _string("mig"), "parentUUID": _string(gpu.uuid), "profile": _string(profile.name),
                  "productName": _string(gpu.product), "brand": _string(gpu.brand),
                  "architecture": _string(gpu.architecture),
                  "cudaComputeCapability": _version(gpu.cuda_compute_capability),
                  "driverVersion": _version(gpu.driver_version),
                  "cudaDriverVersion": _version(gpu.cuda_driver_version)}
    return {"name": mig_name(gpu, profile, start), "attributes": attributes, "capacity": capacity,
            "consumesCounters": [{"counterSet": gpu.counter_set,
                                  "counters": _counters(capacity, start, profile.memory_slices)}]}


def counter_set(gpu: Gpu) -> Obj:
    return {"name": gpu.counter_set, "counters": _counters(gpu_capacity(gpu), 0, gpu.memory_slices)}


def node_slices(node: str, found: list[Gpu], *, generation: int = 1) -> list[Obj]:
    """The node's pool: a counters-only slice first when any GPU is partitionable, then one slice of
    devices per GPU (the full GPU and, for a MIG-capable one, every MIG placement)."""
    partitionable = [g for g in found if g.mig_profiles]
    bodies: list[Obj] = []
    if partitionable:
        bodies.append({"sharedCounters": [counter_set(g) for g in partitionable]})
    for gpu in found:
        devices = [gpu_device(gpu)]
        for profile in gpu.mig_profiles:
            devices.extend(mig_device(gpu, profile, start) for start in profile.starts)
        bodies.append({"devices": devices})
    return [{"apiVersion": API_VERSION, "kind": "ResourceSlice",
             "metadata": {"name": f"{node}-{DRIVER}-{i}"},
             "spec": {"driver": DRIVER, "nodeName": node,
                      "pool": {"name": node, "generation": generation, "resourceSliceCount": len(bodies)},
                      **body}}
            for i, body in enumerate(bodies)]


def device_classes() -> list[Obj]:
    """The chart's two DeviceClasses for ``resource.k8s.io/v1``."""
    def cel(kind: str) -> list[Obj]:
        return [{"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                       f"device.attributes['{DRIVER}'].type == '{kind}'"}}]
    return [
        {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": names.DRA_GPU_CLASS},
         "spec": {"selectors": cel("gpu"), "extendedResourceName": names.GPU_RESOURCE}},
        {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": names.DRA_MIG_CLASS},
         "spec": {"selectors": cel("mig")}},
    ]


def claim_template(name: str, *, device_class: str = names.DRA_GPU_CLASS, count: int = 1,
                   selector: str | None = None) -> Obj:
    """A ResourceClaimTemplate asking ``count`` devices of ``device_class`` (optionally a CEL selector)."""
    exactly: Obj = {"deviceClassName": device_class, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"apiVersion": API_VERSION, "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}}


# ---- publishing through the API server (the harness's stand-in for the kubelet plugin) ---------------
def owned_by(node: Obj, bodies: list[Obj]) -> list[Obj]:
    """Each slice owned by its Node, as the driver's slice controller makes them: deleting the node
    lets the garbage collector delete its slices."""
    owner = {"apiVersion": "v1", "kind": "Node", "name": node["metadata"]["name"], "uid": node["metadata"]["uid"],
             "controller": True}
    return [{**body, "metadata": {**body["metadata"], "ownerReferences": [owner]}} for body in bodies]


def publish(api: Any, node_name: str, found: list[Gpu], *, generation: int = 1) -> list[Obj]:
    """Create the node's slices through the API server (kubernetes ``ApiClient``); returns them as stored."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    node = api.sanitize_for_serialization(core.read_node(node_name))
    resource = client.ResourceV1Api(api)
    stored = []
    for body in owned_by(node, node_slices(node_name, found, generation=generation)):
        made = resource.create_resource_slice(body, _preload_content=False)
        stored.append(json.loads(made.data))
    return stored


def unpublish(api: Any, node_name: str) -> None:
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    for item in resource.list_resource_slice(field_selector=f"spec.nodeName={node_name}").items:
        try:
            resource.delete_resource_slice(item.metadata.name)
        except client.ApiException as err:
            if err.status != 404:
                raise


def install_device_classes(api: Any) -> None:
    """The chart's DeviceClasses; an existing one (another test installed it) is left as it is."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    for body in device_classes():
        try:
            resource.create_device_class(body)
        except client.ApiException as err:
            if err.status != 409:
                raise
