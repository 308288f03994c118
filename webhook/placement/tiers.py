"""The load tier of a GPU node, from its allocation and measured utilization (pure).

Allocation is exact (the scheduler's own accounting), so it is compared with plain thresholds.
Utilization is a noisy average, so a node leaves a tier only when utilization falls below the
tier's boundary by the hysteresis margin: a node hovering at 0.6 keeps one label instead of
flapping between ``idle`` and ``busy`` every poll (each flip re-weighs every pending pod).
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.names import LOAD_TIERS

IDLE, BUSY, CONGESTED = LOAD_TIERS
_RANK = {tier: rank for rank, tier in enumerate(LOAD_TIERS)}


class ThresholdError(ValueError):
    """Thresholds that cannot describe three ordered tiers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TierThresholds:
    """Where a node stops being idle and starts being congested."""

    busy_allocated: float = 0.5
    """Share of the node's NVIDIA device slots requested by running pods from which it is ``busy``:
    half the GPUs taken means a new multi-GPU job is better placed elsewhere."""
    congested_allocated: float = 1.0
    """Share from which it is ``congested``; 1.0 means no slot is free (nothing more fits)."""
    busy_utilization: float = 0.6
    """Mean GPU engine activity (0..1) from which a node is ``busy``."""
    congested_utilization: float = 0.9
    """Mean GPU engine activity from which a node is ``congested``: its GPUs are saturated, so a
    pod sharing them (time-slicing, MPS) or its host (PCIe, NVLink, CPU) would be slowed down."""
    hysteresis: float = 0.1
    """Leave a tier only when utilization is this far below its boundary, so labels do not flap."""

    def __post_init__(self) -> None:
        for name in ("busy_allocated", "congested_allocated", "busy_utilization", "congested_utilization"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ThresholdError(f"tiers.{name} must be in (0, 1], got {value}")
        if self.busy_allocated > self.congested_allocated:
            raise ThresholdError("tiers.busy_allocated must not exceed tiers.congested_allocated")
        if self.busy_utilization > self.congested_utilization:
            raise ThresholdError("tiers.busy_utilization must not exceed tiers.congested_utilization")
        if not 0.0 <= self.hysteresis < 0.5:
            raise ThresholdError(f"tiers.hysteresis must be in [0, 0.5), got {self.hysteresis}")


def _plain(value: float, busy: float, congested: float) -> str:
    if value >= congested:
        return CONGESTED
    if value >= busy:
        return BUSY
    return IDLE


def allocation_tier(allocated: float, thresholds: TierThresholds) -> str:
    """Tier from the requested share of the node's NVIDIA slots (0..1), without hysteresis."""
    return _plain(allocated, thresholds.busy_allocated, thresholds.congested_allocated)


def utilization_tier(utilization: float, previous: str | None, thresholds: TierThresholds) -> str:
    """Tier from utilization (0..1) with hysteresis, like a Schmitt trigger.

    A node enters a higher tier as soon as it reaches the boundary (load is reported without
    delay), but leaves a tier only once utilization is below that tier's boundary by the
    margin. Entering late instead would make ``congested`` unreachable at a 0.9 boundary plus a
    0.1 margin.
    """
    busy, congested, margin = thresholds.busy_utilization, thresholds.congested_utilization, thresholds.hysteresis
    plain = _plain(utilization, busy, congested)
    if previous not in _RANK or _RANK[plain] >= _RANK[previous]:
        return plain
    lowered = _plain(utilization, busy - margin, congested - margin)
    return lowered if _RANK[lowered] < _RANK[previous] else previous


def tier(*, allocated: float, utilization: float | None, previous: str | None,
         thresholds: TierThresholds) -> str:
    """The node's tier: the worse of its allocation tier and its utilization tier.

    ``utilization`` None (no Prometheus, or no sample for this node) means allocation only.
    ``previous`` is the tier the node is labelled with now; it only matters for utilization.
    """
    by_allocation = allocation_tier(allocated, thresholds)
    if utilization is None:
        return by_allocation
    by_utilization = utilization_tier(utilization, previous, thresholds)
    return max(by_allocation, by_utilization, key=_RANK.__getitem__)
