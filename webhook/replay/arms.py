"""Every replay arm in one table: its name, which model it runs in, and what it runs (pure data).

The CLI (``gpugate replay --arms``), ``benchmarks/placement_table.py`` and docs/placement.md read
this table; ``runner.run`` dispatches on ``Arm.kind`` and every run module reads what the arm does
from its row (its fields and ``Sizing``), never from its name. Adding an arm that combines what the
runs already do is one row here (and its test); a new behaviour is a field here plus its code in
the module its kind names.

Kinds:
  kube       the kube-scheduler model (``replay.kubescheduler``) in the run's sharing world
             (``--sharing timeslice|dra``), run by ``replay.runner``
  reference  a published scheduler (``replay.reference``) in the FGD artifact's own model, whatever
             the sharing world; ``bestfit-slots`` is the exception, BestFit in the timeslice world
  sizing     the right-sizing arms on the trace's MIG-capable twin (``replay.sizing``)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["kube", "reference", "sizing"]
BINPACK_PROFILE = "gpugate-binpack"
"""The kube-scheduler model's second profile (MostAllocated, GPU weight 5: ``kubescheduler.binpack_profile``)."""


@dataclass(frozen=True, slots=True)
class Sizing:
    """What a right-sizing arm changes on the trace's H100 twin (``replay.migcluster``)."""

    partitioned: Literal["none", "time-sliced", "mig"]
    """What the nodes ``--mig-mix`` picks become: nothing (every GPU stays whole), time-sliced
    slots (``nvidia.com/gpu.shared``), or the MIG layouts the mix names."""
    fractional_ask: Literal["gpu", "shared", "memory"]
    """What a pod that asks part of a GPU writes: a whole ``nvidia.com/gpu``, one time-sliced slot,
    or only its memory (``gpugate.io/gpu-memory``) for the policy to right-size."""


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    kind: Kind
    summary: str
    policies: bool = False
    """Admits pods through the ``--policies`` folder."""
    extender: bool = False
    """Runs gpugate's scheduler extender (the ``gpugate`` profile)."""
    default: bool = False
    """In ``gpugate replay``'s default ``--arms``."""
    reference: str = ""
    """For a reference arm, the published scheduler it runs (``replay.reference``)."""
    world: str = ""
    """A fixed world for arms that ignore ``--sharing`` (reference: ``published``; sizing: ``mig-twin``);
    empty: the run's sharing world."""
    rebalancer: bool = False
    """Runs the balancer's rebalancer, which evicts movable pods: only in time (``--timeline``)."""
    profile: str = ""
    """The scheduler profile every pod of the arm names (``schedulerName``); empty: its own
    (the extender arms route to the extender's profile as ``extender`` says)."""
    sizing: Sizing | None = None
    """For a right-sizing arm, what it changes on the twin."""
    timeline_default: bool = False
    """In ``gpugate replay --timeline``'s default ``--arms``."""


ARMS: tuple[Arm, ...] = (
    Arm("stock", "kube", "the trace's pods as written, kube-scheduler's default profile", default=True,
        timeline_default=True),
    Arm("gpugate", "kube", "the pods admitted through gpugate's policies; each to the profile its "
        "schedulerName names", policies=True, default=True),
    Arm("binpack-profile", "kube", "the pods on gpugate's second profile (MostAllocated, GPU weight 5)",
        default=True, profile=BINPACK_PROFILE),
    Arm("extender", "kube", "the pods on the gpugate profile: default plugins plus gpugate's extender",
        extender=True, default=True, timeline_default=True),
    Arm("extender+rebalancer", "kube", "the extender arm with the balancer's rebalancer moving the trace's BE pods "
        "(--timeline only)", extender=True, rebalancer=True, timeline_default=True),
    Arm("gpugate-extender", "kube", "the gpugate arm, where a policy's schedulerName gpugate reaches the "
        "extender's profile", policies=True, extender=True),
    Arm("random", "reference", "Random, on the trace rows (published model)", default=True,
        reference="random", world="published"),
    Arm("bestfit", "reference", "BestFit, on the trace rows (published model)", default=True,
        reference="bestfit", world="published"),
    Arm("fgd", "reference", "FGD, on the trace rows (published model)", default=True,
        reference="fgd", world="published"),
    Arm("bestfit-slots", "reference", "BestFit in the timeslice world: shares are slots on time-sliced nodes",
        reference="bestfit", world="timeslice"),
    Arm("whole-gpu", "sizing", "fractional pods ask a whole GPU on the H100 twin", policies=True, world="mig-twin",
        sizing=Sizing(partitioned="none", fractional_ask="gpu")),
    Arm("shares-only", "sizing", "fractional pods ask a time-sliced slot on the H100 twin", policies=True,
        world="mig-twin", sizing=Sizing(partitioned="time-sliced", fractional_ask="shared")),
    Arm("rightsized", "sizing", "fractional pods ask memory that right-sizing turns into a rung on the H100 twin",
        policies=True, world="mig-twin", sizing=Sizing(partitioned="mig", fractional_ask="memory")),
)

BY_NAME = {arm.name: arm for arm in ARMS}
NAMES = tuple(arm.name for arm in ARMS)
DEFAULT = tuple(arm.name for arm in ARMS if arm.default)
POLICY_ARMS = tuple(arm.name for arm in ARMS if arm.policies)
EXTENDER_ARMS = tuple(arm.name for arm in ARMS if arm.extender)
REFERENCE_ARMS = tuple(arm.name for arm in ARMS if arm.kind == "reference")
SIZING_ARMS = tuple(arm.name for arm in ARMS if arm.kind == "sizing")
TIMELINE_ONLY = tuple(arm.name for arm in ARMS if arm.rebalancer)
TIMELINE_DEFAULT = tuple(arm.name for arm in ARMS if arm.timeline_default)
KUBE_ARMS = tuple(arm.name for arm in ARMS if arm.kind == "kube")


def world_of(arm: str, sharing: str) -> str:
    """The world a run of ``arm`` is in when the replay runs ``--sharing sharing``."""
    return BY_NAME[arm].world or sharing


def markdown_table() -> str:
    """The table as docs/placement.md shows it (a test keeps the page equal to this)."""
    rows = ["| arm | kind | world | policies | extender | default | what it is |", "|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        world = arm.world or "`--sharing`"
        flags = ["yes" if flag else "" for flag in (arm.policies, arm.extender, arm.default)]
        rows.append(f"| `{arm.name}` | {arm.kind} | {world} | " + " | ".join(flags) + f" | {arm.summary} |")
    return "\n".join(rows)
