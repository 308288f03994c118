"""The balancer's settings: grouped frozen dataclasses, one YAML file, flags on top.

Order of precedence: command-line flags > the YAML file (``--config``) > the defaults below.
Each default's docstring says why it is what it is; docs/balancer.md's settings table repeats them.
The file is checked once when loaded: an unknown key or a wrong type is refused with its
dotted path, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from webhook.balancer import healthschema
from webhook.balancer.healthpolicy import HealthPolicy, HealthPolicyError
from webhook.balancer.moveplan import RebalanceSettings
from webhook.errors import GpugateError
from webhook.kube import yamlload
from webhook.lease import LeaseSettings  # re-exported: the balancer's settings file names it
from webhook.placement.shapes import MixError, ShapeMix, parse_mix
from webhook.placement.tiers import ThresholdError, TierThresholds


class SettingsError(GpugateError):
    """The balancer's configuration file or flags are invalid."""


@dataclass(frozen=True, kw_only=True)
class PrometheusSettings:
    """Where and how often DCGM utilization is read."""

    url: str | None = None
    """Prometheus base URL (``http://prometheus.monitoring:9090``); unset means allocation-only tiers."""
    window: str = "5m"
    """``avg_over_time`` range: long enough to smooth DCGM's instantaneous samples (30 s scrape),
    short enough that a job finishing shows within minutes."""
    interval: float = 30.0
    """Seconds between queries; DCGM exporter collects every 30 s, querying faster adds nothing."""
    timeout: float = 5.0
    """Seconds before a query is given up (and the poll counts as Prometheus being down)."""
    stale_after: float = 120.0
    """Seconds after the last good answer from which utilization is dropped (allocation only)."""


@dataclass(frozen=True, kw_only=True)
class InventorySettings:
    """The GPUInventory ConfigMap the leader writes for the webhook's right-sizing."""

    enabled: bool = True
    """Off: no PriorityClass watch and no ConfigMap (the webhook then right-sizes by the ladder's order)."""
    name: str = "gpugate-inventory"
    """The ConfigMap manifests/webhook mounts (optional volume) and manifests/balancer's Role names."""
    namespace: str = ""
    """Empty: the Lease's namespace (``$POD_NAMESPACE``), where the webhook runs too."""
    key: str = "inventory.json"
    """The data key: the file name the webhook's ``--inventory`` reads in the mounted folder."""
    min_interval: float = 5.0
    """Seconds between two writes of a changed inventory: a burst of binds costs one write, and
    the kubelet refreshes ConfigMap volumes only every minute or so anyway."""
    refresh: float = 60.0
    """Seconds after which an unchanged inventory is written again with a new ``generatedAt``. The
    webhook ignores an inventory older than the policy's ``maxInventoryAgeSeconds`` (300 by
    default); 60 s plus the kubelet's ConfigMap sync delay (up to about 90 s) stays well inside it."""


@dataclass(frozen=True, kw_only=True)
class ExtenderServing:
    """kube-scheduler's extender ``prioritize`` call, served over HTTPS from the caches by every replica."""

    bind: str = ""
    """``HOST:PORT`` of the HTTPS listener; empty: not served (and pods are reduced to their GPU
    requests only, which is cheaper: the extender also needs every bound pod's cpu and memory)."""
    cert_file: str = ""
    key_file: str = ""
    """The serving certificate and key (the ``kubernetes.io/tls`` Secret, mounted); re-read when
    they change, as the webhook's are."""
    path: str = "/extender"
    """The ``urlPrefix`` path of the scheduler's configuration: it POSTs ``<path>/prioritize``."""
    device_policy: str = "distributed"
    """The device plugin's allocation policy for time-sliced shares, as the cluster runs it
    (``distributed``, its default, or ``packed``): the measure models which GPU a share got."""
    assume_ttl: float = 30.0
    """Seconds a scored pod counts on its best node before the watch shows it bound; then forgotten
    (it went unschedulable or its binding failed)."""
    mix_file: str = ""
    """A YAML file of the cluster's typical pod shapes (``webhook.placement.shapes.parse_mix``), e.g.
    the ``pod-mix.yaml`` that ``gpugate replay`` writes from a pod list. Empty: the mix is learned
    from the last 2,000 pods created. A whole history gives a steadier mix than a window (openb
    default list: 95.24% allocation against 95.19%, docs/placement.md)."""


