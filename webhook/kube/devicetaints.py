"""DRA device taints: a slice device's taints, the DeviceTaintRule, and a claim pinned to one device (pure).

Kubernetes 1.37 made device taints and ``DeviceTaintRule`` generally available
(``resource.k8s.io/v1``, ``k8s.io/api/resource/v1/types.go``: ``DeviceTaint``,
``DeviceTaintRule``, ``DeviceTaintSelector``, ``DeviceToleration``). What matters here:

- a taint is ``key``, ``value`` (a label value), ``effect`` (``None``, ``NoSchedule`` or
  ``NoExecute``; an effect this code does not know reads as ``None``, as the API asks clients
  to) and ``timeAdded``; a ResourceSlice device carries up to 16;
- a rule's ``deviceSelector`` names ``driver``, ``pool`` and ``device``: all given criteria must
  match, so the three together select exactly one device of the cluster (CEL selectors and
  ``deviceClassName`` were removed in 1.35: kube-controller-manager's eviction controller could
  not evaluate them);
- ``None`` changes nothing but makes the eviction controller count, once per spec change, the
  pods a ``NoExecute`` would evict (``status.conditions[type=EvictionInProgress]``, reason
  ``NoEffect``); ``NoSchedule`` keeps the scheduler from allocating the device to claims that do
  not tolerate it; ``NoExecute`` also makes kube-controller-manager's device-taint eviction
  controller *delete* the pods using it (no Eviction API, so no PodDisruptionBudget), setting
  their ``DisruptionTarget`` condition to ``DeletionByDeviceTaintManager``;
- a claim tolerates a taint through ``exactly.tolerations`` (key, ``Exists``/``Equal``, value,
  effect, ``tolerationSeconds``); a toleration without effect tolerates every effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from webhook import names
from webhook.kube.allocations import DeviceKey

API_VERSION = "resource.k8s.io/v1"
RULE_KIND = "DeviceTaintRule"
Effect = Literal["None", "NoSchedule", "NoExecute"]
EFFECTS: tuple[Effect, ...] = ("None", "NoSchedule", "NoExecute")
"""Weakest first: a rule moves along this order and never back while its device stays quarantined."""
NONE: Effect = "None"


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """One taint on a device: from its ResourceSlice or from a DeviceTaintRule."""

    key: str
    """A label name (``gpu.nvidia.com/xid``)."""
    value: str = ""
    """A label value, possibly empty (``79``)."""
    effect: Effect = NONE
    time_added: str = ""
    """RFC 3339 as the API server stored it (empty when not set)."""


class DeviceTaintSelectorWire(TypedDict):
    driver: str
    pool: str
    device: str


class DeviceTaintWire(TypedDict, total=False):
    key: str
    value: str
    effect: str
    timeAdded: str


class DeviceTaintRuleSpecWire(TypedDict):
    deviceSelector: DeviceTaintSelectorWire
    taint: DeviceTaintWire


class DeviceTaintRuleWire(TypedDict):
    """A whole DeviceTaintRule as sent (``status`` is kube-controller-manager's)."""

    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    spec: DeviceTaintRuleSpecWire


def effect_of(raw: Any) -> Effect:
    """An effect as written; unknown values count as ``None`` (they take no effect)."""
    return raw if raw in EFFECTS else NONE


def parse_taints(raw: Any) -> tuple[DeviceTaint, ...]:
    """A device's ``taints`` list (the API server validated it; entries without a key are skipped)."""
    out = []
    for item in raw if isinstance(raw, list) else ():
        if isinstance(item, Mapping) and isinstance(item.get("key"), str) and item["key"]:
            out.append(DeviceTaint(key=item["key"], value=str(item.get("value") or ""),
                                   effect=effect_of(item.get("effect")), time_added=str(item.get("timeAdded") or "")))
    return tuple(out)


def render_rule(name: str, device: DeviceKey, taint: DeviceTaint, *, labels: Mapping[str, str],
                annotations: Mapping[str, str]) -> DeviceTaintRuleWire:
    """A DeviceTaintRule tainting exactly ``device`` (driver, pool and device all given).

    ``timeAdded`` is left to the API server: it sets it on create and bumps it when the effect
    changes, which is the time NoExecute eviction counts ``tolerationSeconds`` from.
    """
    wire_taint = DeviceTaintWire(key=taint.key, effect=taint.effect)
    if taint.value:
        wire_taint["value"] = taint.value
    return DeviceTaintRuleWire(
        apiVersion=API_VERSION, kind=RULE_KIND,
        metadata={"name": name, "labels": dict(labels), "annotations": dict(annotations)},
        spec=DeviceTaintRuleSpecWire(
            deviceSelector=DeviceTaintSelectorWire(driver=device.driver, pool=device.pool, device=device.device),
            taint=wire_taint))


@dataclass(frozen=True, slots=True)
class RuleView:
    """A DeviceTaintRule as read back: which device, which taint, and what the controller said of it."""

    name: str
    device: DeviceKey | None
    """None when the selector is not one whole device (not a rule this code writes)."""
    taint: DeviceTaint
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    status: str = ""
    """The ``EvictionInProgress`` condition's reason and message (``NoEffect: 2 pods would be evicted``)."""
    resource_version: str = ""


def parse_rule(obj: Mapping[str, Any]) -> RuleView:
    """A DeviceTaintRule from the API server (only what this code reads of it)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    selector = spec.get("deviceSelector") or {}
    parts = [selector.get(k) for k in ("driver", "pool", "device")]
    device = DeviceKey(*parts) if all(isinstance(p, str) and p for p in parts) else None  # type: ignore[arg-type]
    (taint,) = parse_taints([spec.get("taint") or {"key": "?"}])
    status = ""
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "EvictionInProgress":
            status = f"{condition.get('reason', '')}: {condition.get('message', '')}".strip(": ")
    return RuleView(name=str(meta.get("name") or ""), device=device, taint=taint,
                    labels=tuple(sorted((meta.get("labels") or {}).items())),
                    annotations=tuple(sorted((meta.get("annotations") or {}).items())),
                    status=status, resource_version=str(meta.get("resourceVersion") or ""))


def tolerating(key: str) -> list[dict[str, Any]]:
    """Claim tolerations of every taint with ``key``, forever (no tolerationSeconds), one per effect.

    Not one toleration without an effect, although the API reads that as "every effect": the
    device-taint eviction controller of kube-controller-manager v1.37.2 spares a pod only for a
    toleration whose effect is ``NoExecute`` (``claimEvictionTime`` in
    ``pkg/controller/devicetainteviction/device_taint_eviction.go``), and deleted validation pods
    that tolerated ``gpugate.io/gpu-unhealthy`` without one (tests/e2e/test_health.py).
    """
    return [{"key": key, "operator": "Exists", "effect": effect} for effect in ("NoSchedule", "NoExecute")]


def uuid_selector(uuid: str) -> str:
    """A CEL selector for the one device whose NVML ``uuid`` attribute is ``uuid``."""
    return (f'device.driver == "{names.DRA_DRIVER}" && '
            f'device.attributes["{names.DRA_DRIVER}"].uuid == "{uuid}"')


def pinned_claim(name: str, namespace: str, *, uuid: str, tolerate: tuple[str, ...],
                 labels: Mapping[str, str]) -> dict[str, Any]:
    """A ResourceClaim for exactly the full GPU with NVML ``uuid``, tolerating taints with ``tolerate`` keys.

    The uuid selector pins the device (and so the node) without the scheduler being told where:
    it allocates the claim only on the device, once no other claim holds it.
    """
    request = {"name": "gpu", "exactly": {"deviceClassName": names.DRA_GPU_CLASS, "allocationMode": "ExactCount",
                                          "count": 1, "selectors": [{"cel": {"expression": uuid_selector(uuid)}}],
                                          "tolerations": [t for k in tolerate for t in tolerating(k)]}}
    return {"apiVersion": API_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"devices": {"requests": [request]}}}


def pod_uses_claim(pod: dict[str, Any], claim: str, *, entry: str = "gpu") -> dict[str, Any]:
    """``pod`` with ResourceClaim ``claim`` referenced as ``entry`` and used by every container."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("resourceClaims", []).append({"name": entry, "resourceClaimName": claim})
    for container in spec.get("containers") or ():
        container.setdefault("resources", {}).setdefault("claims", []).append({"name": entry})
    return pod
