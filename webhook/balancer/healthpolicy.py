"""The health policy: which signals quarantine a GPU, for how long, and what returns it (pure).

The ``health:`` section of the balancer's configuration (docs/health.md). Its defaults follow
NVIDIA's XID catalogue as NVSentinel ships it (``xiderrorsmapping.csv``, FATAL column): the XIDs
that take a GPU out of service quarantine it; application faults (13, 31, 43, 45, 68) and the
XIDs NVIDIA's mapping does not treat as fatal (63 row-remap recorded, 92 single-bit wear, 94
contained ECC) never do. XID 109 is left out of both lists: NVSentinel calls it fatal, NVIDIA's
DRA driver skips it as an application error; a site that trusts one of them adds it.

Two kinds of signal:

- *events* (``xid``, ``ecc-dbe``) happen at a moment and are counted: ``count`` of them within
  ``window`` seconds quarantine;
- *conditions* (``row-remap-failure``, ``driver-taint``, ``plugin-unhealthy``) hold while they
  hold: present, the device is quarantined; while present, it never returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from webhook.errors import GpugateError

EVENT_SIGNALS = ("xid", "ecc-dbe")
CONDITION_SIGNALS = ("row-remap-failure", "driver-taint", "plugin-unhealthy")
SIGNALS = EVENT_SIGNALS + CONDITION_SIGNALS
FINAL_EFFECTS = ("NoSchedule", "NoExecute")
NODE_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule")

FATAL_XIDS: tuple[int, ...] = (46, 48, 62, 64, 74, 79, 95, 110, 119, 120, 136, 140, 143, *range(144, 151), 151,
                               155, 156, 158, 160)
"""FATAL in NVSentinel's XID map, 109 aside (see the module docstring)."""
NEVER_XIDS: tuple[int, ...] = (13, 31, 43, 45, 63, 68, 92, 94)
"""Application faults and XIDs NVIDIA's mapping does not take a GPU out of service for."""
VALIDATION_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"
"""The DCGM image the GPU Operator v26.7.0 chart pins."""
VALIDATION_COMMAND = ("/bin/sh", "-c", "nv-hostengine && exec dcgmi diag -r 2")
"""DCGM's medium diagnostic (about two minutes; NVSentinel's default level) on the GPU the pod was given."""


class HealthPolicyError(GpugateError):
    """The ``health`` section is invalid; the message names the key."""


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One signal that quarantines, and how hard."""

    name: str
    signal: str
    xids: tuple[int, ...] = ()
    """For ``xid`` and ``driver-taint``: the XIDs this rule counts; empty: any XID that is not in
    ``never_xids``. ``driver-taint`` also counts the driver's ``gpu-lost`` taint."""
    count: int = 1
    """Events (``xid``, ``ecc-dbe``) needed within ``window`` to quarantine."""
    window: float = 600.0
    """Seconds over which events are counted."""
    effect: str = "NoSchedule"
    """Where the quarantine ends up: ``NoSchedule`` (no new work; running pods stay) or
    ``NoExecute`` (kube-controller-manager deletes the device's pods too)."""
    no_execute_after: float = 0.0
    """With ``effect: NoExecute``: seconds of NoSchedule first, so running pods may finish or
    checkpoint (and, with ``eviction.api_first``, be evicted honouring their budgets)."""

    @property
    def is_event(self) -> bool:
        return self.signal in EVENT_SIGNALS


@dataclass(frozen=True, kw_only=True)
class Validation:
    """The pod that must pass on a device before it returns."""

    image: str = VALIDATION_IMAGE
    command: tuple[str, ...] = VALIDATION_COMMAND
    namespace: str = ""
    """Where validation pods (and their claims) are made. Empty: the balancer's own namespace."""
    timeout: float = 900.0
    """Seconds a validation pod may take, from its creation (scheduling included); then it failed."""
    labels: tuple[tuple[str, str], ...] = ()
    """Extra labels on the pod (e.g. for a NetworkPolicy or a cost report)."""
    service_account: str = ""
    """Empty: the namespace's ``default`` ServiceAccount."""


@dataclass(frozen=True, kw_only=True)
class Eviction:
    """How pods leave a device whose rule ends at NoExecute."""

    api_first: bool = False
    """Evict the device's pods through the Eviction API (PodDisruptionBudgets honoured) during the
    rule's ``no_execute_after``; NoExecute then deletes whatever is left, budget or not. A rule
    without ``no_execute_after`` goes to NoExecute at once, so the Eviction API has no turn."""


def _fatal_rule() -> Rule:
    return Rule(name="fatal-xid", signal="xid", xids=FATAL_XIDS)


