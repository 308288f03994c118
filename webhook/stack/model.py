"""``manifests/gpu-operator/stack.yaml``: the one file that pins the GPU stack, as frozen values.

Parsed once at the boundary (``Stack.from_dict``) with errors that name the field; written back
by ``Stack.to_yaml`` in one canonical layout, so a tool edit changes only the lines whose values
changed. Everything else in ``manifests/gpu-operator/`` that carries a version derives from this.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from webhook.errors import GpugateError
from webhook.kube import yamlload
from webhook.stack.releases import OperatorVersion, driver_branch, parse_minor

API_VERSION = "gpugate.io/v1alpha1"
KIND = "GPUStack"
MODES = ("nvidiadriver", "clusterpolicy")
DRIVER_TYPES = ("gpu", "vgpu", "vgpu-host-manager")

# Component name (as in the matrix) -> the Helm values path of its version.
COMPONENT_VALUES_PATHS: dict[str, tuple[str, ...]] = {
    "driverManager": ("driver", "manager", "version"),
    "toolkit": ("toolkit", "version"),
    "devicePlugin": ("devicePlugin", "version"),
    "gfd": ("gfd", "version"),
    "dcgmExporter": ("dcgmExporter", "version"),
    "dcgm": ("dcgm", "version"),
    "migManager": ("migManager", "version"),
}
UPGRADE_POLICY_KEYS = ("autoUpgrade", "maxParallelUpgrades", "maxUnavailable", "waitForCompletion", "podDeletion",
                       "drain")
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

HEADER = """\
# The one file that pins the GPU stack (read by `gpugate stack status|plan|upgrade|promote`).
# Everything else that carries a version derives from it and is rewritten by the tool:
#   values.yaml       driver.version, driver.nvidiaDriverCRD.enabled, <component>.version overrides
#   drivers/*.yaml    one NVIDIADriver per pool (crName, default pool without nodeSelector)
#   ../../argocd/apps/gpu-operator.yaml  targetRevision of the gpu-operator chart source
# Change versions with `gpugate stack upgrade` so the compatibility checks run; the tool writes this
# file in a fixed layout (comments other than this header are not kept).
#   operator.version            chart version = GPU Operator release tag, with the leading v (the
#                               Helm repository it comes from is chartRepoURL in argocd/site/site.yaml)
#   cluster.kubernetesVersion   the cluster's Kubernetes minor (checked against the release's range)
#   driver.management           nvidiadriver (one NVIDIADriver CR per pool) | clusterpolicy (one driver)
#   components                  component versions overridden in values.yaml (matrix name -> version)
#   pools[].migAndFullGPUs      true when nodes of the pool mix MIG slices and full GPUs
#   pools[].labels              labels of the pool's driver pods; changing only these restarts the
#                               drivers in place, without evicting GPU pods
"""


GPU_PRESENT_LABEL = "nvidia.com/gpu.present"


def selectors_can_select_same_node(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Whether some GPU node could match both equality selectors.

    The operator's own rule (gpu-operator internal/validator/nvidiadriver_node_selector_conflicts.go,
    ``nodeSelectorsCanSelectSameGPUNode``): two selectors overlap unless they require different
    values of one label, or one of them excludes GPU nodes (``nvidia.com/gpu.present`` other than
    "true"). Whether a node matches both today does not matter: a node labelled tomorrow would.
    """
    for selector in (a, b):
        if selector.get(GPU_PRESENT_LABEL, "true") != "true":
            return False
    return all(b[key] == value for key, value in a.items() if key in b)


