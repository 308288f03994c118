"""Typed records of the openb trace format (Alibaba cluster-trace-gpu-v2023), and a synthetic twin.

The trace cannot ship with the project, so ``synthetic`` makes a cluster and pod list of the same
shape from a seed: the command then runs on a fresh clone. Loading is all or nothing and every
error names the file and the row, because a half-read trace gives plausible but wrong numbers.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from webhook.errors import InputError
from webhook.replay.records import MILLI, NodeRecord, PodTimes, Trace, TracePod

NODE_FILE = "openb_node_list_gpu_node.csv"
DEFAULT_POD_FILE = "openb_pod_list_default.csv"
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMNS = ("creation_time", "deletion_time")


class TraceError(InputError):
    """A trace file is missing or one of its rows is not what the openb format says."""


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            missing = [column for column in required if column not in header]
            if missing:
                raise TraceError(f"{path}: header lacks column(s) {', '.join(missing)} "
                                 f"(has {', '.join(header) or 'nothing'})")
            return [(number, row) for number, row in enumerate(reader, start=2)]
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not a UTF-8 CSV file ({err})") from err
    except csv.Error as err:
        raise TraceError(f"{path}: not a CSV file ({err})") from err


def _int(path: Path, number: int, row: dict[str, str], column: str, *, low: int = 0, high: int | None = None) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{path}, row {number}, column {column}: expected an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise TraceError(f"{path}, row {number}, column {column}: expected an integer {bound}, got {value}")
    return value


def load_nodes(path: Path) -> tuple[NodeRecord, ...]:
    """Read an ``openb_node_list_*.csv`` file (columns sn, cpu_milli, memory_mib, gpu, model)."""
    nodes = []
    seen: set[str] = set()
    for number, row in _rows(path, NODE_COLUMNS):
        name = (row.get("sn") or "").strip()
        if not name:
            raise TraceError(f"{path}, row {number}, column sn: empty node name")
        if name in seen:
            raise TraceError(f"{path}, row {number}, column sn: node {name!r} appears twice")
        seen.add(name)
        gpus = _int(path, number, row, "gpu", high=64)
        model = (row.get("model") or "").strip()
        if gpus and not model:
            raise TraceError(f"{path}, row {number}, column model: node {name} has {gpus} GPU(s) but no model")
        nodes.append(NodeRecord(name=name, cpu_milli=_int(path, number, row, "cpu_milli", low=1),
                                memory_mib=_int(path, number, row, "memory_mib", low=1), gpus=gpus, model=model))
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return tuple(nodes)


def load_pods(path: Path) -> tuple[TracePod, ...]:
    """Read an ``openb_pod_list_*.csv`` file; ``gpu_spec`` and ``qos`` are optional (multigpu lists lack them)."""
    pods = []
    for number, row in _rows(path, POD_COLUMNS):
        name = (row.get("name") or "").strip()
        if not name:
            raise TraceError(f"{path}, row {number}, column name: empty pod name")
        num_gpu = _int(path, number, row, "num_gpu", high=64)
        gpu_milli = _int(path, number, row, "gpu_milli", high=MILLI)
        if num_gpu == 0 and gpu_milli:
            raise TraceError(f"{path}, row {number}, column gpu_milli: {gpu_milli} for a pod with num_gpu 0")
        if num_gpu and not gpu_milli:
            raise TraceError(f"{path}, row {number}, column gpu_milli: 0 for a pod with num_gpu {num_gpu}")
        if num_gpu > 1 and gpu_milli != MILLI:
            raise TraceError(f"{path}, row {number}, column gpu_milli: a {num_gpu}-GPU pod must take whole GPUs "
                             f"(1000), got {gpu_milli}")
        spec = tuple(part for part in (row.get("gpu_spec") or "").strip().split("|") if part)
        pods.append(TracePod(name=name, cpu_milli=_int(path, number, row, "cpu_milli"),
                              memory_mib=_int(path, number, row, "memory_mib"), num_gpu=num_gpu,
                              gpu_milli=gpu_milli, gpu_spec=spec, qos=(row.get("qos") or "").strip()))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return tuple(pods)


def load_times(path: Path) -> tuple[PodTimes, ...]:
    """Creation and deletion times (and ``pod_phase``) of an ``openb_pod_list_*.csv`` file, in row
    order; empty when the file has no time columns (the ``multigpu`` lists)."""
    rows = _rows(path, POD_COLUMNS)
    if not rows or any(column not in rows[0][1] for column in TIME_COLUMNS):
        return ()
    times = []
    for number, row in rows:
        created = _int(path, number, row, "creation_time")
        deleted = _int(path, number, row, "deletion_time")
        if deleted < created:
            raise TraceError(f"{path}, row {number}, column deletion_time: {deleted} is before the pod's "
                             f"creation_time {created}")
        times.append(PodTimes(created=created, deleted=deleted, phase=(row.get("pod_phase") or "").strip()))
    return tuple(times)


def load_trace(directory: Path, pods_file: str | Path | None = None) -> Trace:
    """Load ``openb_node_list_gpu_node.csv`` and a pod list (default ``openb_pod_list_default.csv``) from a folder."""
    if not directory.is_dir():
        raise TraceError(f"{directory}: no such trace folder")
    pod_path = Path(pods_file) if pods_file is not None else Path(DEFAULT_POD_FILE)
    if not pod_path.is_absolute() and not pod_path.exists():
        pod_path = directory / pod_path
    nodes = load_nodes(directory / NODE_FILE)
    pods = load_pods(pod_path)
    models = {node.model for node in nodes if node.gpus}
    for pod in pods:
        unknown = [spec for spec in pod.gpu_spec if spec not in models]
        if unknown and len(unknown) == len(pod.gpu_spec):
            raise TraceError(f"{pod_path}: pod {pod.name} asks for GPU model(s) {'|'.join(unknown)}, "
                             f"which no node has (models: {', '.join(sorted(models))})")
    return Trace(workload=pod_path.stem, nodes=nodes, pods=pods, times=load_times(pod_path))


# Shapes of the synthetic cluster: (model, gpus, cpu cores, memory GiB, share of nodes).
_SYNTHETIC_NODES = (("G2", 8, 96, 384, 0.45), ("T4", 2, 104, 512, 0.33), ("P100", 2, 64, 256, 0.11),
                    ("V100M16", 4, 32, 128, 0.05), ("V100M32", 8, 96, 768, 0.03), ("G3", 8, 128, 768, 0.03))
# Request shapes of the synthetic pods: (num_gpu, gpu_milli choices, cpu cores choices, share of pods).
_SYNTHETIC_PODS: tuple[tuple[int, tuple[int, ...], tuple[int, ...], float], ...] = (
    (0, (0,), (2, 4, 8, 16), 0.13), (1, (1000,), (4, 8, 12, 16), 0.50),
    (1, (810, 470, 320, 250, 100, 50), (2, 4, 6, 8), 0.35), (2, (1000,), (16, 24), 0.008),
    (4, (1000,), (32, 48), 0.006), (8, (1000,), (64, 88), 0.006))


def synthetic(seed: int, *, nodes: int = 120, load: float = 0.98) -> Trace:
    """A cluster and pod list shaped like the openb default list (GPU request ~98% of capacity)."""
    rng = random.Random(seed)
    node_list = []
    weights = [shape[4] for shape in _SYNTHETIC_NODES]
    for index in range(nodes):
        model, gpus, cores, gib, _ = rng.choices(_SYNTHETIC_NODES, weights=weights)[0]
        node_list.append(NodeRecord(name=f"synth-node-{index:04d}", cpu_milli=cores * MILLI,
                                    memory_mib=gib * 1024, gpus=gpus, model=model))
    capacity = sum(node.gpus for node in node_list) * MILLI
    pods: list[TracePod] = []
    requested = 0
    pod_weights = [shape[3] for shape in _SYNTHETIC_PODS]
    while True:
        num_gpu, millis, core_choices, _share = rng.choices(_SYNTHETIC_PODS, weights=pod_weights)[0]
        milli = rng.choice(millis)
        if requested + num_gpu * milli > load * capacity:
            break
        cpu = rng.choice(core_choices) * MILLI
        pods.append(TracePod(name=f"synth-pod-{len(pods):05d}", cpu_milli=cpu, memory_mib=cpu * 2,
                              num_gpu=num_gpu, gpu_milli=milli, qos=rng.choice(("LS", "BE"))))
        requested += num_gpu * milli
    return Trace(workload=f"synthetic-{seed}", nodes=tuple(node_list), pods=tuple(pods),
                 times=synthetic_times(len(pods), random.Random(seed + 1)))


SYNTHETIC_SPAN = 30 * 86_400
"""Seconds the synthetic pods are created over (the openb lists span about 35 busy days)."""


def synthetic_times(count: int, rng: random.Random) -> tuple[PodTimes, ...]:
    """Creation times spread over ``SYNTHETIC_SPAN`` and heavy-tailed durations (log-normal around
    15 minutes, as the openb lists' median pod lives), a few pods still running at the end."""
    created = sorted(rng.randrange(SYNTHETIC_SPAN) for _ in range(count))
    times = []
    for start in created:
        if rng.random() < 0.005:
            times.append(PodTimes(created=start, deleted=SYNTHETIC_SPAN, phase="Running"))
            continue
        life = max(1, int(rng.lognormvariate(6.8, 2.0)))
        times.append(PodTimes(created=start, deleted=min(SYNTHETIC_SPAN - 1, start + life), phase="Succeeded"))
    return tuple(times)