@dataclass(frozen=True, kw_only=True)
class UsageSettings:
    """GPU accounting per pod and owner, and idle allocations found and reclaimed (docs/usage.md)."""

    enabled: bool = False
    """Watch the pods that hold GPUs (device plugin or DRA claims) with their owners, export what each
    holds (``gpugate_balancer_gpu_allocated``) and, with ``prometheus.url``, look for idle ones."""
    policies: str = ""
    """A folder of GPUPolicy files (the webhook's, mounted): their ``spec.idle`` says what may be done
    with an idle pod. Empty: every pod gets the defaults, report only."""
    idle_interval: float = 60.0
    """Seconds between two looks for idle pods: an idle finding takes hours, a minute more is nothing."""
    min_step: int = 30
    """Least seconds between two activity samples of an idle query: dcgm-exporter's collection
    interval (30 s by default); a shorter step would average ranges that hold no sample."""
    evictions_per_hour: float = 6.0
    """Idle pods the leader may evict per hour, sustained, across the cluster."""
    eviction_burst: int = 3
    """Evictions allowed at once after a quiet spell: a wrong policy costs at most this many pods
    before the hourly rate holds it back."""

    def __post_init__(self) -> None:
        if self.idle_interval <= 0 or self.min_step < 1 or self.evictions_per_hour < 0 or self.eviction_burst < 0:
            raise SettingsError("usage: need idle_interval > 0, min_step >= 1, evictions_per_hour >= 0 and "
                                "eviction_burst >= 0")
        if self.policies and not self.enabled:
            raise SettingsError("usage.policies is for idle reclaim: set usage.enabled too (--usage), or drop it")


