"""``gpugate usage``: the GPU-hours of a window from the recorded accounting, as a table, JSON or CSV. Pure.

GPU-hours over a window are the recorded GPUs summed at a fixed step (a subquery
``sum_over_time(rule[window:step])``, times the step in hours): a series that ends (its pod is
gone) contributes nothing after its last evaluation, so a pod that ran an hour of the day counts
an hour. Per namespace and owner: allocated, used (activity times allocation), idle (the rest,
where activity was measured) and unmeasured (allocated GPU-hours with no activity series: an
exporter that does not attribute devices to pods, or a pre-Volta GPU without profiling fields);
then the unallocated and physical GPU-hours of the cluster, and how far allocated + unallocated
is from physical (the identity; within :data:`IDENTITY_TOLERANCE` unless something double counts).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from webhook import durations
from webhook.usage import promql
from webhook.usage.accounting import KINDS

IDENTITY_TOLERANCE = 0.01
OWNER_COLUMNS = ("allocated", "used", "idle")


@dataclass(frozen=True, slots=True)
class Window:
    """The range asked for and the step its subqueries sample at (the rules' interval by default)."""

    seconds: int
    step: int = 60

    @property
    def hours_per_sample(self) -> float:
        return self.step / 3600

    def sampled(self, series: str) -> str:
        return f"sum_over_time({series}[{durations.text(self.seconds)}:{durations.text(self.step)}])"


def usage_queries(window: Window) -> dict[str, str]:
    """What ``gpugate usage`` asks Prometheus: one instant query each, GPU-hours (see the module docstring)."""
    hours = f" * {window.hours_per_sample!r}"
    return {"allocated": window.sampled(promql.OWNER_ALLOCATED) + hours,
            "used": window.sampled(promql.OWNER_USED) + hours,
            "idle": window.sampled(promql.OWNER_IDLE) + hours,
            "unallocated": f"sum({window.sampled(promql.NODE_UNALLOCATED)}){hours}",
            "physical": f"sum({window.sampled(promql.NODE_PHYSICAL)}){hours}"}


@dataclass
class OwnerUsage:
    """GPU-hours of one owner in one namespace."""

    namespace: str
    owner_kind: str
    owner: str
    allocated: float = 0.0
    used: float = 0.0
    idle: float = 0.0
    by_kind: dict[str, float] = field(default_factory=dict)
    """Allocated GPU-hours per unit kind (whole, mig, slot, share)."""

    @property
    def unmeasured(self) -> float:
        return max(self.allocated - self.used - self.idle, 0.0)

    @property
    def used_share(self) -> float | None:
        measured = self.used + self.idle
        return self.used / measured if measured > 0 else None


@dataclass(frozen=True)
class Usage:
    """The whole answer of one window."""

    since: str
    owners: tuple[OwnerUsage, ...]
    unallocated: float
    physical: float

    @property
    def allocated(self) -> float:
        return sum(o.allocated for o in self.owners)

    @property
    def identity_error(self) -> float | None:
        """|allocated + unallocated - physical| / physical; None without physical GPU-hours."""
        if self.physical <= 0:
            return None
        return abs(self.allocated + self.unallocated - self.physical) / self.physical


def usage_from(answers: Mapping[str, Any], *, since: str) -> Usage:
    """Build the Usage from the answers to :func:`usage_queries` (ValueError for a failed one)."""
    owners: dict[tuple[str, str, str], OwnerUsage] = {}
    for column in OWNER_COLUMNS:
        for labels, value in promql.samples(answers[column]):
            key = (labels.get("pod_namespace", ""), labels.get("owner_kind", ""), labels.get("owner_name", ""))
            row = owners.setdefault(key, OwnerUsage(*key))
            setattr(row, column, getattr(row, column) + value)
            if column == "allocated":
                kind = labels.get("kind", "")
                row.by_kind[kind] = row.by_kind.get(kind, 0.0) + value
    totals = {column: sum(v for _, v in promql.samples(answers[column])) for column in ("unallocated", "physical")}
    ordered = sorted(owners.values(), key=lambda o: (-o.allocated, o.namespace, o.owner_kind, o.owner))
    return Usage(since=since, owners=tuple(ordered), **totals)


def _hours(value: float) -> str:
    return f"{value:.3f}"


def table(usage: Usage) -> str:
    head = ("NAMESPACE", "OWNER", "UNITS", "ALLOCATED", "USED", "IDLE", "UNMEASURED", "USED%")
    rows = [head] + [(o.namespace, f"{o.owner_kind}/{o.owner}",
                      ",".join(k for k in KINDS if o.by_kind.get(k, 0) > 0) or "-",
                      _hours(o.allocated), _hours(o.used), _hours(o.idle), _hours(o.unmeasured),
                      "-" if o.used_share is None else f"{o.used_share:.0%}") for o in usage.owners]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths,
                                                                                              strict=True))).rstrip()
             for r in rows]
    lines.append("")
    lines.append(f"GPU-hours over the last {usage.since}: allocated {_hours(usage.allocated)}, unallocated "
                 f"{_hours(usage.unallocated)}, physical {_hours(usage.physical)}.")
    lines.append(identity_line(usage))
    return "\n".join(lines)


