"""Canary analysis for a driver rollout: when may a pool's driver be promoted, when must it roll back.

Pure (data in, data out): the cluster and Prometheus are read by ``canary_watch``, Git is written
by ``gpugate stack promote|rollback``. The rules, in the spirit of Argo Rollouts' AnalysisRun
(``argoproj/argo-rollouts`` ``analysis/analysis.go``: a measurement that fails its condition fails
the analysis at once; success needs every metric to have passed):

* **Gate** (what ``promote`` checks): every node of the canary pool is ``upgrade-done`` at the
  driver Git pins for the pool (NVIDIA's state label ``nvidia.com/gpu-driver-upgrade-state``, the
  driver version GPU Feature Discovery labels the node with). Anything else blocks, naming the node.
* **CanaryVerdict** (what ``gpugate stack canary`` decides): ``rollback`` as soon as a canary node is
  ``upgrade-failed`` or a condition's measurement fails, or the deadline passes first; ``promote``
  once the gate has held, and every condition passed, for the whole window; else ``wait``.

Conditions are declared in Git beside ``stack.yaml`` (``manifests/gpu-operator/canary.yaml``), read
by :func:`parse_analysis` against :data:`SCHEMA`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import yaml

from webhook.errors import GpugateError
from webhook.kube import yamlload

ANALYSIS_FILE = "manifests/gpu-operator/canary.yaml"
DONE, FAILED = "upgrade-done", "upgrade-failed"
NO_STATE = "(none)"

_SECONDS = {"type": "number", "exclusiveMinimum": 0}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind"],
    "oneOf": [{"required": ["pool"]}, {"required": ["pools"]}],
    "properties": {
        "apiVersion": {"const": "gpugate.io/v1alpha1"},
        "kind": {"const": "CanaryAnalysis"},
        "pool": {"type": "string", "minLength": 1},
        "pools": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "string", "minLength": 1}},
        "promoteTo": {"anyOf": [{"const": "all"},
                                {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}]},
        "baseline": {"type": "string", "minLength": 1},
        "windowSeconds": {"type": "number", "minimum": 0},
        "intervalSeconds": _SECONDS,
        "timeoutSeconds": _SECONDS,
        "limits": {"type": "object", "additionalProperties": False,
                   "properties": {"stuckSeconds": _SECONDS, "driverReadySeconds": _SECONDS,
                                  "validationSeconds": _SECONDS, "migPendingSeconds": _SECONDS}},
        "xid": {"type": "object", "additionalProperties": False,
                "properties": {"windowSeconds": _SECONDS, "minimum": {"type": "integer", "minimum": 1}}},
        "diagnostics": {"type": "object", "additionalProperties": False, "required": ["image"],
                        "properties": {"image": {"type": "string", "minLength": 1},
                                       "level": {"type": "integer", "minimum": 1, "maximum": 4},
                                       "timeoutSeconds": _SECONDS,
                                       "namespace": {"type": "string", "minLength": 1}}},
        "prometheus": {"type": "object", "additionalProperties": False,
                       "properties": {"url": {"type": "string", "pattern": "^https?://"}}},
        "conditions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "query"],
                "anyOf": [{"required": ["max"]}, {"required": ["min"]}],
                "properties": {
                    "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                    "query": {"type": "string", "minLength": 1},
                    "max": {"type": "number"},
                    "min": {"type": "number"},
                    "noData": {"enum": ["fail", "pass"]},
                },
            },
        },
    },
}


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of an instant query and the series it came from (so a failure names the node and GPU)."""

    value: float
    series: str = ""
    """The series' labels as PromQL writes them (``{Hostname="gpu-c1",gpu="0"}``); empty for a scalar."""

    def __str__(self) -> str:
        return f"{self.value:g}{' on ' + self.series if self.series else ''}"


@dataclass(frozen=True, slots=True)
class Condition:
    """One PromQL query whose every value must stay within [min, max] while the canary is watched."""

    name: str
    query: str
    max: float | None = None
    min: float | None = None
    no_data: str = "fail"
    """An empty result: a failure (the default: a metric that vanished proves nothing) or a pass."""

    def violation(self, values: Sequence[float | Sample]) -> str | None:
        """Why ``values`` (one query's result) fail this condition, naming every failing series, or None."""
        if not values:
            return None if self.no_data == "pass" else f"{self.name}: the query returned no data"
        samples = [v if isinstance(v, Sample) else Sample(float(v)) for v in values]
        failing = []
        for sample in samples:
            if math.isnan(sample.value):
                failing.append(f"{sample} (the query returned NaN)")
            elif self.max is not None and sample.value > self.max:
                failing.append(f"{sample} > max {self.max:g}")
            elif self.min is not None and sample.value < self.min:
                failing.append(f"{sample} < min {self.min:g}")
        return f"{self.name}: {'; '.join(failing)}" if failing else None


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a canary node may stay in a state before the rollout is rolled back, in seconds."""

    stuck_seconds: float = 1800.0
    """In one of NVIDIA's in-progress upgrade states (cordon-required ... uncordon-required)."""
    driver_ready_seconds: float = 900.0
    """A new driver pod not Ready since it was created (image pull, build, module load)."""
    validation_seconds: float = 900.0
    """In validation-required: the validator did not pass the node (the library waits 600 s itself)."""
    mig_pending_seconds: float = 600.0
    """``nvidia.com/mig.config.state=pending``: the MIG manager did not apply its layout."""


