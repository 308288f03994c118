"""The public names gpugate reads and writes (DESIGN.md section 3), in one place.

Every module that reads a pod label, writes a node label or matches an NVIDIA resource
imports it from here, so a rename is one edit and a typo is an ImportError, not a silent miss.
"""

from __future__ import annotations

API_GROUP = "gpugate.io"
POLICY_API_VERSION = "gpugate.io/v1alpha1"
POLICY_KIND = "GPUPolicy"

# Pod labels and annotations an ML engineer writes.
GPUS_LABEL = "gpugate.io/gpus"
# How much of a GPU the pod needs; a policy with `rightsizing` picks the smallest resource that gives it.
GPU_MEMORY_LABEL = "gpugate.io/gpu-memory"
GPU_FRACTION_LABEL = "gpugate.io/gpu-fraction"
PROFILE_LABEL = "gpugate.io/profile"
GROUP_LABEL = "gpugate.io/group"
SKIP_LABEL = "gpugate.io/skip"
CONTAINER_ANNOTATION = "gpugate.io/container"
# Labels that name the distributed job a pod belongs to, in the order they are read.
JOB_LABELS: tuple[str, ...] = (
    GROUP_LABEL,
    "batch.kubernetes.io/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
)

# Written by the webhook.
POLICY_ANNOTATION = "gpugate.io/policy"

# Written by the balancer on GPU nodes.
GPU_FREE_LABEL = "gpugate.io/gpu-free"
GPU_LOAD_LABEL = "gpugate.io/gpu-load"
CONGESTED_TAINT_KEY = "gpugate.io/congested"
REBALANCE_TAINT_KEY = "gpugate.io/rebalance"
"""NoSchedule, valued with the waiting pod's uid, on every node the rebalancer evicted pods from,
until that pod binds: only it tolerates the mark, so the evicted pods' replacements cannot land back."""
REBALANCED_REASON = "Rebalanced"
"""The reason of the Event the balancer writes on each pod it evicts."""
LOAD_TIERS: tuple[str, ...] = ("idle", "busy", "congested")

# Idle GPU allocations (docs/usage.md): the pod label that opts out of any reclaim, and the
# annotation the balancer writes where a policy's spec.idle.action is annotate.
NO_RECLAIM_LABEL = "gpugate.io/no-reclaim"
IDLE_ANNOTATION = "gpugate.io/idle"

# Profiles of the second scheduler (manifests/scheduler/scheduler-config.yaml).
EXTENDER_SCHEDULER_NAME = "gpugate"
"""The profile with kube-scheduler's default plugins plus the balancer's extender."""

# Labels NVIDIA's GPU feature discovery writes on nodes.
NVIDIA_PRODUCT_LABEL = "nvidia.com/gpu.product"
NVIDIA_MEMORY_LABEL = "nvidia.com/gpu.memory"
NVIDIA_FAMILY_LABEL = "nvidia.com/gpu.family"
NVIDIA_COUNT_LABEL = "nvidia.com/gpu.count"
NVIDIA_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
NVIDIA_SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
NVIDIA_CLIQUE_LABEL = "nvidia.com/gpu.clique"
NVIDIA_MIG_CONFIG_LABEL = "nvidia.com/mig.config"
NVIDIA_MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
# Written by the GPU Operator's driver upgrade state machine and NVIDIADriver ownership.
DRIVER_UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
DRIVER_OWNER_LABEL = "nvidia.com/gpu-operator.driver.owner"

# Extended resources the NVIDIA device plugin advertises.
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
NVIDIA_PREFIX = "nvidia.com/"
"""What every NVIDIA resource name starts with; not a GPU test by itself (see kube.resources)."""
# The taint GPU node pools conventionally carry.
GPU_TAINT_KEY = "nvidia.com/gpu"


# Dynamic Resource Allocation (resource.k8s.io/v1): the NVIDIA DRA driver's names
# (kubernetes-sigs/dra-driver-nvidia-gpu: cmd/gpu-kubelet-plugin/main.go DriverName, deviceinfo.go
# and mig.go device attributes, deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-*.yaml).
DRA_DRIVER = "gpu.nvidia.com"
DRA_GPU_CLASS = "gpu.nvidia.com"
DRA_MIG_CLASS = "mig.nvidia.com"
DRA_PRODUCT_ATTRIBUTE = "productName"
"""NVML's device name with spaces ("NVIDIA H100 80GB HBM3"); GFD's nvidia.com/gpu.product is it with '-'."""
DRA_ARCHITECTURE_ATTRIBUTE = "architecture"
"""NVML's architecture name ("Hopper", "Ampere"); GFD's nvidia.com/gpu.family is it in lower case."""
DRA_MEMORY_CAPACITY = "memory"
"""Device memory in bytes: the whole GPU's, or a MIG device's own."""
DRA_PROFILE_ATTRIBUTE = "profile"
"""A MIG device's profile ("1g.10gb")."""

# Right-sizing through DRA: the webhook names a ResourceClaimTemplate per ladder and ask
# (its name is a hash of its content), labels the pod with that name and carries the template in an
# annotation; the balancer creates the template in the pod's namespace when it is missing.
RIGHTSIZED_CLAIM = "gpugate-gpu"
"""The pod's ``spec.resourceClaims[].name`` (and its container's ``resources.claims[].name``)."""
CLAIM_TEMPLATE_LABEL = "gpugate.io/claim-template"
"""On a right-sized pod: the ResourceClaimTemplate it references; the balancer watches pods with it."""
CLAIM_TEMPLATE_ANNOTATION = "gpugate.io/claim-template"
"""On a right-sized pod: that template as JSON (the balancer creates it from this, after checking
that its name is the hash of this content)."""
RIGHTSIZED_TEMPLATE_PREFIX = "gpugate-rightsized-"
DRA_SHARE_SELECTOR = "device.allowMultipleAllocations == true"
"""A device that can be shared by capacity (the driver's ConsumableShares)."""


# Health quarantine (webhook/balancer/quarantine*.py, docs/health.md).
UNHEALTHY_TAINT_KEY = "gpugate.io/gpu-unhealthy"
"""On a quarantined device (DeviceTaintRule) or, under the device plugin, on its node."""
HEALTH_LEDGER = "gpugate-health"
"""The ConfigMap in the balancer's namespace holding every quarantine, its history and operator releases."""
DRA_XID_TAINT_KEY = "gpu.nvidia.com/xid"
"""NVIDIA's DRA driver taints a device with this key, the XID as value (``device_health.go``)."""
DRA_GPU_LOST_TAINT_KEY = "gpu.nvidia.com/gpu-lost"
"""...and with this one when NVML loses the GPU."""
