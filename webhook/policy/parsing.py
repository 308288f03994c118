"""Parse GPUPolicy documents into an immutable PolicySet: all or nothing. Pure: texts in, a set out.

One bad document refuses the whole set, so a server keeps serving its last good set and the
CLI lists every problem at once. Messages name the file, the document index and the field
path: ``policies/training.yaml, document 2, spec.gpu.max: 'eight' is not of type 'integer'``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal, cast

import jsonschema
import yaml

from webhook import durations, names
from webhook.errors import PolicyLoadError
from webhook.kube import units, yamlload
from webhook.kube.affinity import Requirement
from webhook.kube.quantity import QuantityError, bytes_
from webhook.policy import overlap
from webhook.policy.model import (
    ClaimRules,
    DenyRule,
    Disruption,
    GPUPolicy,
    GPUSpec,
    IdleRules,
    LabelSelector,
    Match,
    Placement,
    PolicySet,
    RightSizing,
    Rung,
    Toleration,
    Topology,
    revision_of,
)


def parse(texts: Iterable[tuple[str, bytes | str]]) -> PolicySet:
    """Parse named YAML texts; the revision covers names and bytes, so any edit changes it."""
    encoded = [(name, text.encode() if isinstance(text, str) else text) for name, text in texts]
    problems: list[str] = []
    documents: list[SourceDocument] = []
    for name, data in encoded:
        documents.extend(_parse_yaml(name, data, problems))
    policies = _build_all(documents, problems)
    if problems:
        raise PolicyLoadError(problems)
    return PolicySet(policies=policies, revision=revision_of(encoded))


def _schema() -> dict[str, Any]:
    # The package's own data, read once at import: not a user's file.
    text = resources.files("webhook.policy").joinpath("schema.json").read_text(encoding="utf-8")
    return json.loads(text)


_VALIDATOR = jsonschema.Draft202012Validator(_schema())


@dataclass(frozen=True, slots=True)
class SourceDocument:
    """One YAML document and where it came from."""

    source: str
    index: int
    body: object

    @property
    def where(self) -> str:
        return f"{self.source}, document {self.index}"


def _parse_yaml(name: str, data: bytes, problems: list[str]) -> list[SourceDocument]:
    try:
        bodies = list(yamlload.load_all(data))
    except yaml.YAMLError as err:
        problems.append(f"{name}{yamlload.describe_error(err)}")
        return []
    return [SourceDocument(name, i, body) for i, body in enumerate(bodies, start=1) if body is not None]


def _build_all(documents: list[SourceDocument], problems: list[str]) -> tuple[GPUPolicy, ...]:
    policies: list[GPUPolicy] = []
    seen: dict[str, str] = {}
    for document in documents:
        policy = _build(document, problems)
        if policy is None:
            continue
        if policy.name in seen:
            problems.append(f"{document.where}, metadata.name: duplicate policy name '{policy.name}' "
                            f"(first defined in {seen[policy.name]})")
            continue
        seen[policy.name] = document.where
        policies.append(policy)
    problems.extend(overlap.conflicts(policies))
    # Highest priority first; the name breaks ties only for a stable order (equal priorities never overlap).
    return tuple(sorted(policies, key=lambda p: (-p.priority, p.name)))


def _normalize_yaml11(body: dict[str, Any]) -> None:
    """YAML 1.1 reads bare ``off`` and ``no`` as false; the policy API means the words."""
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return
    if spec.get("mode") is False:
        spec["mode"] = "off"
    placement = spec.get("placement")
    if isinstance(placement, dict) and placement.get("avoidCongested") is False:
        placement["avoidCongested"] = "no"


def _field_path(path: Iterable[object]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def _build(document: SourceDocument, problems: list[str]) -> GPUPolicy | None:
    body = document.body
    if not isinstance(body, dict):
        problems.append(f"{document.where}: expected a GPUPolicy mapping, got {type(body).__name__}")
        return None
    if body.get("kind") != names.POLICY_KIND or body.get("apiVersion") != names.POLICY_API_VERSION:
        problems.append(f"{document.where}: expected apiVersion {names.POLICY_API_VERSION} and kind "
                        f"{names.POLICY_KIND}, got {body.get('apiVersion')!r} {body.get('kind')!r}")
        return None
    _normalize_yaml11(body)
    errors = sorted((_innermost(e) for e in _VALIDATOR.iter_errors(body)),
                    key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        for error in errors:
            problems.append(f"{document.where}, {_field_path(error.absolute_path)}: {_describe(error)}")
        return None
    spec = body.get("spec", {})
    quantity_problems = _rung_quantity_problems(spec) + _duration_problems(spec)
    if quantity_problems:
        problems.extend(f"{document.where}, {problem}" for problem in quantity_problems)
        return None
    policy = _from_spec(body["metadata"]["name"], document.where, spec)
    problems.extend(f"{document.where}, {problem}" for problem in _semantic_problems(policy))
    return policy


def _innermost(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For 'auto' | 'none' | [tolerations], a list that fails is reported at the failing toleration."""
    if error.validator == "oneOf" and isinstance(error.instance, list) and error.context:
        list_errors = [e for e in error.context if e.validator != "enum" and e.validator != "type"]
        if list_errors:
            return _innermost(jsonschema.exceptions.best_match(list_errors))
    return error


