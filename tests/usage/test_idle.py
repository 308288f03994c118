"""Idle findings and what may be done about each: found only when measured idle for the whole
window, and reclaimed only where a policy allows it, within the budget, for pods a controller recreates."""

from __future__ import annotations

import pytest

from tests.usage.cluster import T0, pod
from webhook.policy import parsing
from webhook.policy.model import IdleRules, PolicySet
from webhook.usage import idle
from webhook.usage.idle import Measurement, Rule
from webhook.usage.workloads import PodRecord, record_of

HOUR = 3600
NOW = T0 + 3 * HOUR
IDLE = Measurement(highest=0.02, mean=0.01, coverage=1.0)
DEPLOYMENT = {"owner": ("ReplicaSet", "nb-5d8f7"), "template_hash": "5d8f7"}


def policies(idle_spec: str, *, mode: str = "enforce", namespaces: str = '["ml"]') -> PolicySet:
    text = f"""apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {{name: notebooks}}
spec:
  mode: {mode}
  match: {{namespaces: {namespaces}}}
  idle: {idle_spec}
"""
    return parsing.parse([("notebooks.yaml", text)])


def record(name: str = "nb", **fields: object) -> PodRecord:
    found = record_of(pod(name, "n", {"nvidia.com/gpu": 1}, **{**DEPLOYMENT, **fields}))  # type: ignore[arg-type]
    assert found is not None
    return found


def decide(records: list[PodRecord], found: PolicySet | None, measured: dict[str, Measurement], *,
           budget: int = 10) -> dict[str, tuple[str, str]]:
    """pod -> (action, reason) for every finding."""
    rules = {r.key: idle.rule_for(r, found) for r in records}
    windows = {w: measured for w in idle.windows(rules.values())}
    findings = idle.find(records, {r.key: 1.0 for r in records}, rules, windows, NOW)
    return {d.finding.record.name: (d.action, d.reason) for d in idle.plan(findings, evictions_left=budget)}


EVICT = policies("{action: evict, after: 2h}")


def test_an_idle_pod_a_deployment_recreates_is_evicted_where_the_policy_says_evict() -> None:
    assert decide([record()], EVICT, {"ml/nb": IDLE}) == {"nb": ("evict", "")}


@pytest.mark.parametrize(("measured", "started", "why"), [
    (None, T0, "no activity series: unknown is not idle"),
    (Measurement(highest=0.05, mean=0.01, coverage=1.0), T0, "the busiest sample reached the threshold"),
    (Measurement(highest=0.9, mean=0.02, coverage=1.0), T0, "busy once in the window"),
    (Measurement(highest=0.01, mean=0.01, coverage=0.5), T0, "half the window has no samples"),
    (IDLE, NOW - HOUR, "the pod is younger than the window (a recreated pod with its predecessor's name)"),
])
def test_no_finding_unless_measured_idle_for_the_whole_window(measured: Measurement | None, started: float,
                                                               why: str) -> None:
    found = decide([record(started=started)], EVICT, {} if measured is None else {"ml/nb": measured})
    assert found == {}, why


@pytest.mark.parametrize(("found", "labels", "fields", "expected"), [
    (None, {}, {}, ("report", "")),  # no policy: the defaults, report only
    (policies("{}"), {}, {}, ("report", "")),  # a policy without spec.idle: the defaults
    (policies("{action: annotate}"), {}, {}, ("annotate", "")),
    (policies("{action: evict}", mode="audit"), {}, {}, ("report", "policy notebooks is in audit mode")),
    (EVICT, {"gpugate.io/no-reclaim": "true"}, {}, ("report", "the pod opts out of reclaim")),
    (policies("{action: evict, exclude: {matchLabels: {keep: \"on\"}}}"), {"keep": "on"}, {},
     ("report", "the pod opts out of reclaim")),
    (EVICT, {}, {"owner": None, "template_hash": ""},
     ("report", "no controller would recreate it (no controller made it)")),
    (EVICT, {}, {"owner": ("Job", "train"), "template_hash": ""},
     ("report", "no controller would recreate it (its controller is a Job)")),
    (policies("{action: evict}", namespaces='["other"]'), {}, {}, ("report", "")),  # the policy does not match
], ids=["defaults", "policy-without-idle", "annotate", "audit", "no-reclaim-label", "exclude", "bare-pod", "job",
        "other-namespace"])
def test_the_action_is_lowered_where_it_must_not_be_taken(found: PolicySet | None, labels: dict, fields: dict,
                                                          expected: tuple[str, str]) -> None:
    made = record_of(pod("nb", "n", {"nvidia.com/gpu": 1}, labels=labels, **{**DEPLOYMENT, **fields}))
    assert made is not None
    assert decide([made], found, {"ml/nb": IDLE}) == {"nb": expected}


def test_the_budget_evicts_the_most_gpus_first_and_reports_the_rest() -> None:
    records = [record(f"nb-{i}") for i in range(3)]
    rules = {r.key: idle.rule_for(r, EVICT) for r in records}
    measured = {2 * HOUR: {r.key: IDLE for r in records}}
    findings = idle.find(records, {"ml/nb-0": 1.0, "ml/nb-1": 4.0, "ml/nb-2": 2.0}, rules, measured, NOW)
    decided = {d.finding.record.name: d.action for d in idle.plan(findings, evictions_left=2)}
    assert decided == {"nb-0": "report", "nb-1": "evict", "nb-2": "evict"}
    assert all(d.action == "report" for d in idle.plan(findings, evictions_left=0))


def test_each_policy_is_measured_over_its_own_window() -> None:
    rules = [Rule(IdleRules(after=w)) for w in ("2h", "30m", "120m")]
    assert idle.windows(rules) == [1800, 7200]


def test_an_annotation_is_taken_off_only_once_the_pod_is_measured_busy() -> None:
    marked = record(annotations={"gpugate.io/idle": "x"})
    assert marked.idle_note == "x"
    rules = {marked.key: idle.rule_for(marked, EVICT)}
    busy = {2 * HOUR: {marked.key: Measurement(highest=0.5, mean=0.3, coverage=1.0)}}
    assert idle.to_clear([marked], [], rules, busy) == [marked]
    assert idle.to_clear([marked], [], rules, {}) == []  # no data keeps it


def test_a_finding_says_what_was_measured_against_which_rule() -> None:
    [finding] = idle.find([record()], {"ml/nb": 1.0}, {"ml/nb": idle.rule_for(record(), EVICT)},
                          {2 * HOUR: {"ml/nb": IDLE}}, NOW)
    assert finding.describe() == ("1 GPU idle for 2h: DCGM activity 1.0% on average, at most 2.0%, under the 5% "
                                  "of policy notebooks")


def test_idle_pods_and_gpus_are_summed_by_namespace_and_owner() -> None:
    records = [record("a"), record("b"), record("c", owner=("StatefulSet", "lab"), template_hash="")]
    rules = {r.key: idle.rule_for(r, None) for r in records}
    findings = idle.find(records, {"ml/a": 1.0, "ml/b": 0.5, "ml/c": 2.0}, rules,
                         {2 * HOUR: {r.key: IDLE for r in records}}, NOW)
    summed = {(ns, o.kind, o.name): v for (ns, o), v in idle.by_owner(findings).items()}
    assert summed == {("ml", "Deployment", "nb"): (2, 1.5), ("ml", "StatefulSet", "lab"): (1, 2.0)}
