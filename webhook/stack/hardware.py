"""Preflight rules on what the nodes are (hardware, kernel, platform) against what the change puts on them. Pure.

The facts are few and each carries its source; a node says what it is through the labels NFD and
GPU Feature Discovery write and its ``status.nodeInfo``:

* ``driver-hardware``: a driver branch known broken on an instance type (R595 and AWS P6e EFA:
  NVIDIA/aicr#2383, #2439; NVIDIA's AICR holds those nodes at 580.173.02);
* ``kernel-modules``: proprietary kernel modules on GPUs that run only the open ones (Blackwell and
  Grace Hopper; NVIDIA/gpu-operator#1947 shows the symptom, "No devices were found");
* ``precompiled-kernel``: precompiled drivers on an OS or kernel flavour NVIDIA builds none for
  (cloud-native-docs gpu-operator/precompiled-drivers.rst and platform-support.rst, 26.7.0);
* ``toolkit-platform``: the operator's toolkit on GKE 1.33 or newer without
  ``RUNTIME_CONFIG_SOURCE=file`` (NVIDIA/nvidia-container-toolkit#1222, cloud-native-docs google-gke.rst);
* ``control-plane-gpu``: a toolkit restart on a GPU node that is also a control-plane node
  (NVIDIA/nvidia-container-toolkit#1040: the toolkit's containerd edits took etcd and the API server down).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from webhook.names import NVIDIA_FAMILY_LABEL, NVIDIA_PRODUCT_LABEL
from webhook.stack.change import Change, needs_cluster, reloaded_pools
from webhook.stack.clusterstate import ClusterSnapshot, KubeObject, labels_of, name_of, status_of
from webhook.stack.compat import Check, verdict
from webhook.stack.hardening import component_env
from webhook.stack.releases import driver_branch

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
OS_ID_LABEL = "feature.node.kubernetes.io/system-os_release.ID"
OS_VERSION_LABEL = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
KERNEL_LABEL = "feature.node.kubernetes.io/kernel-version.full"
CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")


@dataclass(frozen=True)
class HardwareBlock:
    """A driver branch that does not work on nodes whose label matches a pattern."""

    branch: int
    label: str
    pattern: str
    why: str
    fix: str
    source: str


HARDWARE_BLOCKS: tuple[HardwareBlock, ...] = (
    HardwareBlock(branch=595, label=INSTANCE_TYPE_LABEL, pattern=r"^p6e-gb[23]00\.",
                  why="R595 dropped NVreg_GrdmaPciTopoCheckOverride: NCCL over EFA aborts with 'dma-buf attach "
                      "failed: topology not supported' on P6e-GB200/GB300 (deployment and conformance still pass)",
                  fix="keep these nodes on R580 in a pool of their own (NVIDIA's AICR holds them at 580.173.02)",
                  source="NVIDIA/aicr#2383, #2439"),
)
OPEN_ONLY_FAMILIES = ("blackwell",)
OPEN_ONLY_PRODUCTS = ("GH200", "GB200", "GB300")
# Ubuntu release -> the kernel flavours NVIDIA builds precompiled drivers for, and the branches.
PRECOMPILED: Mapping[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "26.04": (("generic", "nvidia", "azure", "azure-fde", "aws", "oracle"), (595,)),
    "24.04": (("generic", "nvidia", "azure", "azure-fde", "aws", "oracle"), (580, 595)),
    "22.04": (("generic", "nvidia", "azure", "aws", "oracle"), (580, 595)),
}
GKE_TOOLKIT_FLOOR = 33
RUNTIME_CONFIG_SOURCE = ("RUNTIME_CONFIG_SOURCE", "file")


def _pools_nodes(change: Change) -> dict[str, list[KubeObject]]:
    """Pool -> its GPU nodes, for the pools whose driver this change sets or reloads."""
    state = change.context.cluster
    assert state is not None
    pools = set(change.pools) | set(reloaded_pools(change))
    by_pool: dict[str, list[KubeObject]] = {p: [] for p in sorted(pools)}
    names = state.pool_nodes(change.final, pools)
    for node in state.gpu_nodes():
        if name_of(node) in names:
            by_pool[names[name_of(node)]].append(node)
    return by_pool


@needs_cluster
def check_driver_hardware(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "driver-hardware"
    failed = []
    for pool, nodes in _pools_nodes(change).items():
        branch = int(driver_branch(change.final.pool(pool).driver))
        for block in HARDWARE_BLOCKS:
            hit = sorted(name_of(n) for n in nodes if block.branch == branch
                         and re.search(block.pattern, labels_of(n).get(block.label, "")))
            if hit:
                failed.append(Check(name=name, subject=pool, ok=False, source=block.source, fix=block.fix,
                                    reason=f"driver {change.final.pool(pool).driver} (R{branch}) on "
                                           f"{', '.join(hit)} ({block.label} {labels_of(nodes[0]).get(block.label)}"
                                           f"...): {block.why}"))
    return failed or [Check(name=name, ok=True, reason="no driver branch known broken on these nodes' hardware")]


def _kernel_module_type(change: Change) -> str:
    driver = (change.context.values or {}).get("driver")
    return str(driver.get("kernelModuleType", "auto")) if isinstance(driver, Mapping) else "auto"


@needs_cluster
def check_kernel_modules(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "kernel-modules"
    if change.final.management != "clusterpolicy" or _kernel_module_type(change) != "proprietary":
        return [Check(name=name, ok=True, reason="kernelModuleType is not proprietary")]
    hit = sorted(f"{name_of(n)} ({labels_of(n).get(NVIDIA_PRODUCT_LABEL, '?')})"
                 for nodes in _pools_nodes(change).values() for n in nodes
                 if labels_of(n).get(NVIDIA_FAMILY_LABEL, "").lower() in OPEN_ONLY_FAMILIES
                 or any(p in labels_of(n).get(NVIDIA_PRODUCT_LABEL, "") for p in OPEN_ONLY_PRODUCTS))
    return verdict(name, [", ".join(hit)] if hit else [], source="NVIDIA/gpu-operator#1947; NVIDIA "
                   "open-gpu-kernel-modules", passed="no node with GPUs that need the open kernel modules",
                   failed="driver.kernelModuleType proprietary on {found}, whose GPUs run only the open kernel "
                          "modules: the driver loads and nvidia-smi says 'No devices were found'",
                   fix="set driver.kernelModuleType to auto (or open) in values.yaml")


def _precompiled_problem(node: KubeObject, branch: int) -> str:
    labels = labels_of(node)
    os_id, version, kernel = labels.get(OS_ID_LABEL, "?"), labels.get(OS_VERSION_LABEL, "?"), labels.get(
        KERNEL_LABEL, "")
    if os_id != "ubuntu" or version not in PRECOMPILED:
        return f"{name_of(node)}: {os_id} {version} has no precompiled driver images"
    flavours, branches = PRECOMPILED[version]
    if not any(kernel.endswith("-" + f) for f in flavours):
        return f"{name_of(node)}: kernel {kernel or '(unknown)'} is not one of the flavours {', '.join(flavours)}"
    if branch not in branches:
        return f"{name_of(node)}: no R{branch} precompiled images for Ubuntu {version}"
    return ""


@needs_cluster
def check_precompiled_kernel(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "precompiled-kernel"
    problems = []
    for pool, nodes in _pools_nodes(change).items():
        spec = change.final.pool(pool)
        if spec.use_precompiled:
            problems += [p for n in nodes if (p := _precompiled_problem(n, int(driver_branch(spec.driver))))]
    return verdict(name, sorted(problems), source="cloud-native-docs gpu-operator/precompiled-drivers.rst, "
                   "platform-support.rst (26.7.0); NVIDIA/gpu-operator#300",
                   passed="no precompiled pool on a kernel NVIDIA builds none for",
                   failed="precompiled drivers where NVIDIA publishes no image: {found}. The driver pod cannot pull "
                          "<branch>-<kernel>-<os>",
                   fix="set usePrecompiled false for that pool (a new crName: the field is immutable), or build "
                       "the precompiled image for that kernel into your own registry")


def _gke_minor(node: KubeObject) -> int | None:
    version = str((status_of(node).get("nodeInfo") or {}).get("kubeletVersion") or "")
    found = re.match(r"^v1\.(\d+)\.\d+-gke", version)
    return int(found.group(1)) if found else None


@needs_cluster
def check_toolkit_platform(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "toolkit-platform"
    values = change.context.values or {}
    toolkit = values.get("toolkit")
    if isinstance(toolkit, Mapping) and toolkit.get("enabled") is False:
        return [Check(name=name, ok=True, reason="the container toolkit is not the operator's")]
    gke = sorted(f"{name_of(n)} (1.{m})" for n in state.gpu_nodes()
                 if (m := _gke_minor(n)) is not None and m >= GKE_TOOLKIT_FLOOR)
    key, wanted = RUNTIME_CONFIG_SOURCE
    if not gke or component_env(values, "toolkit").get(key) == wanted:
        return [Check(name=name, ok=True, reason="no GKE 1.33+ node, or the toolkit reads containerd's config file")]
    return [Check(name=name, ok=False, source="NVIDIA/nvidia-container-toolkit#1222; cloud-native-docs google-gke.rst",
                  reason=f"GKE {', '.join(gke)}: the toolkit derives containerd's config from 'containerd config "
                         f"dump' and writes a CNI section GKE's containerd 2 cannot load (sandboxes fail with "
                         f"'failed to find plugin \"gke\"')",
                  fix=f"add {{name: {key}, value: {wanted}}} to toolkit.env in values.yaml")]


@needs_cluster
def check_control_plane_gpu(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "control-plane-gpu"
    values = change.context.values or {}
    toolkit = values.get("toolkit")
    restarts = change.operator_moves or "toolkit" in change.final.components and (
        change.final.components.get("toolkit") != change.current.components.get("toolkit"))
    nodes = sorted(name_of(n) for n in state.gpu_nodes() if any(k in labels_of(n) for k in CONTROL_PLANE_LABELS))
    if not nodes or not restarts or (isinstance(toolkit, Mapping) and toolkit.get("enabled") is False):
        return [Check(name=name, ok=True, reason="no toolkit restart on a control-plane GPU node")]
    return [Check(name=name, ok=True, source="NVIDIA/nvidia-container-toolkit#1040",
                  reason=f"the toolkit restarts on {', '.join(nodes)}, GPU nodes that also run the control plane",
                  fix="schedule it like a control-plane maintenance, or manage the toolkit on the host "
                      "(toolkit.enabled false)",
                  warning=f"the container toolkit restarts containerd on {', '.join(nodes)}, which also run the "
                          f"control plane: its edits once took etcd and the API server down "
                          f"(NVIDIA/nvidia-container-toolkit#1040); plan it as control-plane maintenance")]
