"""Idle allocations: which pods hold GPUs they do not use, and what may be done about each. Pure.

A pod is an idle finding when all of this holds (``find``):

- it holds GPUs now (``accounting``), and has run at least the rule's ``after`` (a pod recreated
  under the same name must not inherit its predecessor's history);
- Prometheus measured its GPUs' activity over the whole of ``after``: samples cover at least
  :data:`MIN_COVERAGE` of it (a gap in the data is not idleness);
- the highest activity measured in that time is under the rule's ``threshold`` (each measuring
  step is the mean of the DCGM samples in it: ``promql.idle_query``).

A pod Prometheus has no activity for is never a finding: unknown is not idle. On a time-sliced
GPU every pod sees the whole GPU's activity, so a slot is idle only when the whole GPU is.

The rule is the ``spec.idle`` of the policy that selects the pod (``policy.matching.select``),
else the defaults (``policy.model.IdleRules``: report only). ``plan`` then says per finding
what to do, lowering the action where it must not be taken: a policy in audit mode reports; a pod
that opts out (:data:`names.NO_RECLAIM_LABEL` or the rule's ``exclude``) is reported only;
``evict`` is for pods a controller recreates (``workloads.RECREATING_CONTROLLERS``) and only
within the eviction budget, the most GPUs first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from webhook import durations, names
from webhook.policy import matching
from webhook.policy.model import IdleRules, PolicySet
from webhook.usage.accounting import Holding
from webhook.usage.workloads import Owner, PodRecord

MIN_COVERAGE = 0.9
"""Share of ``after`` the activity samples must cover: a scrape or two may be lost, an hour may not."""
NO_RECLAIM_VALUE = "true"
Action = Literal["report", "annotate", "evict"]


@dataclass(frozen=True, slots=True)
class Rule:
    """The idle rule that applies to a pod, and where it comes from."""

    rules: IdleRules
    policy: str = ""
    """The policy's name; empty: no policy selects the pod (the defaults apply)."""
    audit: bool = False


@dataclass(frozen=True, slots=True)
class Measurement:
    """A pod's GPU activity over one window, as Prometheus answered (0..1)."""

    highest: float
    mean: float
    coverage: float
    """Share of the window the samples cover (0..1)."""

    def stayed_under(self, threshold: float) -> bool:
        """The busiest measuring step under ``threshold``, the steps covering enough of the window."""
        return self.coverage >= MIN_COVERAGE and self.highest < threshold


