"""The health loop's decisions: a pure function of the policy, the ledger, what was observed and now.

:func:`decide` takes the last ledger and this pass's observations and returns the next ledger
and what happened (for Events, metrics and logs). Nothing here writes anything; the edge
(``quarantineloop``) stores the ledger first and then brings the cluster to it
(``quarantineplan``), so a crash between the two repeats the second half, never the first.

The rules, each tested in tests/balancer/test_quarantine.py:

- a rule fires for a GPU when ``count`` events of its signal fall within its ``window`` (and
  after the GPU's last return: an event that a validated return already answered is not held
  against the GPU again), or while its condition holds; the strongest rule that fires names the
  quarantine (``NoExecute`` over ``NoSchedule``, then the policy's order);
- the hold is ``policy.hold_for(strikes)``: a GPU quarantined again within ``repeat_window`` of its
  return holds longer, and so does one that fails its validation or has a new event while out;
- a GPU returns only when its validation pod succeeded, after the hold, with no condition left
  and with every Prometheus query of the pass answered (a fault could be hiding otherwise); or by
  an operator's release; a dry-run quarantine ends with its hold;
- a validation starts only after the hold, on a GPU no other claim holds (the pod could not get it).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from webhook.balancer.healthpolicy import HealthPolicy, Rule
from webhook.balancer.healthsignals import Fault
from webhook.balancer.quarantineledger import Ledger, Quarantine, Returned

GpuKey = tuple[str, str]
STRENGTH = {"NoSchedule": 1, "NoExecute": 2}


@dataclass(frozen=True, slots=True)
class Observed:
    """What one pass saw."""

    faults: tuple[Fault, ...] = ()
    signals_ok: bool = True
    """Every Prometheus query of the pass answered. False: nothing returns this pass."""
    pods: Mapping[str, str] = field(default_factory=dict)
    """Validation pod name -> its phase; a pod not made yet is absent."""
    busy: frozenset[GpuKey] = frozenset()
    """GPUs a claim other than a validation's holds (a validation pod could not get them yet)."""


@dataclass(frozen=True, slots=True)
class Action:
    """One thing that happened: ``quarantined``, ``relapsed``, ``escalated``, ``validating``,
    ``validation-failed``, ``blocked``, ``returned`` or ``request-ignored``."""

    kind: str
    node: str
    gpu: str
    quarantine: Quarantine | None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    ledger: Ledger
    actions: tuple[Action, ...] = ()


def decide(policy: HealthPolicy, ledger: Ledger, observed: Observed, now: float) -> Decision:
    """The next ledger and what happened; see the module docstring for the rules."""
    ledger = _prune(policy, ledger, now)
    actions: list[Action] = []
    for step in (_operator_releases, _forget_cleared, _faults, _escalations, _validations):
        ledger, done = step(policy, ledger, observed, now)
        actions += done
    return Decision(ledger=ledger, actions=tuple(actions))


def validation_pod_name(node: str, gpu: str, strikes: int, attempt: int) -> str:
    """One name per GPU, quarantine and attempt: a new attempt is a new pod, an old one is never reused."""
    digest = hashlib.sha256(f"{node}/{gpu}".encode()).hexdigest()[:12]
    return f"gpugate-validate-{digest}-{strikes}-{attempt}"


def _prune(policy: HealthPolicy, ledger: Ledger, now: float) -> Ledger:
    """The latest return per GPU, forgotten once ``repeat_window`` has passed since it."""
    latest: dict[GpuKey, Returned] = {}
    for item in ledger.returned:
        key = (item.node, item.gpu)
        if now - item.at <= policy.repeat_window and (key not in latest or item.at > latest[key].at):
            latest[key] = item
    return replace(ledger, returned=tuple(latest[k] for k in sorted(latest)))


def _returned(ledger: Ledger, q: Quarantine, now: float, how: str, note: str = "",
              accepted: tuple[str, ...] = ()) -> Ledger:
    others = tuple(r for r in ledger.returned if (r.node, r.gpu) != q.key)
    back = Returned(node=q.node, gpu=q.gpu, strikes=q.strikes, at=now, how=how, note=note, accepted=accepted)
    return replace(ledger, quarantines=tuple(x for x in ledger.quarantines if x.key != q.key),
                   returned=others + (back,))


