"""What the cluster must look like for a ledger: rules, node taints, validation pods, evictions (pure).

Derived afresh on every pass from the ledger and the caches, never remembered, so whatever
drifted (a rule deleted by hand, a pod gone, a node re-created) is brought back the next pass.

Per quarantined GPU:

- under DRA (the node's ResourceSlices publish a device with that UUID): one DeviceTaintRule
  per device of that GPU, the full GPU and every MIG device whose ``parentUUID`` it is, each
  selecting exactly one device by driver, pool and name; consumable-capacity shares are
  allocations of the full GPU device, so its rule covers them. The node's other GPUs are not
  touched;
- under the device plugin (no device of that UUID, or a fault that names no GPU): the node is
  tainted ``gpugate.io/gpu-unhealthy`` (Kubernetes cannot fence one device-plugin GPU), and
  ``gpu-free`` is lowered by the quarantined GPUs the plugin still counts as allocatable.

A dry-run quarantine makes only its rules (effect ``None``); no node taint, no ``gpu-free``
change, no eviction, no validation pod.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from webhook import names
from webhook.balancer.healthpolicy import HealthPolicy
from webhook.balancer.quarantineledger import Ledger, Quarantine
from webhook.kube import allocations, devicetaints
from webhook.kube.allocations import DeviceKey
from webhook.kube.devicetaints import DeviceTaint
from webhook.kube.gpunode import NodeInfo
from webhook.kube.nodedevices import NodeDevices
from webhook.kube.tolerations import Toleration

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpugate-balancer"
SELECTOR = f"{MANAGED_BY}={MANAGER}"
"""What the health loop lists its own rules and pods by."""
VALIDATION_LABEL = "gpugate.io/validation"
GPU_ANNOTATION = "gpugate.io/gpu"
NODE_ANNOTATION = "gpugate.io/node"
REASON_ANNOTATION = "gpugate.io/quarantine"
DRIVER_TAINT_KEYS = (names.DRA_XID_TAINT_KEY, names.DRA_GPU_LOST_TAINT_KEY)
"""A validation claim tolerates the driver's own taints too: a GPU the driver still marks must be testable."""


@dataclass(frozen=True, slots=True)
class Validation:
    """A validation pod to have, with the claim pinning its GPU (None under the device plugin)."""

    pod: dict
    claim: dict | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    rules: dict[str, devicetaints.DeviceTaintRuleWire] = field(default_factory=dict)
    tainted_nodes: frozenset[str] = frozenset()
    held_back: dict[str, int] = field(default_factory=dict)
    """GPUs to take off a node's ``gpu-free``, quarantined but still counted free."""
    validations: dict[str, Validation] = field(default_factory=dict)
    evictions: tuple[tuple[str, str], ...] = ()
    """(namespace, pod) to evict through the Eviction API now."""
    devices: dict[tuple[str, str], tuple[DeviceKey, ...]] = field(default_factory=dict)
    """The DRA devices of each quarantined GPU (empty: the device-plugin path)."""


def gpu_devices(devices: NodeDevices | None, uuid: str) -> tuple[DeviceKey, ...]:
    """The devices of the physical GPU ``uuid``: the full GPU first, then its MIG devices by name."""
    if devices is None or not uuid:
        return ()
    whole = [d.key for d in devices.devices if d.uuid == uuid and not d.parent_uuid]
    parts = sorted((d.key for d in devices.devices if d.parent_uuid == uuid), key=lambda k: k.device)
    return tuple(whole + parts)


def rule_name(key: DeviceKey) -> str:
    """``gpugate-<pool>-<device>`` (the NVIDIA driver's pool is the node), or a digest when too long."""
    name = f"gpugate-{key.pool}-{key.device}".lower()
    if len(name) <= 253:
        return name
    return "gpugate-" + hashlib.sha256(f"{key.driver}/{key.pool}/{key.device}".encode()).hexdigest()[:40]


def _rule(q: Quarantine, key: DeviceKey, effect: str) -> devicetaints.DeviceTaintRuleWire:
    taint = DeviceTaint(key=names.UNHEALTHY_TAINT_KEY, value=q.slug[:63], effect=devicetaints.effect_of(effect))
    return devicetaints.render_rule(
        rule_name(key), key, taint, labels={MANAGED_BY: MANAGER},
        annotations={GPU_ANNOTATION: q.gpu, NODE_ANNOTATION: q.node,
                     REASON_ANNOTATION: f"rule {q.rule}: {q.reason}"})


