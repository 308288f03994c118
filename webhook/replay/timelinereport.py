"""What a ``--timeline`` replay leaves behind: the table, one CSV per run, summary.json and the plot.

summary.json is ``{"mode": "timeline", "workload", "seeds", "sharing", "load", "arms": {arm: {...}}}``
with, per arm, medians over seeds: ``window_hours``, ``allocation``, ``pending`` (GPU demand of the
waiting pods), ``offered`` and ``fragment`` (time averages, % of GPU capacity), ``wait_p50``,
``wait_p95``, ``wait_max`` (seconds, GPU pods), ``waiting_at_end``, ``moves``, ``lost_gpu_hours``,
``moves_per_hour_pct`` (of the running GPU pods) and ``runs``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from webhook.replay import report
from webhook.replay.timelineresult import TimelineResult

MEASURES: tuple[tuple[str, str, str], ...] = (
    ("allocation", "alloc%", "{:.2f}"), ("pending", "pending%", "{:.2f}"), ("offered", "offered%", "{:.2f}"),
    ("fragment", "frag%", "{:.2f}"), ("wait_p50", "wait p50 s", "{:.0f}"), ("wait_p95", "wait p95 s", "{:.0f}"),
    ("wait_max", "wait max s", "{:.0f}"), ("waiting_at_end", "waiting at end", "{:g}"), ("moves", "moves", "{:g}"),
    ("lost_gpu_hours", "lost GPU-h", "{:.1f}"), ("moves_per_hour_pct", "moves/h % of GPU pods", "{:.2f}"))


def measures(result: TimelineResult) -> dict[str, float]:
    """One run's figures, as the table and summary.json name them."""
    return {"window_hours": result.window / 3600.0, "allocation": result.means["allocation"],
            "pending": result.means["pending"], "offered": result.means["offered"],
            "fragment": result.means["fragment"], "wait_p50": result.wait(0.5), "wait_p95": result.wait(0.95),
            "wait_max": result.wait(1.0), "waiting_at_end": float(result.waiting_at_end),
            "moves": float(result.moves), "lost_gpu_hours": result.lost_gpu_hours,
            "moves_per_hour_pct": result.moves_per_hour_share}


def by_arm(results: list[TimelineResult]) -> dict[str, list[TimelineResult]]:
    grouped: dict[str, list[TimelineResult]] = {}
    for result in results:
        grouped.setdefault(result.arm, []).append(result)
    return grouped


def summary(results: list[TimelineResult], *, workload: str, seeds: list[int], sharing: str,
            load: float) -> dict[str, Any]:
    arms = {}
    for arm, runs in by_arm(results).items():
        found = [measures(r) for r in runs]
        arms[arm] = {name: round(statistics.median(m[name] for m in found), 3) for name in found[0]}
        arms[arm]["runs"] = len(runs)
    return {"mode": "timeline", "workload": workload, "seeds": list(seeds), "sharing": sharing, "load": load,
            "arms": arms}


def table(results: list[TimelineResult], *, workload: str, seeds: list[int], sharing: str, load: float) -> str:
    data = summary(results, workload=workload, seeds=seeds, sharing=sharing, load=load)["arms"]
    header = ("arm", *(label for _, label, _ in MEASURES), "runs", "s/run")
    rows = [header]
    grouped = by_arm(results)
    for arm, values in data.items():
        seconds = statistics.mean(r.seconds for r in grouped[arm])
        rows.append((arm, *(fmt.format(values[name]) for name, _, fmt in MEASURES), str(values["runs"]),
                     f"{seconds:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    window = statistics.median(r.window for r in results) / 3600.0
    lines = [f"workload {workload} in time, offered load {load:g} (window {window:.2f} h), seeds "
             f"{','.join(map(str, seeds)) if len(seeds) < 3 else f'{seeds[0]}-{seeds[-1]}'}, sharing world "
             f"{sharing}; medians over seeds; time averages in % of GPU capacity, waits of GPU pods in seconds"]
    for number, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
                               for i, cell in enumerate(row)))
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_run_csv(result: TimelineResult, directory: Path) -> Path:
    """The run's levels over time (hours), every GRID-th of its window."""
    rows = [(f"{at / 3600.0:.4f}", f"{alloc:.4f}", f"{pending:.4f}", f"{frag:.4f}")
            for at, alloc, pending, frag in zip(result.times, result.allocation, result.pending, result.fragment,
                                                strict=True)]
    return report.write_rows(directory, result.arm, result.seed,
                             ("hours", "allocation_pct", "pending_pct", "fragment_pct"), rows)


def median_series(runs: list[TimelineResult], level: str) -> tuple[list[float], list[float]]:
    """The level's median over seeds at each point of the grid, against the share of the window."""
    count = len(runs[0].times)
    values = [statistics.median(float(getattr(r, level)[i]) for r in runs) for i in range(count)]
    return [100.0 * i / max(1, count - 1) for i in range(count)], values


def plot(results: list[TimelineResult], path: Path, *, title: str) -> Path:
    """GPU allocation and pending GPU demand over the window, median over seeds, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (top, bottom) = pyplot.subplots(2, 1, figsize=(8.5, 6.5), dpi=110, sharex=True)
    for arm, runs in by_arm(results).items():
        xs, alloc = median_series(runs, "allocation")
        _, pending = median_series(runs, "pending")
        mean_pending = statistics.median(r.means["pending"] for r in runs)
        top.plot(xs, alloc, label=arm, linewidth=1.4)
        bottom.plot(xs, pending, label=f"{arm} (time average {mean_pending:.2f}%)", linewidth=1.4)
    top.set_ylabel("GPU allocation (% of capacity)")
    bottom.set_ylabel("pending GPU demand (% of capacity)")
    bottom.set_xlabel("time (% of the replay's window)")
    top.set_title(title)
    for axes in (top, bottom):
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7, loc="best")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    pyplot.close(figure)
    return path