def _operator_releases(policy: HealthPolicy, ledger: Ledger, observed: Observed,
                       now: float) -> tuple[Ledger, list[Action]]:
    actions = []
    for request in ledger.requests:
        q = ledger.find(request.node, request.gpu)
        detail = f"by {request.by}: {request.reason}"
        if q is None:
            actions.append(Action("request-ignored", request.node, request.gpu, None, f"not quarantined; {detail}"))
            continue
        present = tuple(sorted({f.slug() for f in observed.faults if (f.node, f.gpu) == q.key and not _is_event(f)}))
        ledger = _returned(ledger, q, now, "operator", f"released {detail}", present)
        actions.append(Action("returned", q.node, q.gpu, q, f"released by an operator {detail}"))
    return replace(ledger, requests=()), actions


def _is_event(fault: Fault) -> bool:
    return fault.signal in ("xid", "ecc-dbe")


def _forget_cleared(policy: HealthPolicy, ledger: Ledger, observed: Observed,
                    now: float) -> tuple[Ledger, list[Action]]:
    """A condition an operator released a GPU with counts again once it has been gone for a pass."""
    present = {(f.node, f.gpu, f.slug()) for f in observed.faults if not _is_event(f)}
    returned = tuple(replace(r, accepted=tuple(s for s in r.accepted if (r.node, r.gpu, s) in present))
                     for r in ledger.returned)
    return replace(ledger, returned=returned), []


def _counted(policy: HealthPolicy, rule: Rule, fault: Fault) -> bool:
    if fault.signal != rule.signal:
        return False
    if rule.signal == "xid" or (rule.signal == "driver-taint" and fault.code):
        return policy.counts_xid(rule, fault.code)
    return True


def firing(policy: HealthPolicy, faults: Iterable[Fault], *, after: float, now: float) -> list[tuple[Rule, Fault]]:
    """The rules that fire for one GPU's faults (events after ``after`` only), strongest first."""
    found = list(faults)
    out = []
    for rule in policy.rules:
        relevant = [f for f in found if _counted(policy, rule, f)]
        if rule.is_event:
            relevant = [f for f in relevant if f.at > after and f.at >= now - rule.window]
            if sum(f.count for f in relevant) < rule.count:
                continue
        if relevant:
            out.append((rule, max(relevant, key=lambda f: (f.at, f.code))))
    return sorted(out, key=lambda pair: -STRENGTH[pair[0].effect])


def _by_gpu(faults: Iterable[Fault]) -> dict[GpuKey, list[Fault]]:
    grouped: dict[GpuKey, list[Fault]] = defaultdict(list)
    for fault in faults:
        grouped[(fault.node, fault.gpu)].append(fault)
    return grouped


def _faults(policy: HealthPolicy, ledger: Ledger, observed: Observed, now: float) -> tuple[Ledger, list[Action]]:
    actions = []
    for (node, gpu), faults in sorted(_by_gpu(observed.faults).items()):
        current = ledger.find(node, gpu)
        if current is not None:
            ledger, done = _relapse(policy, ledger, current, faults, now)
            actions += done
            continue
        back = ledger.last_return(node, gpu)
        if back is not None and back.accepted:
            faults = [f for f in faults if _is_event(f) or f.slug() not in back.accepted]
        fired = firing(policy, faults, after=back.at if back else 0.0, now=now)
        if not fired:
            continue
        rule, fault = fired[0]
        strikes = back.strikes + 1 if back is not None else 1
        q = _new(policy, rule, fault, strikes, now)
        ledger = replace(ledger, quarantines=ledger.quarantines + (q,))
        actions.append(Action("quarantined", node, gpu, q, f"rule {rule.name}: {q.reason}"))
    return ledger, actions


def _new(policy: HealthPolicy, rule: Rule, fault: Fault, strikes: int, now: float) -> Quarantine:
    delayed = rule.effect == "NoExecute" and rule.no_execute_after > 0
    effect = "None" if policy.dry_run else ("NoSchedule" if delayed else rule.effect)
    return Quarantine(node=fault.node, gpu=fault.gpu, rule=rule.name, signal=rule.signal, reason=fault.describe(),
                      slug=fault.slug(), since=now, hold_until=now + policy.hold_for(strikes), strikes=strikes,
                      effect=effect, final_effect=rule.effect, dry_run=policy.dry_run,
                      escalate_at=now + rule.no_execute_after if delayed and not policy.dry_run else 0.0,
                      last_fault=max(fault.at, 0.0))


