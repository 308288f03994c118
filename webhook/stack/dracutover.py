"""Preflight rule on the GPU Operator's DRA stack (``GPUCluster``, v26.7.0) enabled where it cannot work. Pure.

The cut-over is one step: the GPUCluster replaces GFD, the device plugin, the validator and the MIG
manager, and cannot run next to a ClusterPolicy (cloud-native-docs release-notes.rst 26.7.0;
NVIDIA/gpu-operator#2716). Field reports name what it does not carry over:

* a driver root other than ``/`` or ``/run/nvidia/driver`` reaches only one init container; the DRA
  plugin writes CDI specs rooted at ``/`` and pods fail to start (nicolerenee/infra#2394, Talos);
* time-slicing ``replicas`` have no DRA equivalent: DRA time-slicing only sets the slice length
  (jfroy/flatops#2620), so shared GPUs become whole ones;
* MIG layouts applied by the MIG manager, which the GPUCluster removes;
* Kubernetes older than 1.34 (the release's floor for the DRA stack).

``dra-cutover`` fails listing every blocker when the values deploy a GPUCluster (or one exists).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from webhook.names import NVIDIA_MIG_CONFIG_LABEL
from webhook.stack.change import Change
from webhook.stack.clusterstate import labels_of, name_of
from webhook.stack.compat import Check

STANDARD_DRIVER_ROOTS = ("/", "/run/nvidia/driver")
DRA_KUBERNETES_FLOOR = 34
MIG_OFF = ("", "all-disabled")


def _section(values: Mapping[str, Any], *path: str) -> Any:
    node: Any = values
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def deploys_gpucluster(values: Mapping[str, Any]) -> bool:
    return _section(values, "gpuCluster", "deployCR") is True


def _time_slicing(values: Mapping[str, Any]) -> list[str]:
    """Device-plugin configs of ``devicePlugin.config.data`` that share a GPU by time-slicing replicas."""
    found = []
    for key, text in (_section(values, "devicePlugin", "config", "data") or {}).items():
        try:
            config = yaml.safe_load(str(text)) or {}
        except yaml.YAMLError:
            continue
        resources = _section(config, "sharing", "timeSlicing", "resources") or []
        replicas = [r.get("replicas") for r in resources if isinstance(r, Mapping)]
        if any(isinstance(n, int) and n > 1 for n in replicas):
            found.append(f"devicePlugin config {key!r} ({', '.join(str(n) for n in replicas)} replicas)")
    return found


def blockers(change: Change) -> list[str]:
    values = change.context.values or {}
    found = []
    root = _section(values, "hostPaths", "driverInstallDir")
    if isinstance(root, str) and root.rstrip("/") not in {r.rstrip("/") for r in STANDARD_DRIVER_ROOTS} | {""}:
        found.append(f"hostPaths.driverInstallDir {root}: the DRA plugin writes CDI specs rooted at / "
                     f"(nicolerenee/infra#2394)")
    found += [f"{t}: DRA has no time-slicing replicas (jfroy/flatops#2620)" for t in _time_slicing(values)]
    if _section(values, "clusterPolicy", "deployCR") is not False:
        found.append("the chart still deploys the ClusterPolicy (clusterPolicy.deployCR): the two cannot run "
                     "together (26.7.0 release notes)")
    state = change.context.cluster
    if state is not None:
        mig = sorted(f"{name_of(n)} ({labels_of(n).get(NVIDIA_MIG_CONFIG_LABEL)})" for n in state.gpu_nodes()
                     if labels_of(n).get(NVIDIA_MIG_CONFIG_LABEL, "") not in MIG_OFF)
        if mig:
            found.append(f"MIG layouts from the MIG manager on {', '.join(mig)}, which the GPUCluster removes")
    if change.final.kubernetes_minor < DRA_KUBERNETES_FLOOR:
        found.append(f"Kubernetes 1.{change.final.kubernetes_minor}: the DRA stack needs 1.{DRA_KUBERNETES_FLOOR} "
                     f"or newer")
    return found


def check_dra_cutover(change: Change) -> list[Check]:
    name = "dra-cutover"
    values = change.context.values
    present = bool(change.context.cluster and change.context.cluster.gpu_clusters)
    if values is None:
        return [Check(name=name, ok=True, skipped=True, reason="values.yaml not read")]
    if not deploys_gpucluster(values) and not present:
        return [Check(name=name, ok=True, reason="no GPUCluster (DRA stack) deployed")]
    found = blockers(change)
    if not found:
        return [Check(name=name, ok=True, reason="GPUCluster deployed with nothing the DRA stack cannot carry over")]
    return [Check(name=name, ok=False, source="cloud-native-docs release-notes.rst 26.7.0, NVIDIA/gpu-operator#2716, "
                                              "nicolerenee/infra#2394, jfroy/flatops#2620",
                  reason="the DRA stack (GPUCluster) cannot take over here: " + "; ".join(found),
                  fix="keep gpuCluster.deployCR false until each is resolved: a standard driver root, time-slicing "
                      "replaced by DRA sharing (ConsumableCapacity) in the policies, MIG layouts moved to DRA "
                      "MIG devices, clusterPolicy.deployCR false in the same commit")]