def _selector_text(selector: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


def _where(path: str, message: str) -> GpugateError:
    return GpugateError(f"stack.yaml, {path}: {message}")


@dataclass(frozen=True, kw_only=True)
class Pool:
    """A node pool with its own driver (one NVIDIADriver CR in nvidiadriver mode)."""

    name: str
    driver: str
    cr_name: str = ""
    """Name of the pool's NVIDIADriver; defaults to the pool name. A new name is how driverType changes."""
    default: bool = False
    """The fallback CR that owns every GPU node no other pool selects; it must not have a nodeSelector."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    driver_type: str = "gpu"
    use_precompiled: bool = False
    mig_and_full_gpus: bool = False
    upgrade_policy: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels of the pool's driver pods (NVIDIADriver ``spec.labels``): changing only these restarts
    the driver in place, without evicting GPU pods (NVIDIA's restart-only path)."""

    @property
    def resource_name(self) -> str:
        return self.cr_name or self.name

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Pool:
        if not isinstance(data, dict):
            raise _where(where, "expected a mapping")
        known = {"name", "crName", "default", "nodeSelector", "driver", "driverType", "usePrecompiled",
                 "migAndFullGPUs", "upgradePolicy", "labels"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise _where(where, f"unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        name = data.get("name")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise _where(f"{where}.name", f"expected a DNS label, got {name!r}")
        cr_name = data.get("crName", "") or ""
        if cr_name and not _NAME_RE.match(str(cr_name)):
            raise _where(f"{where}.crName", f"expected a DNS label, got {cr_name!r}")
        driver = data.get("driver")
        if not isinstance(driver, str):
            raise _where(f"{where}.driver", f"expected a quoted version string such as \"595.91.07\", got {driver!r}")
        driver_branch(driver)
        driver_type = data.get("driverType", "gpu")
        if driver_type not in DRIVER_TYPES:
            raise _where(f"{where}.driverType", f"expected one of {', '.join(DRIVER_TYPES)}, got {driver_type!r}")
        selector = data.get("nodeSelector") or {}
        if not isinstance(selector, dict) or not all(isinstance(v, str) for v in selector.values()):
            raise _where(f"{where}.nodeSelector", "expected a mapping of label -> string value")
        pod_labels = data.get("labels") or {}
        if not isinstance(pod_labels, dict) or not all(isinstance(v, str) for v in pod_labels.values()):
            raise _where(f"{where}.labels", "expected a mapping of label -> string value")
        policy = data.get("upgradePolicy") or {}
        if not isinstance(policy, dict):
            raise _where(f"{where}.upgradePolicy", "expected a mapping")
        if "gpuPodDeletion" in policy:
            raise _where(f"{where}.upgradePolicy.gpuPodDeletion",
                         "that is the Helm values key; in an NVIDIADriver the field is podDeletion")
        stray = sorted(set(policy) - set(UPGRADE_POLICY_KEYS))
        if stray:
            raise _where(f"{where}.upgradePolicy", f"unknown field(s) {', '.join(stray)} "
                                                   f"(known: {', '.join(UPGRADE_POLICY_KEYS)})")
        for flag in ("default", "usePrecompiled", "migAndFullGPUs"):
            if not isinstance(data.get(flag, False), bool):
                raise _where(f"{where}.{flag}", f"expected true or false, got {data.get(flag)!r}")
        return cls(name=name, cr_name=str(cr_name), default=data.get("default", False), node_selector=dict(selector),
                   driver=driver, driver_type=driver_type, use_precompiled=data.get("usePrecompiled", False),
                   mig_and_full_gpus=data.get("migAndFullGPUs", False), upgrade_policy=copy.deepcopy(policy),
                   labels={str(k): v for k, v in pod_labels.items()})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.cr_name:
            out["crName"] = self.cr_name
        out["default"] = self.default
        if self.node_selector:
            out["nodeSelector"] = dict(self.node_selector)
        out["driver"] = self.driver
        out["driverType"] = self.driver_type
        out["usePrecompiled"] = self.use_precompiled
        out["migAndFullGPUs"] = self.mig_and_full_gpus
        if self.upgrade_policy:
            out["upgradePolicy"] = copy.deepcopy(dict(self.upgrade_policy))
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


@dataclass(frozen=True, kw_only=True)
class Stack:
    """What Git declares for the GPU stack."""

    operator_version: OperatorVersion
    chart: str = "gpu-operator"
    kubernetes_minor: int
    management: str = "nvidiadriver"
    driver_repository: str = "nvcr.io/nvidia"
    driver_image: str = "driver"
    components: Mapping[str, str] = field(default_factory=dict)
    pools: tuple[Pool, ...] = ()

    @classmethod
    def from_yaml(cls, text: str) -> Stack:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise GpugateError(f"stack.yaml{yamlload.describe_error(err)}") from err
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> Stack:
        if not isinstance(data, dict):
            raise GpugateError("stack.yaml: expected a mapping at the top")
        if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
            raise GpugateError(f"stack.yaml: expected apiVersion {API_VERSION} and kind {KIND}")
        operator = data.get("operator") or {}
        if not isinstance(operator, dict) or "version" not in operator:
            raise _where("operator.version", "missing (e.g. v26.7.0)")
        cluster = data.get("cluster") or {}
        k8s = cluster.get("kubernetesVersion") if isinstance(cluster, dict) else None
        if not isinstance(k8s, str):
            raise _where("cluster.kubernetesVersion", f"expected a quoted minor such as \"1.33\", got {k8s!r}")
        driver = data.get("driver") or {}
        mode = driver.get("management", "nvidiadriver")
        if mode not in MODES:
            raise _where("driver.management", f"expected one of {', '.join(MODES)}, got {mode!r}")
        components = data.get("components") or {}
        if not isinstance(components, dict):
            raise _where("components", "expected a mapping of component -> version")
        unknown = sorted(set(components) - set(COMPONENT_VALUES_PATHS))
        if unknown:
            raise _where("components", f"unknown component(s) {', '.join(unknown)} "
                                       f"(known: {', '.join(COMPONENT_VALUES_PATHS)})")
        raw_pools = data.get("pools")
        if not isinstance(raw_pools, list) or not raw_pools:
            raise _where("pools", "expected a non-empty list of pools")
        pools = tuple(Pool.from_dict(p, f"pools[{i}]") for i, p in enumerate(raw_pools))
        try:
            version = OperatorVersion.parse(str(operator["version"]))
            minor = parse_minor(k8s)
        except GpugateError as err:
            raise GpugateError(f"stack.yaml: {err}") from err
        # operator.repository of older files is read and dropped: the chart repository is a site
        # setting (argocd/site/site.yaml chartRepoURL), kept in one place with the Git repository.
        stack = cls(operator_version=version, chart=str(operator.get("chart", "gpu-operator")),
                    kubernetes_minor=minor, management=mode,
                    driver_repository=str(driver.get("repository", "nvcr.io/nvidia")),
                    driver_image=str(driver.get("image", "driver")),
                    components={str(k): str(v) for k, v in components.items()}, pools=pools)
        stack.check_pools()
        return stack

    def check_pools(self) -> None:
        """The pool rules the operator enforces at run time, refused here at load instead."""
        names = [p.name for p in self.pools]
        crs = [p.resource_name for p in self.pools]
        for label, values in (("pool name", names), ("NVIDIADriver name", crs)):
            dupes = sorted({v for v in values if values.count(v) > 1})
            if dupes:
                raise _where("pools", f"duplicate {label}(s): {', '.join(dupes)}")
        if self.management == "clusterpolicy":
            if len(self.pools) != 1:
                raise _where("pools", "with driver.management clusterpolicy there is one driver for every node: "
                                      "declare exactly one pool (per-pool drivers need nvidiadriver)")
            return
        defaults = [p.name for p in self.pools if p.default]
        if len(defaults) > 1:
            raise _where("pools", f"more than one default pool ({', '.join(defaults)}); "
                                  f"the operator marks both ReconcileFailed")
        for index, pool in enumerate(self.pools):
            if pool.default and pool.node_selector:
                raise _where(f"pools[{index}].nodeSelector", "a default pool must not have a nodeSelector")
            if not pool.default and not pool.node_selector:
                raise _where(f"pools[{index}].nodeSelector",
                             "a non-default pool needs a nodeSelector (without one it selects every GPU node)")
            for earlier in self.pools[:index]:
                if pool.default or earlier.default:
                    continue  # the default pool owns only the nodes no other pool selects
                if selectors_can_select_same_node(pool.node_selector, earlier.node_selector):
                    mine, theirs = _selector_text(pool.node_selector), _selector_text(earlier.node_selector)
                    raise _where(f"pools[{index}].nodeSelector",
                                 f"{mine} and pool {earlier.name}'s {theirs} can both match one node (they never "
                                 f"disagree on a label); the operator refuses such NVIDIADrivers "
                                 f"(ConflictingNodeSelector) even before a node matches both: give them a label key "
                                 f"with different values, e.g. gpugate.io/driver-pool")

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise GpugateError(f"stack.yaml has no pool {name!r} (pools: {', '.join(p.name for p in self.pools)})")

    @property
    def default_pool(self) -> Pool:
        """The pool whose driver the ClusterPolicy (values.yaml driver.version) carries."""
        for pool in self.pools:
            if pool.default:
                return pool
        return self.pools[0]

    def with_pool(self, name: str, **changes: Any) -> Stack:
        self.pool(name)
        pools = tuple(dataclasses.replace(p, **changes) if p.name == name else p for p in self.pools)
        return dataclasses.replace(self, pools=pools)

    def replace(self, **changes: Any) -> Stack:
        return dataclasses.replace(self, **changes)

    def versions(self) -> dict[str, str]:
        """A flat summary for messages and trailers: operator, kubernetes, one entry per pool."""
        out = {"operator": str(self.operator_version), "kubernetes": f"1.{self.kubernetes_minor}",
               "driver-management": self.management}
        out.update({f"pool {p.name}": p.driver for p in self.pools})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "operator": {"chart": self.chart, "version": str(self.operator_version)},
            "cluster": {"kubernetesVersion": f"1.{self.kubernetes_minor}"},
            "driver": {"management": self.management, "repository": self.driver_repository,
                       "image": self.driver_image},
            "components": dict(self.components),
            "pools": [p.to_dict() for p in self.pools],
        }

    def to_yaml(self) -> str:
        body = yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False, width=120)
        return HEADER + body