def _default_rules() -> tuple[Rule, ...]:
    return (_fatal_rule(), Rule(name="double-bit-ecc", signal="ecc-dbe"),
            Rule(name="row-remap-failure", signal="row-remap-failure"),
            Rule(name="driver-taint", signal="driver-taint", xids=FATAL_XIDS),
            Rule(name="plugin-unhealthy", signal="plugin-unhealthy"))


@dataclass(frozen=True, kw_only=True)
class HealthPolicy:
    """Everything the health loop decides by; off unless ``enabled``."""

    enabled: bool = False
    """Off by default: quarantine is an automated action on the cluster, switched on by its owner."""
    dry_run: bool = False
    """Write every quarantine as a DeviceTaintRule with effect ``None`` (kube-controller-manager
    then counts, in the rule's status, the pods NoExecute would evict), an Event and a metric;
    no node taint, no ``gpu-free`` change, no eviction, no validation pod. A dry-run quarantine
    ends after its hold."""
    interval: float = 5.0
    """Seconds between two passes (one Prometheus query per signal, one read of the ledger)."""
    step: float = 5.0
    """Resolution, in seconds, of the subquery that dates an XID series' first sample: the time of an
    XID is known to within a step (it is found at once all the same)."""
    hold: float = 1800.0
    """Seconds a device stays out before it may be validated (the first time)."""
    hold_growth: float = 2.0
    """A device quarantined again within ``repeat_window`` of its return, or failing its
    validation, waits ``hold * hold_growth ** (strikes - 1)``: flapping is damped."""
    hold_max: float = 7 * 86400.0
    repeat_window: float = 7 * 86400.0
    """Seconds after a return within which a new fault counts as a repeat (a strike)."""
    never_xids: tuple[int, ...] = NEVER_XIDS
    rules: tuple[Rule, ...] = field(default_factory=_default_rules)
    validation: Validation = field(default_factory=Validation)
    eviction: Eviction = field(default_factory=Eviction)
    node_taint_effect: str = "NoSchedule"
    """Under the device plugin (no per-device fence), the ``gpugate.io/gpu-unhealthy`` node taint's
    effect. ``PreferNoSchedule`` keeps the node's healthy GPUs in use but may hand the faulty one out."""

    @property
    def lookback(self) -> float:
        """Seconds of history the event queries read: the longest window."""
        return max((r.window for r in self.rules if r.is_event), default=600.0)

    def rules_for(self, signal: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.signal == signal)

    def hold_for(self, strikes: int) -> float:
        """The hold of a device on its ``strikes``-th quarantine or failed validation (1, 2, ...)."""
        return min(self.hold * self.hold_growth ** max(strikes - 1, 0), max(self.hold_max, self.hold))

    def counts_xid(self, rule: Rule, xid: int) -> bool:
        """Whether ``rule`` counts XID ``xid``: never one of ``never_xids``."""
        if xid in self.never_xids:
            return False
        return not rule.xids or xid in rule.xids

    def check(self) -> HealthPolicy:
        """Raise HealthPolicyError for a policy whose parts contradict each other; else return it."""
        names = [r.name for r in self.rules]
        for name in {n for n in names if names.count(n) > 1}:
            raise HealthPolicyError(f"health.rules: two rules are named {name!r}; names must be unique")
        for index, rule in enumerate(self.rules):
            where = f"health.rules[{index}] ({rule.name})"
            contradicted = sorted(set(rule.xids) & set(self.never_xids))
            if contradicted:
                raise HealthPolicyError(f"{where}: XIDs {contradicted} are in health.never_xids, which never "
                                        "quarantine; remove them from one of the two lists")
            if rule.xids and rule.signal not in ("xid", "driver-taint"):
                raise HealthPolicyError(f"{where}: xids apply to the xid and driver-taint signals only")
            if not rule.is_event and (rule.count != 1 or rule.window != 600.0):
                raise HealthPolicyError(f"{where}: {rule.signal} is a condition (quarantined while it holds); "
                                        "count and window apply to the xid and ecc-dbe signals only")
            if rule.no_execute_after and rule.effect != "NoExecute":
                raise HealthPolicyError(f"{where}: no_execute_after needs effect: NoExecute")
        if self.hold_max < self.hold:
            raise HealthPolicyError(f"health.hold_max ({self.hold_max:g}) must be >= health.hold ({self.hold:g})")
        if self.validation.timeout <= 0 or self.interval <= 0 or self.step <= 0:
            raise HealthPolicyError("health.interval, health.step and health.validation.timeout must be > 0")
        return self
