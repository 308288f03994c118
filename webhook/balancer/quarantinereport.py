"""What ``gpugate health`` shows: each quarantined GPU, why, since when, and what returns it (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.balancer.quarantineledger import Ledger, Quarantine
from webhook.errors import GpugateError
from webhook.kube.devicetaints import RuleView
from webhook.kube.timestamps import rfc3339

COLUMNS = ("NODE", "GPU", "DEVICES", "SIGNAL", "RULE", "EFFECT", "SINCE", "STRIKES", "RETURNS WHEN")


class NotQuarantined(GpugateError):
    """A release names no quarantined GPU, or several; the message lists what is quarantined there."""


def rows(ledger: Ledger, rules: Iterable[RuleView], now: float) -> list[dict[str, Any]]:
    """One row per quarantined GPU, with the DRA devices its rules taint and what kube-controller-manager
    reported on them (a dry run's count of the pods NoExecute would evict)."""
    by_gpu: dict[tuple[str, str], list[RuleView]] = {}
    for rule in rules:
        annotations = dict(rule.annotations)
        by_gpu.setdefault((annotations.get("gpugate.io/node", ""), annotations.get("gpugate.io/gpu", "")),
                          []).append(rule)
    out = []
    for q in sorted(ledger.quarantines, key=lambda q: (q.node, q.gpu)):
        found = sorted(by_gpu.get(q.key, ()), key=lambda r: r.name)
        out.append({"node": q.node, "gpu": q.gpu or "(device plugin)",
                    "devices": [r.device.device for r in found if r.device is not None],
                    "signal": q.reason, "rule": q.rule, "effect": q.effect, "since": rfc3339(q.since),
                    "hold_until": rfc3339(q.hold_until), "strikes": q.strikes, "returns_when": _returns(q, now),
                    "controller": sorted({r.status for r in found if r.status})})
    return out


def _returns(q: Quarantine, now: float) -> str:
    when = q.returns_when(now)
    if now < q.hold_until and not q.dry_run:
        return f"hold until {rfc3339(q.hold_until)}, then {when.removeprefix('the hold ends, then ')}"
    return when


def table(found: list[dict[str, Any]], ledger: Ledger) -> str:
    """The rows as an aligned text table, then pending operator releases and the returns remembered."""
    if not found:
        text = "no GPU is quarantined"
    else:
        cells = [COLUMNS] + [(r["node"], r["gpu"], ",".join(r["devices"]) or "-", r["signal"], r["rule"],
                              r["effect"], r["since"], str(r["strikes"]), r["returns_when"]) for r in found]
        widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
        text = "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
        notes = [f"{r['node']} {r['gpu']}: kube-controller-manager: {s}" for r in found for s in r["controller"]]
        text += "".join(f"\n{n}" for n in notes)
    pending = [f"release of {r.node} {r.gpu or '(device plugin)'} asked by {r.by} at {rfc3339(r.at)}: {r.reason} "
               "(the balancer's leader acts on it at its next pass)" for r in ledger.requests]
    back = [f"returned {r.node} {r.gpu or '(device plugin)'} at {rfc3339(r.at)} ({r.how}, strike {r.strikes}"
            f"{': ' + r.note if r.note else ''})" for r in sorted(ledger.returned, key=lambda r: r.at)]
    return text + "".join(f"\n{line}" for line in pending + back)


def target(ledger: Ledger, node: str, gpu: str | None) -> Quarantine:
    """The one quarantine ``node`` and ``gpu`` (a UUID or its unique prefix; None: the node's only one) name."""
    on_node = [q for q in ledger.quarantines if q.node == node]
    listed = ", ".join(q.gpu or "(device plugin)" for q in on_node) or "none"
    if gpu is None:
        if len(on_node) == 1:
            return on_node[0]
        raise NotQuarantined(f"node {node} has {len(on_node)} quarantined GPUs ({listed}): name one")
    exact = [q for q in on_node if q.gpu == gpu]
    matches = exact or [q for q in on_node if gpu and q.gpu.startswith(gpu)]
    if len(matches) != 1:
        raise NotQuarantined(f"{'no' if not matches else 'more than one'} quarantined GPU {gpu!r} on node {node} "
                             f"(quarantined there: {listed}); `gpugate health` lists them")
    return matches[0]


def as_json(found: list[dict[str, Any]], ledger: Ledger) -> Mapping[str, Any]:
    return {"quarantined": found,
            "requests": [{"node": r.node, "gpu": r.gpu, "by": r.by, "reason": r.reason, "at": rfc3339(r.at)}
                         for r in ledger.requests],
            "returned": [{"node": r.node, "gpu": r.gpu, "at": rfc3339(r.at), "how": r.how, "strikes": r.strikes,
                          "note": r.note} for r in ledger.returned]}