# What a pattern in the schema stands for, by the $defs entry (or property) that holds it.
_MEANING = {
    "resource": "an NVIDIA resource",
    "labelKey": "a label key (optional DNS prefix and '/', then up to 63 of A-Z a-z 0-9 - _ . "
                "starting and ending alphanumeric)",
    "labelValue": "a label value (up to 63 of A-Z a-z 0-9 - _ . starting and ending alphanumeric; "
                  "GPU products are written as the node label shows them, e.g. NVIDIA-H100-80GB-HBM3)",
    "name": "a valid name (lowercase letters, digits and '-', starting and ending alphanumeric)",
    "dnsSubdomain": "a Kubernetes object name (lowercase letters, digits, '-' and '.', starting and ending "
                    "alphanumeric)",
}


def _pattern_meanings() -> dict[str, str]:
    schema = _schema()
    holders = dict(schema["$defs"])
    holders["name"] = schema["properties"]["metadata"]["properties"]["name"]
    return {holder["pattern"]: _MEANING[key] for key, holder in holders.items() if key in _MEANING}


_PATTERN_MEANINGS = {**_pattern_meanings(),
                     durations.PATTERN: "a duration (whole numbers with a unit: 90s, 30m, 2h, 1h30m)"}


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        return f"unknown field(s): {error.message.split('(')[-1].rstrip(')')}"
    if error.validator == "pattern":
        meaning = _PATTERN_MEANINGS.get(str(error.schema.get("pattern")), "a valid value")
        if meaning == "an NVIDIA resource":
            return (f"unknown NVIDIA resource {error.instance!r}; expected nvidia.com/gpu, nvidia.com/gpu.shared "
                    f"or nvidia.com/mig-<g>g.<mem>gb")
        return f"{error.instance!r} is not {meaning}"
    if error.validator == "oneOf" and list(error.path)[-1:] == ["tolerations"]:
        return "expected 'auto', 'none' or a list of tolerations"
    if error.validator == "required" and "values" in error.message:
        return "operator In and NotIn need a non-empty 'values' list"
    if error.validator == "maxItems" and list(error.path)[-1:] == ["values"]:
        return "operator Exists and DoesNotExist take no 'values'"
    return error.message


def _rung_quantity_problems(spec: dict[str, Any]) -> list[str]:
    out = []
    for i, rung in enumerate((spec.get("rightsizing") or {}).get("ladder") or ()):
        if "memory" in rung:
            try:
                if bytes_(rung["memory"]) <= 0:
                    out.append(f"spec.rightsizing.ladder[{i}].memory: must be more than 0")
            except QuantityError as err:
                out.append(f"spec.rightsizing.ladder[{i}].memory: {err}")
    return out


