"""Preflight rules on the pods that hold the GPU driver on the nodes a change reloads. Pure.

The driver's kernel module unloads only when nothing holds a GPU device open. NVIDIA's upgrade
controller frees the GPU pods it knows before it restarts the driver, and only those: pod deletion
takes the Running or Pending pods with an ``nvidia.com/gpu*`` or ``nvidia.com/mig-*`` request (or an
NVIDIA ResourceClaim) (gpu-operator ``cmd/gpu-operator/main.go`` gpuPodSpecFilter), and neither pod
deletion nor the drain fallback ever evicts a DaemonSet's pod (k8s-operator-libs, IgnoreAllDaemonSets).
A pod that reaches a GPU any other way pins the module: the new driver pod crash-loops on "driver is
in use" and the node never finishes (NVIDIA/gpu-operator#2570, #2549). The operator's own operands
are the exception: its driver manager takes them off the node through their deploy labels.

* ``gpu-consumers``: such pods on the reloaded nodes, by name, and how each reaches the GPU;
* ``drain-emptydir``: GPU pods with an emptyDir that the pool's upgrade policy can neither delete nor
  drain (NVIDIA/gpu-operator#454): the node ends ``upgrade-failed``;
* ``driver-switch``: a ClusterPolicy-managed driver switched between precompiled and compiled while
  GPU pods run: the new driver DaemonSet replaces the old one outside the upgrade controller (#2166, #2549).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.kube import demand
from webhook.stack.change import Change, needs_cluster, reloaded_pools
from webhook.stack.clusterstate import ClusterSnapshot, KubeObject, controller_of, qualified, spec_of
from webhook.stack.compat import Check, verdict
from webhook.stack.hardening import toolkit_ignores_visible_devices

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NO_DEVICES = ("", "void", "none")
DEVICE_PATHS = ("/dev/nvidia", "/run/nvidia/driver")
NVIDIA_RUNTIME_CLASS = "nvidia"
DELETED_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
"""Requests NVIDIA's upgrade controller deletes a pod for (gpuPodSpecFilter, gpu-operator v26.7.0)."""


def _containers(pod: KubeObject) -> list[Mapping[str, Any]]:
    spec = spec_of(pod)
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def deleted_by_upgrade(pod: KubeObject) -> bool:
    """Whether NVIDIA's upgrade controller deletes ``pod`` before it restarts the driver."""
    if (controller_of(pod) or ("", ""))[0] == "DaemonSet":
        return False
    if demand.claim_refs(dict(pod)):
        return True  # an NVIDIA claim is taken; which class it names is the DRA driver's business
    for container in spec_of(pod).get("containers") or []:
        resources = container.get("resources") or {}
        for section in ("requests", "limits"):
            if any(str(r).startswith(DELETED_PREFIXES) for r in resources.get(section) or {}):
                return True
    return False


def _privileged(container: Mapping[str, Any]) -> bool:
    return bool((container.get("securityContext") or {}).get("privileged"))


def reaches_gpu(pod: KubeObject, *, envvar_ignored: bool) -> list[str]:
    """How ``pod`` reaches a GPU device, one phrase per way (empty: it does not, as far as its spec shows).

    ``envvar_ignored``: the toolkit ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers.
    """
    ways = []
    spec = spec_of(pod)
    for volume in spec.get("volumes") or []:
        path = str((volume.get("hostPath") or {}).get("path") or "")
        if path.startswith(DEVICE_PATHS):
            ways.append(f"hostPath {path}")
    for container in _containers(pod):
        privileged = _privileged(container)
        for env in container.get("env") or []:
            value = str(env.get("value") or "")
            if env.get("name") == VISIBLE_DEVICES and value.lower() not in NO_DEVICES and (
                    privileged or not envvar_ignored):
                ways.append(f"container {container.get('name')} sets {VISIBLE_DEVICES}={value}"
                            + (" (privileged)" if privileged else ""))
    if spec.get("runtimeClassName") == NVIDIA_RUNTIME_CLASS and not envvar_ignored:
        ways.append(f"runtimeClassName {NVIDIA_RUNTIME_CLASS} (its image's {VISIBLE_DEVICES} is honoured)")
    return ways


def pinning_consumers(state: ClusterSnapshot, nodes: Iterable[str], values: Mapping[str, Any] | None) -> list[str]:
    """One line per pod (or DaemonSet) on ``nodes`` that reaches a GPU and that the upgrade never frees."""
    ignored = toolkit_ignores_visible_devices(values)
    found: dict[str, str] = {}
    for pod in state.pods_on(nodes):
        if state.operator_owned(pod) or deleted_by_upgrade(pod):
            continue
        ways = reaches_gpu(pod, envvar_ignored=ignored)
        if not ways:
            continue
        owner = controller_of(pod)
        namespace = (pod.get("metadata") or {}).get("namespace")
        if owner is not None and owner[0] == "DaemonSet":
            key = f"DaemonSet {namespace}/{owner[1]}"
            found.setdefault(key, f"{key} ({', '.join(ways)}; DaemonSet pods are never evicted)")
        else:
            found[qualified(pod)] = (f"pod {qualified(pod)} on {spec_of(pod).get('nodeName')} "
                                     f"({', '.join(ways)}, no GPU request the upgrade deletes it for)")
    return [found[k] for k in sorted(found)]


