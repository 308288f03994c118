"""Two hours of a small cluster, recorded a scrape a minute: the accounting's test bed.

Four GPU nodes, one per way of sharing a GPU: eight whole H100s, eight in ``all-1g.10gb``, two
time-sliced four ways (``nvidia.com/gpu.shared``) and two under NVIDIA's DRA driver with
consumable shares. Pods of four teams hold whole GPUs, MIG slices, slots and DRA shares; in the
second hour the MIG inference pod is gone and a DRA batch Job has started. Every pod's devices
report a constant activity through dcgm-exporter's page (a pre-Volta-like GPU held by ``legacy``
is reported without its pod: its GPU-hours are unmeasured).

:func:`expected` integrates the same holdings (``usage.accounting``, which the balancer exports)
and activities in Python, step by step, independently of the recording rules: what promtool
must answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.dcgmexporter import Device, Pod, Reading, mig_gpu, render
from tests.usage.cluster import Obj, claim, dra_node, node, pod, slices, snapshot
from tests.usage.recording import BALANCER_TARGETS, DCGM_TARGET, Recording, balancer_page, scraped
from webhook.usage import accounting

STEPS = 121
"""Scrapes at 0, 1m, ..., 120m."""
SWITCH = 60
"""The step from which the second hour's pods are there instead of the first hour's."""
NODES = [node("n-whole", gpus=8, count=8), node("n-mig", mig={"1g.10gb": 56}, count=8),
         node("n-slots", shared=8, replicas=4, count=2), dra_node("n-dra")]
SLICES = slices("n-dra", 2, shares=True)
HALF = "40779Mi"

ALWAYS = [
    pod("train-6b7c-a1", "n-whole", {"nvidia.com/gpu": 4}, namespace="team-a", owner=("ReplicaSet", "train-6b7c"),
        template_hash="6b7c"),
    pod("notebook-0", "n-whole", {"nvidia.com/gpu": 1}, namespace="team-a", owner=("StatefulSet", "notebook")),
    pod("legacy", "n-whole", {"nvidia.com/gpu": 1}, namespace="team-e"),
    pod("dev-1", "n-slots", {"nvidia.com/gpu.shared": 1}, namespace="team-c"),
    pod("dev-2", "n-slots", {"nvidia.com/gpu.shared": 1}, namespace="team-c"),
    pod("llm-5f-b2", "n-dra", namespace="team-d", owner=("ReplicaSet", "llm-5f"), template_hash="5f",
        claims=["llm-gpu"]),
]
FIRST_HOUR = [pod("infer-77-c3", "n-mig", {"nvidia.com/mig-1g.10gb": 7}, namespace="team-b",
                  owner=("ReplicaSet", "infer-77"), template_hash="77")]
SECOND_HOUR = [pod("batch-1-d4", "n-dra", namespace="team-d", owner=("Job", "batch-1"), claims=["batch-gpu"])]
CLAIMS_ALWAYS = [claim("llm-gpu", "n-dra", ["gpu-0"], pods=["llm-5f-b2"], namespace="team-d", memory=HALF)]
CLAIMS_SECOND = [claim("batch-gpu", "n-dra", ["gpu-1"], pods=["batch-1-d4"], namespace="team-d", memory="81559Mi")]
ACTIVITY = {"train-6b7c-a1": 0.8, "notebook-0": 0.01, "infer-77-c3": 0.5, "dev-1": 0.6, "dev-2": 0.6,
            "llm-5f-b2": 0.4, "batch-1-d4": 0.9}
"""Per pod, what its devices report (both slots of n-slots' GPU 0 see the GPU's 0.6)."""


def _device(host: str, gpu: int, name: str = "", namespace: str = "") -> Device:
    return Device(host=host, gpu=gpu, pod=Pod(name=name, namespace=namespace) if name else None)


def readings(second_hour: bool) -> list[Reading]:
    """dcgm-exporter's devices: each pod's attributed to it, the others idle and unattributed."""
    out = [Reading(device=_device("n-whole", g, "train-6b7c-a1", "team-a"), active=0.8) for g in range(4)]
    out += [Reading(device=_device("n-whole", 4, "notebook-0", "team-a"), active=0.01),
            Reading(device=_device("n-whole", 5), active=0.7),  # legacy's GPU, not attributed to it
            *[Reading(device=_device("n-whole", g), active=0.0) for g in (6, 7)]]
    if second_hour:
        out += mig_gpu("n-mig", 0, "1g.10gb", [0.0] * 7)
    else:
        out += mig_gpu("n-mig", 0, "1g.10gb", [0.5] * 7, pod=Pod(name="infer-77-c3", namespace="team-b"))
    out += [r for g in range(1, 8) for r in mig_gpu("n-mig", g, "1g.10gb", [0.0] * 7)]
    out += [Reading(device=_device("n-slots", 0, p, "team-c"), active=0.6) for p in ("dev-1", "dev-2")]
    out += [Reading(device=_device("n-slots", 1), active=0.0),
            Reading(device=_device("n-dra", 0, "llm-5f-b2", "team-d"), active=0.4),
            Reading(device=_device("n-dra", 1, *(("batch-1-d4", "team-d") if second_hour else ())),
                    active=0.9 if second_hour else 0.0)]
    return out


def objects(second_hour: bool) -> tuple[list[Obj], list[Obj]]:
    """(pods, claims) of the hour."""
    if second_hour:
        return ALWAYS + SECOND_HOUR, CLAIMS_ALWAYS + CLAIMS_SECOND
    return ALWAYS + FIRST_HOUR, CLAIMS_ALWAYS


def record() -> Recording:
    """The two hours as promtool input: dcgm-exporter's page and both balancer replicas' pages."""
    recording = Recording()
    pages = {}
    for second in (False, True):
        pods, claims = objects(second)
        balancer = balancer_page(NODES, pods, SLICES, claims)
        pages[second] = [scraped(render(readings(second)), DCGM_TARGET),
                         *(scraped(balancer, target) for target in BALANCER_TARGETS)]
    for step in range(STEPS):
        recording.add(*pages[step >= SWITCH])
    return recording


@dataclass(frozen=True)
class Expected:
    """GPU-hours over the window ending at the last step, per (namespace, owner kind, owner, unit kind)."""

    allocated: dict[tuple[str, str, str, str], float]
    used: dict[tuple[str, str, str, str], float]
    idle: dict[tuple[str, str, str, str], float]
    unallocated: float
    physical: float


def snapshots() -> dict[bool, accounting.Snapshot]:
    return {second: snapshot(NODES, objects(second)[0], SLICES, objects(second)[1]) for second in (False, True)}


def expected(steps: range) -> Expected:
    """Integrate the holdings at each step in ``steps`` (a step is a minute: GPUs / 60 GPU-hours)."""
    allocated: dict[tuple[str, str, str, str], float] = {}
    used: dict[tuple[str, str, str, str], float] = {}
    idle: dict[tuple[str, str, str, str], float] = {}
    unallocated = physical = 0.0
    snaps = snapshots()
    for step in steps:
        snap = snaps[step >= SWITCH]
        for h in snap.holdings:
            key = (h.namespace, h.owner.kind, h.owner.name, h.kind)
            allocated[key] = allocated.get(key, 0.0) + h.gpus / 60
            if h.pod in ACTIVITY:
                used[key] = used.get(key, 0.0) + h.gpus * ACTIVITY[h.pod] / 60
                idle[key] = idle.get(key, 0.0) + h.gpus * (1 - ACTIVITY[h.pod]) / 60
        unallocated += sum(snap.unallocated().values()) / 60
        physical += sum(g for _, g in snap.physical) / 60
    return Expected(allocated, used, idle, unallocated, physical)