def _relapse(policy: HealthPolicy, ledger: Ledger, q: Quarantine, faults: list[Fault],
             now: float) -> tuple[Ledger, list[Action]]:
    """A new event while out: the hold starts again, longer, and a running validation is dropped."""
    newer = [f for f in faults if _is_event(f) and f.at > q.last_fault
             and any(_counted(policy, rule, f) for rule in policy.rules)]
    if not newer:
        return ledger, []
    fault = max(newer, key=lambda f: f.at)
    attempts = q.failed_validations + 1
    changed = replace(q, last_fault=fault.at, failed_validations=attempts, validation="", validation_pod="",
                      hold_until=max(q.hold_until, now + policy.hold_for(q.strikes + attempts)))
    ledger = _swap(ledger, changed)
    return ledger, [Action("relapsed", q.node, q.gpu, changed, f"{fault.describe()} while quarantined")]


def _swap(ledger: Ledger, q: Quarantine) -> Ledger:
    return replace(ledger, quarantines=tuple(q if x.key == q.key else x for x in ledger.quarantines))


def _escalations(policy: HealthPolicy, ledger: Ledger, observed: Observed,
                 now: float) -> tuple[Ledger, list[Action]]:
    actions = []
    for q in ledger.quarantines:
        if q.escalate_at and now >= q.escalate_at and q.effect == "NoSchedule":
            changed = replace(q, effect="NoExecute", escalate_at=0.0)
            ledger = _swap(ledger, changed)
            actions.append(Action("escalated", q.node, q.gpu, changed, "NoSchedule -> NoExecute"))
    return ledger, actions


def _conditions(faults: Iterable[Fault]) -> set[GpuKey]:
    return {(f.node, f.gpu) for f in faults if not _is_event(f)}


def _validations(policy: HealthPolicy, ledger: Ledger, observed: Observed,
                 now: float) -> tuple[Ledger, list[Action]]:
    held = _conditions(observed.faults)
    actions: list[Action] = []
    for q in ledger.quarantines:
        if q.dry_run:
            if now >= q.hold_until:
                ledger = _returned(ledger, q, now, "hold")
                actions.append(Action("returned", q.node, q.gpu, q, "dry run: the hold is over"))
            continue
        if q.validation == "running":
            ledger, done = _follow(policy, ledger, q, observed, q.key in held, now)
            actions += done
        elif now >= q.hold_until and observed.signals_ok and q.key not in held and q.key not in observed.busy:
            name = validation_pod_name(q.node, q.gpu, q.strikes, q.failed_validations)
            changed = replace(q, validation="running", validation_pod=name, validation_started=now)
            ledger = _swap(ledger, changed)
            actions.append(Action("validating", q.node, q.gpu, changed, f"pod {name}"))
    return ledger, actions


def _follow(policy: HealthPolicy, ledger: Ledger, q: Quarantine, observed: Observed, held: bool,
            now: float) -> tuple[Ledger, list[Action]]:
    """A running validation: passed, failed, timed out, or still going."""
    phase = observed.pods.get(q.validation_pod, "")
    if phase == "Succeeded":
        if held:
            changed = replace(q, validation="", validation_pod="")
            return _swap(ledger, changed), [Action("blocked", q.node, q.gpu, changed,
                                                   "validation passed but a fault condition still holds")]
        if not observed.signals_ok:
            return ledger, []
        return _returned(ledger, q, now, "validated", f"validation pod {q.validation_pod} succeeded"), [
            Action("returned", q.node, q.gpu, q, f"validation pod {q.validation_pod} succeeded")]
    timed_out = now - q.validation_started > policy.validation.timeout
    if phase != "Failed" and not timed_out:
        return ledger, []
    attempts = q.failed_validations + 1
    why = "failed" if phase == "Failed" else f"did not finish within {policy.validation.timeout:g} s"
    changed = replace(q, validation="", validation_pod="", failed_validations=attempts,
                      hold_until=now + policy.hold_for(q.strikes + attempts))
    return _swap(ledger, changed), [Action("validation-failed", q.node, q.gpu, changed,
                                           f"validation pod {q.validation_pod} {why}")]
