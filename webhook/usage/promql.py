"""The PromQL of GPU accounting and idle findings, and the reading of Prometheus' answers. Pure.

One home for the expressions: the recording rules shipped in
``manifests/observability/usage-rules.yaml`` are these texts (a test holds them equal), the
balancer asks :func:`idle_queries`, and ``gpugate usage`` asks :func:`usage_queries`.

A pod's activity (:func:`pod_activity`) is what dcgm-exporter reports for the devices it
attributes to the pod: it labels a device's series with ``pod``/``namespace`` while a pod holds
it, which a Prometheus Operator scrape (``honorLabels: false``, the GPU Operator's default)
renames ``exported_pod``/``exported_namespace``. Per device, a GPU in MIG mode is exported as
its GPU instances, so a MIG slice's activity is its own instance's. The preferred field is
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (on by default), then ``DCGM_FI_PROF_SM_ACTIVE`` (off by
default), then ``DCGM_FI_DEV_GPU_UTIL`` / 100 (pre-Volta GPUs; it does not exist for MIG
instances). Each device weighs the same in the pod's mean (a pod holds one kind of unit in
practice), and the two host-label spellings of an exporter upgrade fold into one device by UUID.

The balancer exports what each pod holds (``gpugate_balancer_gpu_allocated``, in physical GPUs
from ``webhook.kube.units``) and each node's physical GPUs; every replica exports the same
numbers from its own watches, so the rules take the ``max`` over replicas, never the sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook import durations
from webhook.usage.idle import Measurement

ALLOCATED_METRIC = "gpugate_balancer_gpu_allocated"
PHYSICAL_METRIC = "gpugate_balancer_gpu_physical"
IDLE_PODS_METRIC = "gpugate_balancer_idle_pods"
IDLE_GPUS_METRIC = "gpugate_balancer_idle_gpus"
POD_LABELS = ("pod_namespace", "pod_name")
"""How the balancer's series and the rules name the pod holding GPUs: not ``namespace``/``pod``,
which a scrape renames to ``exported_*`` because the target has them already."""
OWNER_LABELS = ("pod_namespace", "owner_kind", "owner_name")
HOLDING_LABELS = ("node", "pod_namespace", "pod_name", "owner_kind", "owner_name", "kind")
ACTIVITY_FIELDS = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE")
UTIL_FIELD = "DCGM_FI_DEV_GPU_UTIL"
DEVICE_LABELS = ("UUID", "uuid", "GPU_I_ID")
RULE_INTERVAL = "1m"
"""The recording rules' evaluation interval, and the range each evaluation averages DCGM over."""

# Recording rules (level:metric:operation), evaluated every RULE_INTERVAL.
POD_ACTIVITY = "pod:gpugate_gpu_activity:ratio"
POD_ALLOCATED = "pod:gpugate_gpu_allocated:gpus"
POD_USED = "pod:gpugate_gpu_used:gpus"
OWNER_ALLOCATED = "owner:gpugate_gpu_allocated:gpus"
OWNER_USED = "owner:gpugate_gpu_used:gpus"
OWNER_IDLE = "owner:gpugate_gpu_idle:gpus"
NODE_PHYSICAL = "node:gpugate_gpu_physical:gpus"
NODE_ALLOCATED = "node:gpugate_gpu_allocated:gpus"
NODE_UNALLOCATED = "node:gpugate_gpu_unallocated:gpus"


def _by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def pod_activity(window: str) -> str:
    """Per pod (``pod_namespace``, ``pod_name``): the mean over its devices of each device's activity
    averaged over ``window``, clamped to 0..1 (see the module docstring)."""
    picked = " or ".join([f'avg_over_time({f}{{exported_pod!=""}}[{window}])' for f in ACTIVITY_FIELDS]
                         + [f'avg_over_time({UTIL_FIELD}{{exported_pod!=""}}[{window}]) / 100'])
    named = (f'label_replace(label_replace({picked}, "pod_namespace", "$1", "exported_namespace", "(.+)"), '
             f'"pod_name", "$1", "exported_pod", "(.+)")')
    per_device = f"avg by ({_by(POD_LABELS + DEVICE_LABELS)}) ({named})"
    return f"clamp(avg by ({_by(POD_LABELS)}) ({per_device}), 0, 1)"


