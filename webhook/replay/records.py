"""Typed records of the openb trace format (Alibaba cluster-trace-gpu-v2023). Pure values.

``trace`` reads them from the CSV files (or makes a synthetic twin); everything else in the
replay takes them as data.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.kube import units

MILLI = units.MILLI
"""A GPU is counted in thousandths, as the trace's ``gpu_milli`` column does."""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One machine: capacity and the model of its (identical) GPUs; ``model`` is "" for CPU nodes."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    """One task: its requests; ``gpu_milli`` is per GPU (below 1000 only when sharing one GPU)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    qos: str = ""

    @property
    def gpu_request_milli(self) -> int:
        """The GPU request in thousandths of a GPU, as the published method counts arrivals."""
        return self.num_gpu * self.gpu_milli

    @property
    def shares_gpu(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI


@dataclass(frozen=True, slots=True)
class PodTimes:
    """When a trace pod was created and deleted (seconds), and its last phase: what ``--timeline``
    replays. Kept apart from ``TracePod``, whose value is the pod's requests alone (the replay
    caches its reading of equal requests)."""

    created: int
    deleted: int
    phase: str = ""


@dataclass(frozen=True, slots=True)
class Trace:
    """A cluster and one pod list; ``workload`` names the pod list (the CSV stem or "synthetic-SEED")."""

    workload: str
    nodes: tuple[NodeRecord, ...]
    pods: tuple[TracePod, ...]
    times: tuple[PodTimes, ...] = ()
    """Per pod (same order), when the list has ``creation_time`` and ``deletion_time`` columns;
    empty for the lists without (the ``multigpu`` ones)."""

    @property
    def gpu_capacity_milli(self) -> int:
        return sum(node.gpus for node in self.nodes) * MILLI