@dataclass(frozen=True, slots=True)
class Finding:
    """A pod whose GPUs stayed idle, with what was measured and the rule it was measured against."""

    record: PodRecord
    gpus: float
    rule: Rule
    measured: Measurement

    def describe(self) -> str:
        """What was measured, against what: the text of the Event and of the annotation."""
        rules = self.rule.rules
        source = f"policy {self.rule.policy}" if self.rule.policy else "the default rule"
        return (f"{_gpus(self.gpus)} idle for {durations.text(rules.after_seconds)}: DCGM activity "
                f"{self.measured.mean:.1%} on average, at most {self.measured.highest:.1%}, under the "
                f"{rules.threshold:.0%} of {source}")


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one finding: its action after every rule that may lower it, and why."""

    finding: Finding
    action: Action
    reason: str = ""
    """Why the action is lower than the rule's (empty when it is the rule's)."""


def _gpus(gpus: float) -> str:
    return f"{gpus:g} GPU" + ("" if gpus == 1 else "s")


def rule_for(record: PodRecord, policies: PolicySet | None) -> Rule:
    """The ``spec.idle`` of the policy selecting the pod (as admission would select it), or the defaults."""
    policy = None if policies is None else matching.select(
        policies, record.as_pod(), namespace=record.namespace, honor_skip=False, asks_for_gpus=True)
    if policy is None:
        return Rule(IdleRules())
    return Rule(policy.idle, policy.name, audit=policy.mode == "audit")


def windows(rules: Iterable[Rule]) -> list[int]:
    """The distinct ``after`` windows (seconds) the rules need measured, shortest first."""
    return sorted({r.rules.after_seconds for r in rules})


def held_gpus(holdings: Iterable[Holding]) -> dict[str, float]:
    """GPUs per pod key (``namespace/name``)."""
    out: dict[str, float] = {}
    for h in holdings:
        key = f"{h.namespace}/{h.pod}"
        out[key] = out.get(key, 0.0) + h.gpus
    return out


def is_idle(record: PodRecord, rule: Rule, measured: Measurement | None, now: float) -> bool:
    """The three conditions of the module docstring."""
    old_enough = record.started is not None and record.started <= now - rule.rules.after_seconds
    return old_enough and measured is not None and measured.stayed_under(rule.rules.threshold)


def find(records: Iterable[PodRecord], gpus: Mapping[str, float], rules: Mapping[str, Rule],
         measured: Mapping[int, Mapping[str, Measurement]], now: float) -> list[Finding]:
    """The idle findings among ``records``; ``measured``: per window, per pod key. Sorted by pod key."""
    found = []
    for record in sorted(records, key=lambda r: r.key):
        held, rule = gpus.get(record.key, 0.0), rules.get(record.key)
        if held <= 0 or rule is None:
            continue
        measurement = measured.get(rule.rules.after_seconds, {}).get(record.key)
        if is_idle(record, rule, measurement, now):
            assert measurement is not None
            found.append(Finding(record, held, rule, measurement))
    return found


def opted_out(record: PodRecord, rules: IdleRules) -> bool:
    labels = record.label_map
    if labels.get(names.NO_RECLAIM_LABEL) == NO_RECLAIM_VALUE:
        return True
    return rules.exclude is not None and matching.selector_matches(rules.exclude, labels)


def lowered(finding: Finding) -> tuple[Action, str]:
    """The finding's action after audit mode, opt-outs and the controller rule (not the budget)."""
    rule, record = finding.rule, finding.record
    action: Action = rule.rules.action
    if action == "report":
        return action, ""
    if rule.audit:
        return "report", f"policy {rule.policy} is in audit mode"
    if opted_out(record, rule.rules):
        return "report", "the pod opts out of reclaim"
    if action == "evict" and not record.recreated:
        what = f"its controller is a {record.controller}" if record.controller else "no controller made it"
        return "report", f"no controller would recreate it ({what})"
    return action, ""


def plan(findings: Iterable[Finding], *, evictions_left: int) -> list[Decision]:
    """Every finding's decision; at most ``evictions_left`` evictions, those holding the most GPUs first
    (then the least active, then by name), the others lowered to report with the reason."""
    decisions: list[Decision] = []
    evictable: list[Finding] = []
    for finding in findings:
        action, reason = lowered(finding)
        if action == "evict":
            evictable.append(finding)
        else:
            decisions.append(Decision(finding, action, reason))
    evictable.sort(key=lambda f: (-f.gpus, f.measured.highest, f.record.key))
    for i, finding in enumerate(evictable):
        if i < evictions_left:
            decisions.append(Decision(finding, "evict"))
        else:
            decisions.append(Decision(finding, "report", "the eviction budget is spent for now"))
    return sorted(decisions, key=lambda d: d.finding.record.key)


def to_clear(records: Iterable[PodRecord], findings: Iterable[Finding], rules: Mapping[str, Rule],
             measured: Mapping[int, Mapping[str, Measurement]]) -> list[PodRecord]:
    """Pods that carry the idle annotation but were measured busy since: theirs is taken off.

    Only a measurement that shows activity at or over the threshold clears it; no data keeps it."""
    idle = {f.record.key for f in findings}
    out = []
    for record in records:
        rule = rules.get(record.key)
        if record.idle_note is None or record.key in idle or rule is None:
            continue
        measurement = measured.get(rule.rules.after_seconds, {}).get(record.key)
        if measurement is not None and measurement.highest >= rule.rules.threshold:
            out.append(record)
    return sorted(out, key=lambda r: r.key)


def by_owner(findings: Iterable[Finding]) -> dict[tuple[str, Owner], tuple[int, float]]:
    """(namespace, owner) -> (idle pods, GPUs they hold): what the idle metric exports."""
    out: dict[tuple[str, Owner], tuple[int, float]] = {}
    for f in findings:
        key = (f.record.namespace, f.record.owner)
        pods, gpus = out.get(key, (0, 0.0))
        out[key] = (pods + 1, gpus + f.gpus)
    return out