def _duration_problems(spec: dict[str, Any]) -> list[str]:
    after = (spec.get("idle") or {}).get("after")
    try:
        if after is not None:
            durations.seconds(after)
    except durations.DurationError as err:
        return [f"spec.idle.after: {err}"]
    return []


def _semantic_problems(policy: GPUPolicy) -> list[str]:
    """Rules the schema cannot say, chiefly those the API server would enforce on every shaped pod."""
    problems = []
    gpu = policy.gpu
    if gpu.default is not None and gpu.max is not None and gpu.default > gpu.max:
        problems.append(f"spec.gpu.default: {gpu.default} is above spec.gpu.max {gpu.max}")
    if not isinstance(policy.tolerations, str):
        for i, toleration in enumerate(policy.tolerations):
            where = f"spec.tolerations[{i}]"
            if toleration.operator == "Exists" and toleration.value:
                problems.append(f"{where}: operator Exists takes no value (the API server refuses the pod)")
            if not toleration.key and toleration.operator != "Exists":
                problems.append(f"{where}: a toleration without a key needs operator Exists")
            if toleration.toleration_seconds is not None and toleration.effect != "NoExecute":
                problems.append(f"{where}: tolerationSeconds needs effect NoExecute")
    if policy.rightsizing is not None:
        seen: set[str] = set()
        for i, rung in enumerate(policy.rightsizing.ladder):
            key = rung.mig or rung.resource or ""
            if key in seen:
                problems.append(f"spec.rightsizing.ladder[{i}]: {key} is on the ladder twice")
            seen.add(key)
            if policy.rightsizing.through == "dra" and not rung.mig and not units.pooled(rung.resource):
                problems.append(f"spec.rightsizing.ladder[{i}]: {key} cannot be asked through DRA (through: dra "
                                f"takes MIG profiles, {names.SHARED_GPU_RESOURCE} as a consumable-capacity share "
                                f"and {names.GPU_RESOURCE})")
            if rung.mig and rung.compute > 1:
                problems.append(f"spec.rightsizing.ladder[{i}]: MIG profile {rung.mig} has more than "
                                f"{units.COMPUTE_SLICES_PER_GPU} compute slices; give compute explicitly")
    return problems


def _selector(raw: dict[str, Any] | None) -> LabelSelector:
    raw = raw or {}
    return LabelSelector(
        match_labels=tuple(sorted((raw.get("matchLabels") or {}).items())),
        match_expressions=tuple(
            Requirement(e["key"], e["operator"], tuple(e.get("values") or ()))
            for e in raw.get("matchExpressions") or ()
        ),
    )


def _int(value: Any) -> int | None:
    """JSON Schema's integer admits 8.0; the policy means 8."""
    return None if value is None else int(value)


Spelled = dict[str, tuple[str, Callable[[Any], Any]]]
"""A document's key -> (the model's field, how its value is read)."""


def _same(value: Any) -> Any:
    return value


def _given(raw: dict[str, Any], spelled: Spelled) -> dict[str, Any]:
    """The fields a document gives (an absent, null or empty-list value is not given), read: every
    field it leaves out takes the model's default, so ``model.py`` is the one home of the defaults."""
    return {field: read(raw[key]) for key, (field, read) in spelled.items() if raw.get(key) not in (None, [])}


_MATCH: Spelled = {"namespaces": ("namespaces", tuple), "excludeNamespaces": ("exclude_namespaces", tuple),
                   "podSelector": ("pod_selector", lambda v: _selector(v)), "gpuOnly": ("gpu_only", _same)}
_GPU: Spelled = {"resource": ("resource", _same), "default": ("default", int), "max": ("max", int),
                 "allowedResources": ("allowed_resources", tuple),
                 "failRequestsGreaterThanOne": ("fail_requests_greater_than_one", _same),
                 "products": ("products", tuple), "families": ("families", tuple),
                 "minMemoryMiB": ("min_memory_mib", int)}
_PLACEMENT: Spelled = {"strategy": ("strategy", _same), "avoidCongested": ("avoid_congested", _same),
                       "topology": ("topology", lambda v: Topology(**_given(v, _TOPOLOGY)))}