@dataclass(frozen=True, slots=True)
class XidRule:
    """New XID errors per node on the canary pool against the baseline pool, from DCGM via Prometheus."""

    window_seconds: float = 600.0
    minimum: int = 1
    """New XIDs the canary pool must show at least before its rate can fail it (one XID on a
    single-node canary against a silent baseline is the signal on small pools; raise it on big ones)."""


@dataclass(frozen=True, slots=True)
class Diagnostics:
    """A DCGM diagnostic Job per canary node once it runs the new driver; a failed one rolls back."""

    image: str
    level: int = 2
    timeout_seconds: float = 900.0
    namespace: str = "gpu-operator"


@dataclass(frozen=True, slots=True)
class Analysis:
    """What ``canary.yaml`` declares: the pools watched, the window, the limits, the conditions."""

    pool: str
    window_seconds: float = 60.0
    interval_seconds: float = 5.0
    timeout_seconds: float = 1800.0
    prometheus_url: str | None = None
    conditions: tuple[Condition, ...] = ()
    pools: tuple[str, ...] = ()
    """Every canary pool followed (``pool`` is the first); each is decided on its own."""
    promote_to: str | tuple[str, ...] = "all"
    """Where a canary's driver goes on promotion: ``all`` other pools, or the pools named."""
    baseline: str | None = None
    """The pool the XID rate is compared with (default: the default pool)."""
    limits: Limits = Limits()
    xid: XidRule | None = None
    diagnostics: Diagnostics | None = None


def parse_analysis(text: str, *, pools: Sequence[str], source: str = ANALYSIS_FILE) -> Analysis:
    """Read ``canary.yaml``; a malformed file or an unknown pool is refused, naming the problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise GpugateError(f"{source}{yamlload.describe_error(err)}") from err
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        raise GpugateError(f"{source}: {where}: {first.message}")
    assert isinstance(data, dict)
    watched, promote_to = _watched_pools(data, pools, source)
    names = [c["name"] for c in data.get("conditions") or []]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise GpugateError(f"{source}: conditions: duplicate name(s) {', '.join(duplicates)}")
    conditions = tuple(Condition(name=c["name"], query=c["query"], max=c.get("max"), min=c.get("min"),
                                 no_data=c.get("noData", "fail")) for c in data.get("conditions") or [])
    xid = data.get("xid")
    return Analysis(pool=watched[0], pools=watched, window_seconds=float(data.get("windowSeconds", 60)),
                    interval_seconds=float(data.get("intervalSeconds", 5)),
                    timeout_seconds=float(data.get("timeoutSeconds", 1800)),
                    prometheus_url=(data.get("prometheus") or {}).get("url"), conditions=conditions,
                    promote_to=promote_to, baseline=data.get("baseline"), limits=_limits(data.get("limits") or {}),
                    xid=None if xid is None else XidRule(window_seconds=float(xid.get("windowSeconds", 600)),
                                                         minimum=int(xid.get("minimum", 1))),
                    diagnostics=_diagnostics(data.get("diagnostics")))


def _limits(data: Mapping[str, Any]) -> Limits:
    keys = {"stuckSeconds": "stuck_seconds", "driverReadySeconds": "driver_ready_seconds",
            "validationSeconds": "validation_seconds", "migPendingSeconds": "mig_pending_seconds"}
    return Limits(**{field: float(data[key]) for key, field in keys.items() if key in data})


def _diagnostics(data: Mapping[str, Any] | None) -> Diagnostics | None:
    if data is None:
        return None
    return Diagnostics(image=str(data["image"]), level=int(data.get("level", 2)),
                       timeout_seconds=float(data.get("timeoutSeconds", 900)),
                       namespace=str(data.get("namespace", "gpu-operator")))


def _watched_pools(data: Mapping[str, Any], pools: Sequence[str], source: str) -> tuple[tuple[str, ...], Any]:
    """The canary pools, and where they promote to, each a pool of stack.yaml (refused, naming it, if not)."""
    watched = tuple(data["pools"]) if "pools" in data else (data["pool"],)
    targets = data.get("promoteTo", "all")
    named = list(watched) + ([] if targets == "all" else list(targets)) + [b for b in [data.get("baseline")] if b]
    unknown = [p for p in named if p not in pools]
    if unknown:
        raise GpugateError(f"{source}: pool(s) {', '.join(dict.fromkeys(unknown))} are not pools of stack.yaml "
                           f"({', '.join(pools)})")
    if targets != "all" and set(targets) & set(watched):
        both = ", ".join(sorted(set(targets) & set(watched)))
        raise GpugateError(f"{source}: promoteTo names a canary pool ({both})")
    if (data.get("conditions") or "xid" in data) and not (data.get("prometheus") or {}).get("url"):
        raise GpugateError(f"{source}: conditions and xid need prometheus.url (or --prometheus)")
    return watched, (targets if targets == "all" else tuple(targets))


@dataclass(frozen=True, slots=True)
class NodeUpgrade:
    """One node of the canary pool as the cluster reports it."""

    name: str
    state: str
    """``nvidia.com/gpu-driver-upgrade-state`` (``(none)`` when unset)."""
    driver: str | None
    """``nvidia.com/cuda.driver-version.full`` (GFD), None when unset."""


@dataclass(frozen=True, slots=True)
class Gate:
    """May the pool's driver be promoted? ``blocking`` names every node that says no, and why."""

    pool: str
    driver: str
    nodes: tuple[NodeUpgrade, ...]
    blocking: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return bool(self.nodes) and not self.blocking

    @property
    def reason(self) -> str:
        if not self.nodes:
            return f"pool {self.pool} has no node in the cluster: nothing proves driver {self.driver}"
        if self.blocking:
            return (f"pool {self.pool} is not upgrade-done at driver {self.driver}: " + "; ".join(self.blocking))
        return f"every node of pool {self.pool} ({len(self.nodes)}) is upgrade-done at driver {self.driver}"


