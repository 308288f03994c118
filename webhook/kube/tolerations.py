"""One toleration type: what a policy writes into a pod and what the scheduler model matches. Pure.

There used to be two (``policy.model.Toleration``, written into pods, and ``replay.model.Toleration``,
matched against taints); both are this one now, read from and written to the pod's JSON here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol


class TaintLike(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def effect(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Toleration:
    """``core/v1`` Toleration; ``None`` is a field the pod does not write."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    """Kubernetes' default when a pod writes none."""
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None

    def as_k8s(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.key is not None:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value is not None:
            out["value"] = self.value
        if self.effect is not None:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out

    def tolerates(self, taint: TaintLike) -> bool:
        """``k8s.io/api/core/v1`` ``Toleration.ToleratesTaint``: an empty key with Exists tolerates all."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or (self.value or "") == (taint.value or "")


def from_k8s(raw: Mapping[str, Any]) -> Toleration:
    """A pod's toleration as written (an unknown operator is read as Equal, which tolerates less)."""
    seconds = raw.get("tolerationSeconds")
    return Toleration(key=str(raw["key"]) if raw.get("key") else None,
                      operator="Exists" if raw.get("operator") == "Exists" else "Equal",
                      value=str(raw["value"]) if raw.get("value") is not None else None,
                      effect=str(raw["effect"]) if raw.get("effect") else None,
                      toleration_seconds=seconds if isinstance(seconds, int) and not isinstance(seconds, bool)
                      else None)


def of_pod_spec(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    found = spec.get("tolerations")
    return tuple(from_k8s(t) for t in found if isinstance(t, dict)) if isinstance(found, list) else ()
