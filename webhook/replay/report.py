"""What a replay leaves behind: the table, one CSV per run, OUT/summary.json and the plot.

summary.json is shaped ``{"mode": "published", "workload", "seeds", "sharing", "arms": {arm: {"world", "alloc_at_100",
"alloc_at_130", "frag_at_100", "runs", ...}}}``: medians over seeds, in percent of GPU capacity,
rounded to 2 places. ``sharing`` is the run's sharing world (``--sharing``); each arm's ``world`` is
the world it ran in (``published`` for the reference arms, ``mig-twin`` for the right-sizing arms).
Arms in a sharing world add ``served_at_100`` (the trace's GPU ask of the pods placed),
``placed``, ``failed`` (whole run), ``failed_at_100`` and ``overcommitted`` (timeslice: placed
shares whose trace ask is larger than a slot).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from webhook.replay import arms as arm_table
from webhook.replay.runspec import MIG_TWIN, PUBLISHED, RANDOM_TIES, RunResult

POINTS = range(0, 131)


def _median(values: list[float]) -> float | None:
    clean = [v for v in values if not math.isnan(v)]
    return round(statistics.median(clean), 2) if clean else None


def by_arm(results: list[RunResult]) -> dict[str, list[RunResult]]:
    grouped: dict[str, list[RunResult]] = {}
    for result in results:
        grouped.setdefault(result.arm, []).append(result)
    return grouped


def summary(results: list[RunResult], *, workload: str, seeds: list[int], sharing: str = "",
            ties: str = RANDOM_TIES) -> dict[str, Any]:
    arms = {}
    for arm, runs in by_arm(results).items():
        arms[arm] = {"world": runs[0].world,
                     "alloc_at_100": _median([r.alloc_at(100) for r in runs]),
                     "alloc_at_130": _median([r.alloc_at(130) for r in runs]),
                     "frag_at_100": _median([r.frag_at(100) for r in runs]),
                     "runs": len(runs)}
        if runs[0].world not in (PUBLISHED, MIG_TWIN, ""):
            arms[arm].update(world_counts(runs))
    for row in sizing_rows(results):
        arms[row["arm"]].update({k: v for k, v in row.items() if k not in ("arm", "alloc_at_100", "runs")})
    return {"mode": "published", "workload": workload, "seeds": list(seeds), "sharing": sharing, "ties": ties,
            "arms": arms}


def world_counts(runs: list[RunResult]) -> dict[str, Any]:
    """What matters in a sharing world, medians over seeds: the trace's ask of the placed pods,
    pods placed and failed (whole run, and failed up to 100% arrival), overcommitted shares."""
    return {"served_at_100": _median([r.at(r.served, 100) for r in runs if r.served is not None]),
            "placed": statistics.median([int(r.placed.sum()) for r in runs]),
            "failed": statistics.median([r.failed for r in runs]),
            "failed_at_100": statistics.median([int((~r.placed[r.arrived <= 100.0]).sum()) for r in runs]),
            "overcommitted": statistics.median([r.oversubscribed for r in runs])}


def table(results: list[RunResult], *, workload: str, seeds: list[int], sharing: str = "",
          ties: str = RANDOM_TIES) -> str:
    """Arm by metric, medians over seeds, with the world each arm ran in; failed pods are those
    that arrived up to 100%; placed and overcommitted over the whole run (n/a outside a sharing world)."""
    data = summary(results, workload=workload, seeds=seeds, sharing=sharing)["arms"]
    grouped = by_arm(results)
    header = ("arm", "world", "alloc@100%", "alloc@130%", "served@100%", "frag@100%", "failed@100%", "placed",
              "overcommitted", "runs", "s/run")
    rows = [header]
    for arm, values in data.items():
        runs = grouped[arm]
        failed = statistics.median([int((~r.placed[r.arrived <= 100.0]).sum()) for r in runs])
        seconds = statistics.mean([r.seconds for r in runs])
        in_world = "overcommitted" in values
        rows.append((arm, values["world"] or "-", _fmt(values["alloc_at_100"]), _fmt(values["alloc_at_130"]),
                     _fmt(values.get("served_at_100")), _fmt(values["frag_at_100"]), f"{failed:g}",
                     f"{statistics.median([int(r.placed.sum()) for r in runs]):g}",
                     f"{values['overcommitted']:g}" if in_world else "n/a", str(values["runs"]), f"{seconds:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    several = len(seeds) > 1
    world = f"sharing world {sharing} (reference arms: their published model); " if sharing else ""
    if ties != RANDOM_TIES:
        world += f"kube-scheduler ties: {ties} (v1.37.2 without an extender); "
    lines = [f"workload {workload}, {'seeds' if several else 'seed'} {_seed_text(seeds)}; {world}"
             f"{'medians over seeds, ' if several else ''}% of GPU capacity"]
    for number, row in enumerate(rows):
        cells = (cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i]) for i, cell in enumerate(row))
        lines.append("  ".join(cells))
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def sizing_rows(results: list[RunResult]) -> list[dict[str, Any]]:
    """Per right-sizing arm, medians over seeds: allocation and served GPU request at 100% arrival,
    pods failed up to 100% and placed over the whole run, shares placed beyond their slot, and
    per GPU resource the fractional pods got, placed/failed (over the whole run)."""
    rows = []
    for arm, runs in by_arm(results).items():
        if runs[0].served is None or runs[0].world != MIG_TWIN:
            continue
        rungs: dict[str, tuple[list[int], list[int]]] = {}
        for run in runs:
            for resource, placed, failed in run.rungs:
                got = rungs.setdefault(resource, ([], []))
                got[0].append(placed)
                got[1].append(failed)
        rows.append({"arm": arm, "alloc_at_100": _median([r.alloc_at(100) for r in runs]),
                     "served_at_100": _median([r.at(r.served, 100) for r in runs if r.served is not None]),
                     "failed_at_100": statistics.median([int((~r.placed[r.arrived <= 100.0]).sum()) for r in runs]),
                     "placed": statistics.median([int(r.placed.sum()) for r in runs]),
                     "arrived": statistics.median([len(r.placed) for r in runs]),
                     "denied": statistics.median([r.denied for r in runs]),
                     "oversubscribed": statistics.median([r.oversubscribed for r in runs]),
                     "rungs": {resource: (statistics.median(p), statistics.median(f))
                               for resource, (p, f) in sorted(rungs.items())},
                     "runs": len(runs)})
    return rows


def sizing_table(results: list[RunResult]) -> str:
    """The right-sizing arms side by side (empty when none ran)."""
    rows = sizing_rows(results)
    if not rows:
        return ""
    header = ("arm", "alloc@100%", "served@100%", "failed@100%", "placed", "beyond slot", "fractional pods: "
              "resource placed/failed")
    cells: list[tuple[str, ...]] = [header]
    for found in rows:
        rungs = ", ".join(f"{r.removeprefix('nvidia.com/')} {p:g}/{f:g}" for r, (p, f) in found["rungs"].items())
        cells.append((found["arm"], _fmt(found["alloc_at_100"]), _fmt(found["served_at_100"]),
                      f"{found['failed_at_100']:g}", f"{found['placed']:g} of {found['arrived']:g}",
                      f"{found['oversubscribed']:g}", rungs))
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["right-sizing arms (medians): alloc = physical GPU capacity taken, served = the trace's GPU "
             "request of the placed pods, both % of GPUs at 100% arrival; placed over the whole run"]
    for number, row in enumerate(cells):
        lines.append("  ".join(c.ljust(widths[i]) if i in (0, len(header) - 1) else c.rjust(widths[i])
                               for i, c in enumerate(row)).rstrip())
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _seed_text(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(str(s) for s in seeds)


def write_rows(directory: Path, arm: str, seed: int, header: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> Path:
    """One run's CSV, ``ARM-seedN.csv`` in ``directory``: the name ``curves_from_csv`` and the
    benchmarks read back, for the replay and the replay in time alike."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{arm}-seed{seed}.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_run_csv(result: RunResult, directory: Path) -> Path:
    """The run's curve by arrived percent (the published binning), plus failures so far."""
    rows = [(point, f"{result.alloc_at(point):.4f}", f"{result.frag_at(point):.4f}",
             int((~result.placed[result.arrived <= point + 0.5]).sum()))
            for point in POINTS if not math.isnan(result.alloc_at(point))]
    return write_rows(directory, result.arm, result.seed, ("arrived_pct", "alloc_pct", "frag_pct", "failed_pods"), rows)


