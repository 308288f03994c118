"""The ``health:`` section's JSON Schema, and reading the section into a ``HealthPolicy`` (pure).

The schema is the contract docs/health.md documents key by key (a test holds the two together);
the YAML is checked against it first, so every error names its dotted path, and only then
built into frozen values whose cross-checks (``HealthPolicy.check``) come last.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema

from webhook.balancer.healthpolicy import (
    FINAL_EFFECTS,
    NODE_TAINT_EFFECTS,
    SIGNALS,
    Eviction,
    HealthPolicy,
    HealthPolicyError,
    Rule,
    Validation,
)

_SECONDS = {"type": "number", "exclusiveMinimum": 0}
_XIDS = {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 1023}, "uniqueItems": True}
_LABEL_VALUE = {"type": "string", "maxLength": 63, "pattern": r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"}

RULE_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["name", "signal"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
                 "description": "Named in Events, metrics and `gpugate health` (a DNS label)."},
        "signal": {"enum": list(SIGNALS)},
        "xids": _XIDS,
        "count": {"type": "integer", "minimum": 1},
        "window": _SECONDS,
        "effect": {"enum": list(FINAL_EFFECTS)},
        "no_execute_after": {"type": "number", "minimum": 0},
    },
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "additionalProperties": False,
    "properties": {
        "enabled": {"type": "boolean"},
        "dry_run": {"type": "boolean"},
        "interval": _SECONDS,
        "step": _SECONDS,
        "hold": {"type": "number", "minimum": 0},
        "hold_growth": {"type": "number", "minimum": 1},
        "hold_max": {"type": "number", "minimum": 0},
        "repeat_window": {"type": "number", "minimum": 0},
        "never_xids": _XIDS,
        "rules": {"type": "array", "items": RULE_SCHEMA},
        "validation": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "image": {"type": "string", "minLength": 1},
                "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "namespace": {"type": "string"},
                "timeout": _SECONDS,
                "labels": {"type": "object", "additionalProperties": _LABEL_VALUE},
                "service_account": {"type": "string"},
            },
        },
        "eviction": {"type": "object", "additionalProperties": False,
                     "properties": {"api_first": {"type": "boolean"}}},
        "node_taint_effect": {"enum": list(NODE_TAINT_EFFECTS)},
    },
}
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _path(error: jsonschema.ValidationError, where: str) -> str:
    out = where
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def parse(data: Any, *, where: str = "health") -> HealthPolicy:
    """The policy ``data`` describes (None: the defaults); HealthPolicyError names the first bad key."""
    data = {} if data is None else data
    errors = sorted(_VALIDATOR.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        first = errors[0]
        if first.validator == "additionalProperties" and isinstance(first.instance, Mapping):
            known = sorted(first.schema.get("properties") or ())
            unknown = sorted(set(first.instance) - set(known))
            raise HealthPolicyError(f"{_path(first, where)}: unknown key {unknown[0]!r}; known keys here: "
                                    f"{', '.join(known)}")
        raise HealthPolicyError(f"{_path(first, where)}: {first.message}")
    values: dict[str, Any] = {k: v for k, v in data.items() if k not in ("rules", "validation", "eviction")}
    for key in ("interval", "step", "hold", "hold_growth", "hold_max", "repeat_window"):
        if key in values:
            values[key] = float(values[key])
    if "never_xids" in values:
        values["never_xids"] = tuple(sorted(values["never_xids"]))
    if "rules" in data:
        values["rules"] = tuple(_rule(r) for r in data["rules"])
    if "validation" in data:
        values["validation"] = _validation(data["validation"])
    if "eviction" in data:
        values["eviction"] = Eviction(**data["eviction"])
    return HealthPolicy(**values).check()


def _rule(raw: Mapping[str, Any]) -> Rule:
    values = dict(raw)
    if "xids" in values:
        values["xids"] = tuple(sorted(values["xids"]))
    for key in ("window", "no_execute_after"):
        if key in values:
            values[key] = float(values[key])
    return Rule(**values)


def _validation(raw: Mapping[str, Any]) -> Validation:
    values = dict(raw)
    if "command" in values:
        values["command"] = tuple(values["command"])
    if "labels" in values:
        values["labels"] = tuple(sorted(values["labels"].items()))
    if "timeout" in values:
        values["timeout"] = float(values["timeout"])
    return Validation(**values)


def render(policy: HealthPolicy) -> dict[str, Any]:
    """The section that :func:`parse` reads back as ``policy`` (the shipped example is this of the defaults)."""
    def rule(r: Rule) -> dict[str, Any]:
        out: dict[str, Any] = {"name": r.name, "signal": r.signal}
        if r.xids:
            out["xids"] = list(r.xids)
        if r.is_event:
            out |= {"count": r.count, "window": r.window}
        out["effect"] = r.effect
        if r.effect == "NoExecute":
            out["no_execute_after"] = r.no_execute_after
        return out

    v = policy.validation
    return {"enabled": policy.enabled, "dry_run": policy.dry_run, "interval": policy.interval, "step": policy.step,
            "hold": policy.hold, "hold_growth": policy.hold_growth, "hold_max": policy.hold_max,
            "repeat_window": policy.repeat_window, "never_xids": list(policy.never_xids),
            "rules": [rule(r) for r in policy.rules],
            "validation": {"image": v.image, "command": list(v.command), "namespace": v.namespace,
                           "timeout": v.timeout, "labels": dict(v.labels), "service_account": v.service_account},
            "eviction": {"api_first": policy.eviction.api_first}, "node_taint_effect": policy.node_taint_effect}