@dataclass(frozen=True, kw_only=True)
class BalancerSettings:
    """Everything ``gpugate balance`` needs, parsed once."""

    tiers: TierThresholds = field(default_factory=TierThresholds)
    taint_congested: bool = False
    """Also taint congested nodes ``gpugate.io/congested:PreferNoSchedule``. Off by default: the
    taint weighs on every pod (CPU pods too) with TaintToleration weight 3, so it is opt-in."""
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    inventory: InventorySettings = field(default_factory=InventorySettings)
    extender: ExtenderServing = field(default_factory=ExtenderServing)
    health: HealthPolicy = field(default_factory=HealthPolicy)
    """GPU health quarantine (docs/health.md): off unless ``health.enabled``."""
    usage: UsageSettings = field(default_factory=UsageSettings)
    """GPU accounting and idle allocations (docs/usage.md): off unless ``usage.enabled``."""
    rebalance: RebalanceSettings = field(default_factory=RebalanceSettings)
    """The rebalancer (docs/rebalance.md): off by default."""
    server: str | None = None
    """API server URL; unset means in-cluster service account, else kubeconfig."""
    dry_run: bool = False
    """Log the label and taint changes instead of writing them (and take no lease)."""
    health_bind: str = "0.0.0.0:8080"
    """Plaintext ``/healthz`` and ``/metrics``."""
    resync_interval: float = 300.0
    """Seconds between full passes over every node, which also repair a label someone else edited
    (the watch already triggers a pass for each node that changes)."""
    watch_timeout: int = 300
    """Server-side ``timeoutSeconds`` of each watch; the stream is then resumed from the last
    resourceVersion (no relist)."""
    page_size: int = 500
    """Items per list page (``limit``): bounds memory while listing 150,000 pods."""
    write_concurrency: int = 8
    """Node patches in flight at once: 5,000 first-time labels at ~10 ms each take 6 s, not 50."""
    write_qps: float = 200.0
    """Node patches per second, sustained (a token bucket, as client-go's rate limiter). client-go's
    default of 5 would take 17 minutes to label 5,000 nodes once; 200 takes 25 s, and is a small
    share of what such a cluster's API server already takes (5,000 kubelets renew a Lease every 10 s).
    Coalescing (``write_interval``) keeps steady-state writes far below it: the bucket only caps bursts."""
    write_burst: int = 400
    """Patches that may go out at once after a quiet spell (client-go's ratio: twice the rate)."""
    write_interval: float = 10.0
    """Seconds a node waits after its last patch before the next one, whatever changed (``gpu-free``,
    the tier, the taint); only a node gaining or losing its marks is written at once. Within the
    interval the latest wanted labels replace older ones, so a burst of pod events costs each node
    at most one patch per interval, and every watcher of all nodes one event."""
    stream_lists: bool = True
    """List through a watch with ``sendInitialEvents`` (Kubernetes' streaming list) where the API
    server allows it: objects arrive one per line, so the pods that hold no GPU are skipped
    without being decoded, and no 500-item page is ever held. Falls back to paged lists."""
    backoff_initial: float = 0.5
    """First retry delay after an API error, in seconds; doubles up to ``backoff_max``, jittered."""
    backoff_max: float = 30.0

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.write_concurrency < 1 or self.watch_timeout < 1 or self.write_burst < 1:
            raise SettingsError("page_size, write_concurrency, write_burst and watch_timeout must be at least 1")
        if self.write_qps <= 0 or self.write_interval < 0:
            raise SettingsError("write_qps must be > 0 and write_interval >= 0")
        if self.resync_interval <= 0 or self.backoff_initial <= 0 or self.backoff_max < self.backoff_initial:
            raise SettingsError("resync_interval and backoff_initial must be > 0, backoff_max >= backoff_initial")
        lease = self.lease
        if not 0 < lease.retry_period < lease.renew_deadline < lease.duration:
            raise SettingsError("lease: need 0 < retry_period < renew_deadline < duration "
                                f"(got {lease.retry_period}, {lease.renew_deadline}, {lease.duration})")
        if self.prometheus.interval <= 0 or self.prometheus.timeout <= 0:
            raise SettingsError("prometheus.interval and prometheus.timeout must be > 0")
        if not re.fullmatch(r"[0-9]+(ms|s|m|h|d)", self.prometheus.window):
            raise SettingsError(f"prometheus.window must be a Prometheus duration like 5m, got "
                                f"{self.prometheus.window!r}")
        parse_bind(self.health_bind)
        inventory = self.inventory
        if not 0 <= inventory.min_interval <= inventory.refresh or inventory.refresh <= 0:
            raise SettingsError("inventory: need 0 <= min_interval <= refresh and refresh > 0 "
                                f"(got {inventory.min_interval}, {inventory.refresh})")
        if inventory.enabled and not (inventory.name and inventory.key):
            raise SettingsError("inventory: name and key must not be empty")
        extender = self.extender
        if extender.bind:
            parse_bind(extender.bind, what="extender.bind")
            if not (extender.cert_file and extender.key_file):
                raise SettingsError("extender: serving on extender.bind needs cert_file and key_file (HTTPS only: "
                                    "kube-scheduler's tlsConfig trusts the CA of manifests/balancer's certificate)")
        if extender.device_policy not in ("distributed", "packed"):
            raise SettingsError(f"extender.device_policy must be distributed or packed, got {extender.device_policy!r}")
        if extender.mix_file and not extender.bind:
            raise SettingsError("extender.mix_file is for the extender's measure: set extender.bind too, or drop it")
        if not extender.path.startswith("/") or extender.assume_ttl <= 0:
            raise SettingsError("extender: path must start with / and assume_ttl must be > 0")
        if self.rebalance.problems():
            raise SettingsError("; ".join(self.rebalance.problems()))

    @classmethod
    def from_file(cls, path: Path) -> BalancerSettings:
        """Read one YAML mapping whose keys mirror the fields (sections ``tiers``, ``prometheus``, ``lease``)."""
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise SettingsError(f"{path}: cannot read the balancer configuration: {err.strerror}") from err
        except yaml.YAMLError as err:
            raise SettingsError(f"{path}{yamlload.describe_error(err)}") from err
        return cls.from_dict(data or {}, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "configuration") -> BalancerSettings:
        try:
            return _build(cls, data, source, "")
        except (ThresholdError, HealthPolicyError) as err:
            raise SettingsError(f"{source}: {err}") from err
        except SettingsError as err:
            if str(err).startswith(source):
                raise
            raise SettingsError(f"{source}: {err}") from err

    def with_overrides(self, **changes: Any) -> BalancerSettings:
        """A copy with the given fields replaced; ``None`` values (flags not given) are ignored.

        Dotted names reach into a section: ``{"lease.name": "x", "prometheus.url": "http://..."}``
        is spelled ``lease__name`` / ``prometheus__url`` here.
        """
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            if value is None:
                continue
            if "__" in key:
                section, name = key.split("__", 1)
                nested.setdefault(section, {})[name] = value
            else:
                top[key] = value
        for section, values in nested.items():
            top[section] = dataclasses.replace(getattr(self, section), **values)
        return dataclasses.replace(self, **top)


