"""Trace rows as the Kubernetes objects a real cluster would hold: Pods and node labels.

How a trace pod becomes a Pod (documented in docs/placement.md):
  * namespace ``ml-replay``; one regular container ``main`` with cpu and memory requests;
  * whole-GPU pods (gpu_milli 1000) request ``nvidia.com/gpu: N`` (requests == limits) and carry
    ``gpugate.io/profile: training``;
  * GPU-sharing pods (gpu_milli < 1000) request one time-sliced slot, ``nvidia.com/gpu.shared: 1``,
    carry ``gpugate.io/profile: notebook``, and the trace's share in the replay-only annotation
    ``replay.gpugate.io/gpu-milli`` (Kubernetes itself has no fractional GPU quantity; the replay's
    device accounting reads it);
  * ``gpu_spec`` becomes required node affinity ``nvidia.com/gpu.product In [...]``.
Nodes get the labels GPU feature discovery writes (product, memory, family, count) from the model.
"""

from __future__ import annotations

from typing import Any

from webhook import names
from webhook.replay.records import MILLI, NodeRecord, TracePod

NAMESPACE = "ml-replay"
GPU_MILLI_ANNOTATION = "replay.gpugate.io/gpu-milli"
WHOLE_GPU_PROFILE = "training"
SHARED_GPU_PROFILE = "notebook"
# GPU feature discovery product names for the trace's models (G2/G3 are undisclosed internal codes).
PRODUCTS = {"P100": "Tesla-P100-PCIE-16GB", "T4": "Tesla-T4", "V100M16": "Tesla-V100-SXM2-16GB",
            "V100M32": "Tesla-V100-SXM2-32GB", "A10": "NVIDIA-A10", "G2": "ALIBABA-G2", "G3": "ALIBABA-G3"}
# MiB per GPU, from the FGD artifact's model table; unknown for G2/G3, so no memory label there.
MEMORY_MIB = {"P100": 16280, "T4": 15109, "V100M16": 16160, "V100M32": 32510, "A10": 22731}
FAMILIES = {"P100": "pascal", "T4": "turing", "V100M16": "volta", "V100M32": "volta", "A10": "ampere"}


def product_of(model: str) -> str:
    return PRODUCTS.get(model, model)


def node_labels(node: NodeRecord) -> dict[str, str]:
    """The static labels of a trace node (the balancer's labels are added by the replay loop)."""
    found = {"kubernetes.io/hostname": node.name}
    if node.gpus:
        found[names.NVIDIA_PRODUCT_LABEL] = product_of(node.model)
        found[names.NVIDIA_COUNT_LABEL] = str(node.gpus)
        if node.model in MEMORY_MIB:
            found[names.NVIDIA_MEMORY_LABEL] = str(MEMORY_MIB[node.model])
        if node.model in FAMILIES:
            found[names.NVIDIA_FAMILY_LABEL] = FAMILIES[node.model]
    return found


def pod_for(record: TracePod, *, namespace: str = NAMESPACE) -> dict[str, Any]:
    """A Pod object for one trace row, as a user (not yet the webhook) would write it."""
    requests: dict[str, str] = {"cpu": f"{record.cpu_milli}m", "memory": f"{record.memory_mib}Mi"}
    limits: dict[str, str] = {}
    labels = {"app.kubernetes.io/name": "replay", "replay.gpugate.io/qos": record.qos or "none"}
    annotations: dict[str, str] = {}
    if record.num_gpu and record.gpu_milli >= MILLI:
        requests[names.GPU_RESOURCE] = limits[names.GPU_RESOURCE] = str(record.num_gpu)
        labels[names.PROFILE_LABEL] = WHOLE_GPU_PROFILE
    elif record.num_gpu:
        requests[names.SHARED_GPU_RESOURCE] = limits[names.SHARED_GPU_RESOURCE] = "1"
        labels[names.PROFILE_LABEL] = SHARED_GPU_PROFILE
        annotations[GPU_MILLI_ANNOTATION] = str(record.gpu_milli)
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    spec: dict[str, Any] = {
        "schedulerName": "default-scheduler",
        "containers": [{"name": "main", "image": "registry.example/replay:latest", "resources": resources}],
    }
    if record.gpu_spec:
        products = sorted({product_of(model) for model in record.gpu_spec})
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": names.NVIDIA_PRODUCT_LABEL, "operator": "In", "values": products}]}]}}}
    metadata: dict[str, Any] = {"name": record.name, "namespace": namespace, "labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