def plan(policy: HealthPolicy, ledger: Ledger, *, nodes: Mapping[str, NodeInfo], dra: Mapping[str, NodeDevices],
         claims: Iterable[allocations.Claim], namespace: str, now: float) -> Plan:
    """The cluster state ``ledger`` asks for; ``namespace`` is where validation pods go."""
    claims = list(claims)
    rules: dict[str, devicetaints.DeviceTaintRuleWire] = {}
    tainted: set[str] = set()
    held_back: dict[str, int] = {}
    validations: dict[str, Validation] = {}
    evictions: list[tuple[str, str]] = []
    devices: dict[tuple[str, str], tuple[DeviceKey, ...]] = {}
    for q in ledger.quarantines:
        keys = gpu_devices(dra.get(q.node), q.gpu)
        devices[q.key] = keys
        for key in keys:
            rules[rule_name(key)] = _rule(q, key, "None" if q.dry_run else q.effect)
        if q.dry_run:
            continue
        if keys:
            free = {d.key for d in (dra[q.node].devices if q.node in dra else ()) if d.free}
            held_back[q.node] = held_back.get(q.node, 0) + (1 if keys[0] in free else 0)
            if policy.eviction.api_first and q.effect == "NoSchedule" and q.escalate_at > now:
                evictions += pods_using(claims, keys, exclude=(namespace, q.validation_pod))
        elif q.gpu:
            tainted.add(q.node)
            held_back[q.node] = held_back.get(q.node, 0) + 1
        else:
            tainted.add(q.node)
        if q.validation == "running":
            validations[q.validation_pod] = validation(policy, q, namespace, dra=bool(keys))
    for node in list(held_back):
        info = nodes.get(node)
        if info is not None and not dra.get(node):
            # The plugin already left its unhealthy GPUs out of allocatable (and so out of gpu-free).
            held_back[node] = max(held_back[node] - info.unhealthy_gpus, 0)
    return Plan(rules=rules, tainted_nodes=frozenset(tainted), held_back={k: v for k, v in held_back.items() if v},
                validations=validations, evictions=tuple(sorted(set(evictions))), devices=devices)


def pods_using(claims: Iterable[allocations.Claim], keys: Iterable[DeviceKey], *,
               exclude: tuple[str, str] = ("", "")) -> list[tuple[str, str]]:
    """(namespace, pod) of every pod a claim holding one of ``keys`` is reserved for."""
    wanted = set(keys)
    out = []
    for claim in claims:
        if any(r.key in wanted for r in claim.held()):
            out += [(claim.namespace, c.name) for c in claim.reserved_for if c.resource == "pods"
                    and (claim.namespace, c.name) != exclude]
    return out


def busy(claims: Iterable[allocations.Claim], devices: Mapping[tuple[str, str], tuple[DeviceKey, ...]],
         validation_claims: Iterable[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    """Quarantined GPUs a claim other than a validation claim holds (a validation pod must wait)."""
    ours = set(validation_claims)
    held = {r.key for c in claims if (c.namespace, c.name) not in ours for r in c.held()}
    return frozenset(gpu for gpu, keys in devices.items() if held & set(keys))


VALIDATION_UID = 65532
"""The user a validation pod runs as (the restricted standard wants a non-root one; DCGM's image is root's)."""


def validation(policy: HealthPolicy, q: Quarantine, namespace: str, *, dra: bool) -> Validation:
    """The validation pod for ``q`` (and, under DRA, the claim for exactly its GPU)."""
    v = policy.validation
    labels = {**dict(v.labels), MANAGED_BY: MANAGER, VALIDATION_LABEL: q.validation_pod[:63]}
    container = {"name": "validate", "image": v.image, "command": list(v.command),
                 "env": [{"name": "GPUGATE_NODE", "value": q.node}, {"name": "GPUGATE_GPU_UUID", "value": q.gpu}],
                 "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
    # The restricted Pod Security Standard the balancer's own namespace enforces (manifests/webhook/
    # namespace.yaml): without it the API server refuses the pod there and the GPU never returns.
    # The GPU reaches it as a device node the device plugin or DRA driver grants, no privilege.
    restricted = {"runAsNonRoot": True, "runAsUser": VALIDATION_UID, "seccompProfile": {"type": "RuntimeDefault"}}
    pod: dict = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": q.validation_pod, "namespace": namespace, "labels": labels,
                              "annotations": {NODE_ANNOTATION: q.node, GPU_ANNOTATION: q.gpu}},
                 "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "securityContext": restricted,
                          "containers": [container]}}
    if v.service_account:
        pod["spec"]["serviceAccountName"] = v.service_account
    if not dra:
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [q.node]}]}]}}}
        pod["spec"]["tolerations"] = [Toleration(key=names.UNHEALTHY_TAINT_KEY, operator="Exists").as_k8s()]
        return Validation(pod=pod)
    claim = devicetaints.pinned_claim(q.validation_pod, namespace, uuid=q.gpu,
                                      tolerate=(names.UNHEALTHY_TAINT_KEY, *DRIVER_TAINT_KEYS),
                                      labels={MANAGED_BY: MANAGER, VALIDATION_LABEL: q.validation_pod[:63]})
    return Validation(pod=devicetaints.pod_uses_claim(pod, q.validation_pod), claim=claim)


def node_taints(node: NodeInfo, tainted: bool, effect: str) -> list[dict] | None:
    """The node's full taint list with ours present or absent, or None when it already is so."""
    ours = [t for t in node.taints if t.get("key") == names.UNHEALTHY_TAINT_KEY]
    want = [{"key": names.UNHEALTHY_TAINT_KEY, "effect": effect}] if tainted else []
    if [(t.get("key"), t.get("effect")) for t in ours] == [(t["key"], t["effect"]) for t in want]:
        return None
    return [t for t in node.taints if t.get("key") != names.UNHEALTHY_TAINT_KEY] + want
