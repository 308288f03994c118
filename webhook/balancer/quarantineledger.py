"""The quarantine ledger: every quarantined GPU, each one's history, and operators' releases (pure).

One JSON document in the ConfigMap ``gpugate-health`` (the balancer's namespace) is the whole
state of the health loop. DeviceTaintRules, node taints and validation pods are derived from it
and repaired from it on every pass, so a rule deleted by hand comes back, and a new leader (or a
restarted one) continues exactly where the last stopped: the times in it are wall-clock Unix
seconds, never a process's monotonic clock. ``gpugate health release`` adds an operator's
request; only the leader acts on it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from webhook.errors import GpugateError

FORMAT = 1
KEY = "ledger.json"
"""The ConfigMap's data key."""


class LedgerError(GpugateError):
    """The ledger document cannot be read; the message says what is wrong and how to recover."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Quarantine:
    """One GPU out of service. ``gpu`` empty: the node's GPUs the device plugin reports unhealthy."""

    node: str
    gpu: str
    rule: str
    signal: str
    reason: str
    """What was seen, as a person reads it (``XID 79``)."""
    slug: str
    """The taint value (``xid-79``)."""
    since: float
    hold_until: float
    strikes: int = 1
    """Quarantines of this GPU within the repeat window, this one included."""
    effect: str = "NoSchedule"
    """What its taint carries now: ``None`` (dry run), ``NoSchedule`` or ``NoExecute``."""
    final_effect: str = "NoSchedule"
    escalate_at: float = 0.0
    """When ``NoSchedule`` turns ``NoExecute`` (0: not pending)."""
    dry_run: bool = False
    validation: str = ""
    """``running`` while a validation pod is out; empty otherwise."""
    validation_pod: str = ""
    validation_started: float = 0.0
    failed_validations: int = 0
    last_fault: float = 0.0
    """When the last event held against it happened: a later one is a relapse."""

    @property
    def key(self) -> tuple[str, str]:
        return self.node, self.gpu

    def returns_when(self, now: float) -> str:
        """What will return it, for ``gpugate health``."""
        if self.dry_run:
            return "dry run: ends once the hold is over"
        if self.validation == "running":
            return f"validation pod {self.validation_pod} succeeds"
        wait = "" if now >= self.hold_until else "the hold ends, then "
        return f"{wait}a validation pod passes on it (or: gpugate health release)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Returned:
    """A GPU that came back: remembered for ``repeat_window`` so that a relapse holds longer."""

    node: str
    gpu: str
    strikes: int
    at: float
    how: str
    """``validated``, ``operator`` or ``hold`` (a dry run's end)."""
    note: str = ""
    """Who released it and why (an operator), or the validation pod that passed."""
    accepted: tuple[str, ...] = ()
    """Conditions (taint values) an operator released it with: not held against it again until
    each has cleared once (a release would otherwise last one pass)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseRequest:
    """``gpugate health release``: who asked to return which GPU, why, and when."""

    node: str
    gpu: str
    by: str
    reason: str
    at: float


@dataclass(frozen=True, slots=True)
class Ledger:
    quarantines: tuple[Quarantine, ...] = ()
    returned: tuple[Returned, ...] = ()
    requests: tuple[ReleaseRequest, ...] = field(default=())

    def find(self, node: str, gpu: str) -> Quarantine | None:
        return next((q for q in self.quarantines if q.key == (node, gpu)), None)

    def last_return(self, node: str, gpu: str) -> Returned | None:
        found = [r for r in self.returned if (r.node, r.gpu) == (node, gpu)]
        return max(found, key=lambda r: r.at) if found else None

    def with_request(self, request: ReleaseRequest) -> Ledger:
        kept = tuple(r for r in self.requests if (r.node, r.gpu) != (request.node, request.gpu))
        return replace(self, requests=kept + (request,))


def encode(ledger: Ledger) -> str:
    """The ConfigMap's data: stable (sorted) JSON, so an unchanged ledger is an unchanged string."""
    document = {"format": FORMAT,
                "quarantines": [asdict(q) for q in sorted(ledger.quarantines, key=lambda q: q.key)],
                "returned": [asdict(r) for r in sorted(ledger.returned, key=lambda r: (r.node, r.gpu, r.at))],
                "requests": [asdict(r) for r in sorted(ledger.requests, key=lambda r: (r.node, r.gpu))]}
    return json.dumps(document, sort_keys=True, indent=1)


def decode(text: str | None, *, where: str = "the ledger") -> Ledger:
    """The ledger ``text`` holds (None or empty: an empty ledger); LedgerError when unreadable."""
    if not text:
        return Ledger()
    try:
        document = json.loads(text)
    except ValueError as err:
        raise LedgerError(f"{where} is not JSON ({err}); fix or delete its {KEY} key") from err
    found = document.get("format") if isinstance(document, dict) else document
    if not isinstance(document, dict) or found != FORMAT:
        raise LedgerError(f"{where}: expected a document of format {FORMAT}, got {found!r}")
    try:
        return Ledger(quarantines=tuple(_build(Quarantine, q) for q in document.get("quarantines") or ()),
                      returned=tuple(_build(Returned, r) for r in document.get("returned") or ()),
                      requests=tuple(_build(ReleaseRequest, r) for r in document.get("requests") or ()))
    except (TypeError, ValueError) as err:
        raise LedgerError(f"{where}: {err}") from err


def _build(cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ValueError(f"expected an object for {cls.__name__}, got {raw!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"{cls.__name__} has no field {unknown[0]!r}")
    values = {}
    for name, value in raw.items():
        kind = known[name].type
        if kind == "float":
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"{cls.__name__}.{name} must be a number, got {value!r}")
            value = float(value)
        elif kind == "tuple[str, ...]":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{cls.__name__}.{name} must be a list of strings, got {value!r}")
            value = tuple(value)
        elif kind in ("str", "int", "bool") and type(value).__name__ != kind:
            raise ValueError(f"{cls.__name__}.{name} must be a {kind}, got {value!r}")
        values[name] = value
    return cls(**values)
