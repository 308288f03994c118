"""What the cluster offers, as the balancer publishes it for the webhook (which has no API access). Pure.

The balancer writes a ``GPUInventory`` document (JSON) into the ``gpugate-inventory`` ConfigMap; the
webhook reads it as a mounted file. Missing, unreadable or stale, it is simply absent (``EMPTY``) and
every rule that uses it falls back to what the policy alone says: an inventory can refine an
answer, never be the reason for a denial.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

API_VERSION = "gpugate.io/v1alpha1"
KIND = "GPUInventory"


class InventoryError(ValueError):
    """The document is not a GPUInventory this version understands."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Inventory:
    default_priority_class: str | None = None
    """The PriorityClass marked ``globalDefault``: the API server's Priority plugin writes its name
    into every pod that names none, before any webhook runs, so a pod carrying it did not choose it."""
    generated_at: datetime | None = None


EMPTY = Inventory()


def parse(data: bytes | str) -> Inventory:
    """A GPUInventory document; InventoryError naming the problem otherwise."""
    try:
        document: Any = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise InventoryError(f"not JSON: {err}") from err
    if not isinstance(document, dict):
        raise InventoryError("expected a JSON object")
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        raise InventoryError(f"expected apiVersion {API_VERSION} and kind {KIND}, got "
                             f"{document.get('apiVersion')!r} {document.get('kind')!r}")
    default = document.get("defaultPriorityClass")
    if default is not None and not isinstance(default, str):
        raise InventoryError("defaultPriorityClass: expected a string or null")
    generated = document.get("generatedAt")
    try:
        when = datetime.fromisoformat(generated.replace("Z", "+00:00")) if isinstance(generated, str) else None
    except ValueError as err:
        raise InventoryError(f"generatedAt: {err}") from err
    return Inventory(default_priority_class=default or None, generated_at=when)