def load_mix(path: str) -> ShapeMix:
    """The configured pod-shape mix in ``path``; SettingsError names the file and the bad entry."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise SettingsError(f"extender.mix_file {path}: cannot read it: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise SettingsError(f"extender.mix_file {path}{yamlload.describe_error(err)}") from err
    try:
        return parse_mix(data, source=f"extender.mix_file {path}")
    except MixError as err:
        raise SettingsError(str(err)) from err


def parse_bind(bind: str, *, what: str = "health_bind") -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:8080`` for IPv6) as a tuple; SettingsError names the bad value."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SettingsError(f"{what} must be HOST:PORT, got {bind!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


_TYPES: dict[str, tuple[type, ...]] = {
    "float": (int, float), "int": (int,), "bool": (bool,), "str": (str,), "str | None": (str, type(None)),
}


def _build(cls: type, data: Any, source: str, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise SettingsError(f"{source}: {prefix.rstrip('.') or 'the top level'} must be a mapping, "
                            f"got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{prefix}{key}"
        fld = fields.get(key)
        if fld is None:
            raise SettingsError(f"{source}: unknown key {where!r}; known keys here: {', '.join(sorted(fields))}")
        kind = fld.type if isinstance(fld.type, str) else getattr(fld.type, "__name__", str(fld.type))
        sections: dict[str, type] = {"TierThresholds": TierThresholds, "PrometheusSettings": PrometheusSettings,
                                     "LeaseSettings": LeaseSettings, "InventorySettings": InventorySettings,
                                     "ExtenderServing": ExtenderServing, "UsageSettings": UsageSettings,
                                     "RebalanceSettings": RebalanceSettings}
        if kind == "HealthPolicy":
            values[key] = healthschema.parse(value, where=where)
            continue
        if kind in sections:
            section = sections[kind]
            values[key] = _build(section, value if value is not None else {}, source, f"{where}.")
            continue
        allowed = _TYPES.get(kind)
        if allowed is None:  # pragma: no cover - a field type this loader does not know
            raise TypeError(f"settings field {where} has unsupported type {kind}")
        if isinstance(value, bool) and bool not in allowed:
            raise SettingsError(f"{source}: {where} must be a {kind}, got a boolean")
        if not isinstance(value, allowed):
            raise SettingsError(f"{source}: {where} must be a {kind}, got {value!r}")
        values[key] = float(value) if kind == "float" else value  # type: ignore[arg-type]  # checked above
    return cls(**values)