@needs_cluster
def check_gpu_consumers(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "gpu-consumers"
    nodes = state.pool_nodes(change.final, reloaded_pools(change))
    pinning = pinning_consumers(state, nodes, change.context.values)
    if not pinning:
        return [Check(name=name, ok=True,
                      reason=f"nothing on the {len(nodes)} reloaded node(s) reaches a GPU except pods the upgrade "
                             f"deletes and the operator's own")]
    return [Check(name=name, ok=False, source="NVIDIA/gpu-operator#2570, #2549; NVIDIA/k8s-operator-libs#150",
                  reason="these hold the GPU driver open and NVIDIA's upgrade never frees them, so the new driver "
                         "pod crash-loops on 'driver is in use': " + "; ".join(pinning),
                  fix="stop them on the reloaded nodes before the rollout (scale the workload down, or keep the "
                      "DaemonSet off those nodes with a nodeSelector), or give the pods an nvidia.com/gpu request "
                      "so the upgrade deletes them")]


def _stuck_on_emptydir(policy: Mapping[str, Any]) -> bool:
    deletion = policy.get("podDeletion") or {}
    drain = policy.get("drain") or {}
    return not deletion.get("deleteEmptyDir", False) and not (drain.get("enable") and drain.get("deleteEmptyDir"))


@needs_cluster
def check_drain_emptydir(change: Change, state: ClusterSnapshot) -> list[Check]:
    name = "drain-emptydir"
    found = []
    for pool in reloaded_pools(change):
        policy = change.final.pool(pool).upgrade_policy
        if not _stuck_on_emptydir(policy):
            continue
        nodes = state.pool_nodes(change.final, [pool])
        found += [f"pod {qualified(p)} on {spec_of(p).get('nodeName')} (pool {pool})" for p in state.pods_on(nodes)
                  if deleted_by_upgrade(p) and any("emptyDir" in v for v in spec_of(p).get("volumes") or [])]
    return verdict(name, sorted(found), source="NVIDIA/gpu-operator#454",
                   passed="every GPU pod on the reloaded nodes can be deleted or drained",
                   failed="GPU pods with an emptyDir that the pool's upgradePolicy may neither delete "
                          "(podDeletion.deleteEmptyDir false) nor drain (drain off, or drain.deleteEmptyDir false): "
                          "{found}. Their node ends upgrade-failed",
                   fix="set upgradePolicy.drain.enable and drain.deleteEmptyDir to true for the pool in stack.yaml "
                       "(`gpugate stack sync`), or move the scratch data off emptyDir")


def _precompiled(declared: bool, values: Mapping[str, Any] | None) -> bool:
    """The ClusterPolicy's driver.usePrecompiled: values.yaml's when it sets one, else stack.yaml's."""
    driver = (values or {}).get("driver")
    if isinstance(driver, Mapping) and isinstance(driver.get("usePrecompiled"), bool):
        return bool(driver["usePrecompiled"])
    return declared


def check_driver_switch(change: Change) -> list[Check]:
    name = "driver-switch"
    current, final = change.current, change.final
    if current.management != "clusterpolicy" or final.management != "clusterpolicy":
        return []
    before = _precompiled(current.default_pool.use_precompiled, change.context.values_before)
    after = _precompiled(final.default_pool.use_precompiled, change.context.values)
    if before == after:
        return []
    state = change.context.cluster
    if state is None:
        return []
    gpu_pods = [qualified(p) for p in state.pods_on(n for n in state.pool_nodes(final, [final.default_pool.name]))
                if deleted_by_upgrade(p)]
    switch = f"usePrecompiled {str(before).lower()} -> {str(after).lower()}"
    if not gpu_pods:
        return [Check(name=name, ok=True, reason=f"{switch} with no GPU pod running on the GPU nodes")]
    return [Check(name=name, ok=False, source="NVIDIA/gpu-operator#2166, #2549",
                  reason=f"{switch} replaces the driver DaemonSet outside NVIDIA's upgrade controller, under "
                         f"{len(gpu_pods)} running GPU pod(s) ({', '.join(sorted(gpu_pods)[:5])}"
                         f"{', ...' if len(gpu_pods) > 5 else ''}): the new driver pods cannot unload the old "
                         f"module and stay in Init:CrashLoopBackOff",
                  fix="drain the GPU pods off the GPU nodes first (or switch one node at a time), then commit "
                      "the switch")]