def pod_allocated() -> str:
    return f"max by ({_by(HOLDING_LABELS)}) ({ALLOCATED_METRIC})"


def pod_used() -> str:
    return f"{POD_ALLOCATED} * on ({_by(POD_LABELS)}) group_left() {POD_ACTIVITY}"


def owner_sum(series: str) -> str:
    return f"sum by ({_by(OWNER_LABELS)}, kind) ({series})"


def owner_idle() -> str:
    """Allocated less used, only where activity was measured (unmeasured GPU-hours are neither)."""
    return owner_sum(f"{POD_ALLOCATED} * on ({_by(POD_LABELS)}) group_left() (1 - {POD_ACTIVITY})")


def node_physical() -> str:
    return f"max by (node) ({PHYSICAL_METRIC})"


def node_allocated() -> str:
    return f"sum by (node) ({POD_ALLOCATED})"


def node_unallocated() -> str:
    """Physical GPUs no pod holds; a node whose holdings exceed its GPUs shows 0, which breaks the
    identity allocated + unallocated = physical instead of hiding the excess."""
    return f"clamp_min({NODE_PHYSICAL} - ({NODE_ALLOCATED} or {NODE_PHYSICAL} * 0), 0)"


def recording_rules() -> list[tuple[str, str]]:
    """(record, expr) in evaluation order: each rule reads only rules before it."""
    return [(POD_ACTIVITY, pod_activity(RULE_INTERVAL)), (POD_ALLOCATED, pod_allocated()), (POD_USED, pod_used()),
            (OWNER_ALLOCATED, owner_sum(POD_ALLOCATED)), (OWNER_USED, owner_sum(POD_USED)), (OWNER_IDLE, owner_idle()),
            (NODE_PHYSICAL, node_physical()), (NODE_ALLOCATED, node_allocated()),
            (NODE_UNALLOCATED, node_unallocated())]


# ---- what the balancer asks: idle findings ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class IdleQuery:
    """The three subqueries that measure every pod over one window, at one step."""

    window: int
    step: int

    def expr(self, reducer: str) -> str:
        inner = pod_activity(durations.text(self.step))
        return f"{reducer}(({inner})[{durations.text(self.window)}:{durations.text(self.step)}])"

    def exprs(self) -> dict[str, str]:
        return {r: self.expr(r) for r in ("max_over_time", "avg_over_time", "count_over_time")}

    @property
    def expected_samples(self) -> int:
        return max(self.window // self.step, 1)


def idle_query(window: int, *, min_step: int) -> IdleQuery:
    """Sixty steps over the window, each at least ``min_step`` seconds (the DCGM collection interval:
    a shorter step would average over ranges with no sample in them)."""
    return IdleQuery(window, max(window // 60, min_step, 1))


def samples(answer: Any) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each series of an instant-vector answer with a finite value; ValueError
    saying what failed for an error answer or another result type."""
    status = answer.get("status") if isinstance(answer, dict) else None
    if status != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        raise ValueError(f"query failed: {error or 'the answer is not a success'}")
    data = answer.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"expected a vector result, got {data.get('resultType')!r}")
    found = ((dict(s.get("metric") or {}), _number(s)) for s in data.get("result") or ())
    return [(labels, value) for labels, value in found if value is not None]


def _number(series: Any) -> float | None:
    try:
        value = float(series["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def pod_vector(answer: Any) -> dict[str, float]:
    """``namespace/name`` -> value of an instant vector over :data:`POD_LABELS`."""
    return {f"{labels['pod_namespace']}/{labels['pod_name']}": value for labels, value in samples(answer)
            if labels.get("pod_namespace") and labels.get("pod_name")}


def measurements(query: IdleQuery, answers: Mapping[str, Any]) -> dict[str, Measurement]:
    """Per pod key, the Measurement the three answers of :meth:`IdleQuery.exprs` give."""
    highest = pod_vector(answers["max_over_time"])
    mean = pod_vector(answers["avg_over_time"])
    count = pod_vector(answers["count_over_time"])
    return {key: Measurement(highest=value, mean=mean.get(key, value),
                             coverage=min(count.get(key, 0.0) / query.expected_samples, 1.0))
            for key, value in highest.items()}
