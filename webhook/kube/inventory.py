"""What the cluster offers, as the balancer publishes it for the webhook (which has no API access). Pure.

The webhook reads it from a mounted file (``gpugate-inventory`` ConfigMap); missing or stale, it
is simply absent and every rule that uses it falls back to what the policy alone says.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Inventory:
    default_priority_class: str | None = None
    """The PriorityClass marked ``globalDefault``: the API server's Priority plugin writes its name
    into every pod that names none, before any webhook runs, so a pod carrying it did not choose it."""


EMPTY = Inventory()