def write_summary(data: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def median_curve(runs: list[RunResult]) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for point in POINTS:
        value = _median([r.alloc_at(point) for r in runs])
        if value is not None:
            xs.append(point)
            ys.append(value)
    return xs, ys


def plot(results: list[RunResult], path: Path, *, title: str) -> Path:
    """Allocation against arrived GPU request, median over seeds, one line per arm."""
    curves = {}
    for arm, runs in by_arm(results).items():
        curves[f"{arm} ({_fmt(_median([r.alloc_at(100) for r in runs]))}% at 100%)"] = median_curve(runs)
    return plot_curves(curves, path, title=title)


def curves_from_csv(directory: Path, *, label: str = "{arm}") -> dict[str, tuple[list[int], list[float]]]:
    """Median curves per arm from a replay's ``runs/*.csv`` (to draw several replays in one plot)."""
    per_arm: dict[str, dict[int, list[float]]] = {}
    for path in sorted((directory / "runs").glob("*-seed*.csv")):
        arm = path.stem.rsplit("-seed", 1)[0]
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                per_arm.setdefault(arm, {}).setdefault(int(row["arrived_pct"]), []).append(float(row["alloc_pct"]))
    curves = {}
    for arm, points in per_arm.items():
        xs = sorted(points)
        ys = [statistics.median(points[x]) for x in xs]
        at100 = points.get(100)
        name = label.format(arm=arm) + (f" ({statistics.median(at100):.2f}% at 100%)" if at100 else "")
        curves[name] = (xs, ys)
    return curves


def plot_curves(curves: dict[str, tuple[list[int], list[float]]], path: Path, *, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(8.5, 5.5), dpi=110)
    for name, (xs, ys) in curves.items():
        row = arm_table.BY_NAME.get(name.split(" ")[0])
        reference = row is not None and row.kind == "reference"
        axes.plot(xs, ys, label=name, linestyle="--" if reference else "-", linewidth=1.2 if reference else 1.6)
    axes.plot([0, 130], [0, 130], color="grey", linewidth=0.6, label="every arrived GPU allocated")
    axes.set_xlim(60, 130)
    axes.set_ylim(60, 100)
    axes.set_xlabel("arrived GPU request (% of capacity)")
    axes.set_ylabel("GPU allocation (% of capacity), median over seeds")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right", fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    pyplot.close(figure)
    return path


class Progress:
    """A one-line progress bar on stderr: runs done, the last run, time so far."""

    def __init__(self, total: int, stream: TextIO, *, width: int = 30) -> None:
        self.total, self.stream, self.width, self.done = total, stream, width, 0

    def __call__(self, result: RunResult) -> None:
        self.done += 1
        filled = self.width * self.done // max(self.total, 1)
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} runs "
                          f"(last: {result.arm} seed {result.seed}, {result.seconds:.1f}s)")
        if self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()