_TOPOLOGY: Spelled = {"key": ("key", _same), "mode": ("mode", _same)}
_DENY: Spelled = {"message": ("message", _same), "namespaces": ("namespaces", tuple),
                  "podSelector": ("pod_selector", lambda v: _selector(v))}
_IDLE: Spelled = {"action": ("action", _same), "threshold": ("threshold", float), "after": ("after", _same),
                  "exclude": ("exclude", lambda v: _selector(v))}
_DISRUPTION: Spelled = {"movable": ("movable", bool), "maxMovesPerHour": ("max_moves_per_hour", int),
                        "minRuntimeSeconds": ("min_runtime_seconds", int)}
_CLAIMS: Spelled = {"deviceClasses": ("device_classes", tuple), "maxPerClaim": ("max_per_claim", int),
                    "allowAllocationModeAll": ("allow_allocation_mode_all", bool),
                    "allowAdminAccess": ("allow_admin_access", bool)}
_SPEC: Spelled = {"priority": ("priority", int), "mode": ("mode", _same),
                  "match": ("match", lambda v: Match(**_given(v, _MATCH))),
                  "gpu": ("gpu", lambda v: GPUSpec(**_given(v, _GPU))),
                  "tolerations": ("tolerations", lambda v: _tolerations(v)),
                  "runtimeClassName": ("runtime_class_name", _same),
                  "priorityClassName": ("priority_class_name", _same), "schedulerName": ("scheduler_name", _same),
                  "placement": ("placement", lambda v: Placement(**_given(v, _PLACEMENT))),
                  "deny": ("deny", lambda v: tuple(DenyRule(**_given(d, _DENY)) for d in v)),
                  "rightsizing": ("rightsizing", lambda v: _rightsizing(v)),
                  "claims": ("claims", lambda v: ClaimRules(**_given(v, _CLAIMS))),
                  "idle": ("idle", lambda v: IdleRules(**_given(v, _IDLE))),
                  "disruption": ("disruption", lambda v: Disruption(**_given(v, _DISRUPTION)))}


def _from_spec(name: str, where: str, spec: dict[str, Any]) -> GPUPolicy:
    """The policy a spec gives (the schema vouched for each field's type and spelling)."""
    return GPUPolicy(name=name, source=where, **_given(spec, _SPEC))


def _tolerations(raw: str | list[dict[str, Any]]) -> Literal["auto", "none"] | tuple[Toleration, ...]:
    if isinstance(raw, str):
        return cast(Literal["auto", "none"], raw)
    return tuple(Toleration(key=t.get("key"), operator=t.get("operator", "Equal" if "value" in t else "Exists"),
                            value=t.get("value"), effect=t.get("effect"),
                            toleration_seconds=_int(t.get("tolerationSeconds")))
                 for t in raw)


def _rightsizing(raw: dict[str, Any] | None) -> RightSizing | None:
    """The ladder, with each rung's memory in bytes (the schema and _semantic_problems vouched for it)."""
    if raw is None:
        return None
    rungs = []
    for item in raw["ladder"]:
        if "mig" in item:
            unit = units.unit_of(units.mig_resource(item['mig']))
            assert unit is not None and unit.mig is not None  # the schema's pattern vouched for the name
            memory = bytes_(item["memory"]) if "memory" in item else units.mig_memory_bytes(unit.mig)
            rungs.append(Rung(name=item["mig"], mig=item["mig"], memory_bytes=memory,
                              compute=float(item.get("compute", unit.compute))))
        else:
            rungs.append(Rung(name=item["resource"], resource=item["resource"], memory_bytes=bytes_(item["memory"]),
                              compute=float(item.get("compute", 1.0))))
    return RightSizing(ladder=tuple(rungs), **_given(raw, _RIGHTSIZING))


_RIGHTSIZING: Spelled = {"migStrategy": ("mig_strategy", _same),
                         "maxInventoryAgeSeconds": ("max_inventory_age_seconds", int), "through": ("through", _same)}