def identity_line(usage: Usage) -> str:
    error = usage.identity_error
    if error is None:
        return "No physical GPU-hours recorded: is the balancer scraped, and are the gpugate-usage rules loaded?"
    verdict = "adds up" if error <= IDENTITY_TOLERANCE else "DOES NOT add up (something is counted twice or missed)"
    return f"allocated + unallocated = {_hours(usage.allocated + usage.unallocated)}: {verdict}, {error:.2%} " \
           f"from physical."


def as_json(usage: Usage) -> str:
    document = {"since": usage.since, "owners": [{**asdict(o), "unmeasured": o.unmeasured} for o in usage.owners],
                "allocated": usage.allocated, "unallocated": usage.unallocated, "physical": usage.physical,
                "identity_error": usage.identity_error}
    return json.dumps(document, indent=2, sort_keys=False)


def as_csv(usage: Usage) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["namespace", "owner_kind", "owner", "allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours",
                     "unmeasured_gpu_hours", *[f"allocated_{k}_gpu_hours" for k in KINDS]])
    for o in usage.owners:
        writer.writerow([o.namespace, o.owner_kind, o.owner, *(f"{v:.6f}" for v in (
            o.allocated, o.used, o.idle, o.unmeasured, *(o.by_kind.get(k, 0.0) for k in KINDS)))])
    return out.getvalue()


# ---- the idle findings the balancer exports ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class IdleLine:
    namespace: str
    owner_kind: str
    owner: str
    pod: str
    gpus: float
    mean: float | None
    highest: float | None
    after: str
    policy: str
    action: str


def idle_queries() -> dict[str, str]:
    """The balancer leader's findings (every replica may be scraped: the max folds them)."""
    labels = "pod_namespace, pod_name, owner_kind, owner_name, policy, action, after"
    return {"findings": f"max by ({labels}) (gpugate_balancer_idle_finding)",
            "activity": "max by (pod_namespace, pod_name, stat) (gpugate_balancer_idle_activity)"}


def idle_from(answers: Mapping[str, Any]) -> list[IdleLine]:
    activity: dict[tuple[str, str, str], float] = {}
    for labels, value in promql.samples(answers["activity"]):
        activity[(labels.get("pod_namespace", ""), labels.get("pod_name", ""), labels.get("stat", ""))] = value
    lines = []
    for labels, gpus in promql.samples(answers["findings"]):
        ns, pod = labels.get("pod_namespace", ""), labels.get("pod_name", "")
        lines.append(IdleLine(ns, labels.get("owner_kind", ""), labels.get("owner_name", ""), pod, gpus,
                              activity.get((ns, pod, "mean")), activity.get((ns, pod, "max")),
                              labels.get("after", ""), labels.get("policy", ""), labels.get("action", "")))
    return sorted(lines, key=lambda line: (-line.gpus, line.namespace, line.pod))


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def idle_table(lines: Iterable[IdleLine]) -> str:
    head = ("NAMESPACE", "OWNER", "POD", "GPUS", "MEAN", "MAX", "FOR", "POLICY", "ACTION")
    rows = [head] + [(x.namespace, f"{x.owner_kind}/{x.owner}", x.pod, f"{x.gpus:.3g}", _percent(x.mean),
                      _percent(x.highest), x.after, x.policy or "(default)", x.action) for x in lines]
    if len(rows) == 1:
        return "No idle GPU allocations found by the balancer."
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def idle_json(lines: Iterable[IdleLine]) -> str:
    return json.dumps([asdict(x) for x in lines], indent=2)


def idle_csv(lines: Iterable[IdleLine]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([f.name for f in fields(IdleLine)])
    for x in lines:
        writer.writerow(["" if v is None else v for v in asdict(x).values()])
    return out.getvalue()
