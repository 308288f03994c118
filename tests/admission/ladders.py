"""The right-sizing ladder the admission tests write: an A100/H100 80GB's MIG slices, a share, a whole GPU."""

from __future__ import annotations

MIG_RUNGS = ("{mig: 1g.10gb}", "{mig: 2g.20gb}", "{mig: 3g.40gb}")
WHOLE_GPU = "{resource: nvidia.com/gpu, memory: 80Gi}"


def rightsizing(*middle: str, through: str | None = None, mig_strategy: str | None = None) -> str:
    """A ``rightsizing:`` block of a GPUPolicy spec (YAML, unindented): the three MIG rungs, the
    ``middle`` rungs (flow mappings, e.g. a ``nvidia.com/gpu.shared`` rung), then the whole GPU."""
    lines = ["rightsizing:"]
    if through is not None:
        lines.append(f"  through: {through}")
    if mig_strategy is not None:
        lines.append(f"  migStrategy: {mig_strategy}")
    lines.append("  ladder:")
    lines.extend(f"    - {rung}" for rung in (*MIG_RUNGS, *middle, WHOLE_GPU))
    return "\n".join(lines) + "\n"