def gate(pool: str, driver: str, nodes: Sequence[NodeUpgrade]) -> Gate:
    """The promotion gate over ``nodes`` (the pool's nodes in the cluster)."""
    blocking = []
    for node in sorted(nodes, key=lambda n: n.name):
        if node.state != DONE:
            blocking.append(f"{node.name} is {node.state}")
        elif node.driver != driver:
            blocking.append(f"{node.name} is upgrade-done at driver {node.driver or '(unknown)'}, not {driver}")
    return Gate(pool=pool, driver=driver, nodes=tuple(sorted(nodes, key=lambda n: n.name)), blocking=tuple(blocking))


@dataclass(frozen=True, slots=True)
class CanaryObservation:
    """One look at the canary: the pool's nodes and each condition's values at ``at`` (seconds)."""

    at: float
    nodes: tuple[NodeUpgrade, ...]
    measurements: Mapping[str, tuple[float | Sample, ...]] = field(default_factory=dict)
    """condition name -> the values its query returned (absent: not measured this time)."""


@dataclass(frozen=True, slots=True)
class Watch:
    """What the analysis remembers between observations."""

    started: float
    gate_since: float | None = None
    """When the gate last turned (and stayed) open; None while it is closed."""
    measured: frozenset[str] = frozenset()
    """Conditions measured (and passed) since ``gate_since``."""


@dataclass(frozen=True, slots=True)
class CanaryVerdict:
    decision: str
    """``promote``, ``rollback`` or ``wait``."""
    reasons: tuple[str, ...]
    watch: Watch
    failed_nodes: tuple[str, ...] = ()
    """Nodes at ``upgrade-failed``: rolling back Git does not heal them (k8s-operator-libs
    ProcessUpgradeFailedNodes waits for a driver pod in sync and Ready; the crash-looping pod is
    never replaced by itself), so they need the documented retry after the rollback synced."""


def judge(analysis: Analysis, driver: str, watch: Watch, seen: CanaryObservation) -> CanaryVerdict:
    """The next verdict from one more observation (Argo Rollouts: any failed measurement fails)."""
    failed = sorted(n.name for n in seen.nodes if n.state == FAILED)
    if failed:
        return CanaryVerdict("rollback", (f"driver upgrade failed on {', '.join(failed)} (upgrade-failed)",), watch,
                       failed_nodes=tuple(failed))
    violations = [v for c in analysis.conditions if c.name in seen.measurements
                  and (v := c.violation(seen.measurements[c.name])) is not None]
    if violations:
        return CanaryVerdict("rollback", tuple(violations), watch)
    opened = gate(analysis.pool, driver, seen.nodes)
    if not opened.ok:
        watch = Watch(started=watch.started)
        if seen.at - watch.started >= analysis.timeout_seconds:
            return CanaryVerdict("rollback", (f"not done after {analysis.timeout_seconds:g}s: {opened.reason}",), watch)
        return CanaryVerdict("wait", (opened.reason,), watch)
    since = watch.gate_since if watch.gate_since is not None else seen.at
    watch = Watch(started=watch.started, gate_since=since,
                  measured=watch.measured | frozenset(seen.measurements))
    held = seen.at - since
    unmeasured = sorted(c.name for c in analysis.conditions if c.name not in watch.measured)
    if held >= analysis.window_seconds and not unmeasured:
        passed = [f"{opened.reason}, for {held:.0f}s (window {analysis.window_seconds:g}s)"]
        passed += [f"{c.name} held" for c in analysis.conditions]
        return CanaryVerdict("promote", tuple(passed), watch)
    waiting = f"{opened.reason}; {held:.0f}s of the {analysis.window_seconds:g}s window"
    if unmeasured:
        waiting += f"; not yet measured: {', '.join(unmeasured)}"
    return CanaryVerdict("wait", (waiting,), watch)
