"""docs/rebalance.md's table: every pod list of the openb trace in time, with and without the rebalancer.

    python benchmarks/rebalance_table.py run [--lists default,...] [--arms stock,extender,extender+rebalancer]
                                             [--seeds 42-51] [--load 0.95] [--workers 2]
    python benchmarks/rebalance_table.py table [--seeds 42-51] [--load 0.95]
    python benchmarks/rebalance_table.py plot [--seeds 42-51] [--load 0.95] [--to docs/rebalance.png]
    python benchmarks/rebalance_table.py all [the options of run and plot]

``all`` is the docs' one command: ``run`` (only what is not recorded yet), then ``table`` and ``plot``.

``run`` replays each (list, arm, seed) not yet in OUT/results.jsonl (default replay-out/rebalance/,
git-ignored) with ``gpugate replay --timeline``'s code (``webhook.replay.timeline``) and appends one
JSON line per run: its measures (``timelinereport.measures``), its seconds, and its levels over time
(allocation and pending GPU demand, the plot's). It resumes where it stopped. ``table`` prints the
markdown table of medians over seeds with the goals: pending GPU demand at least 20% lower with the
rebalancer than the extender alone, p95 wait lower, allocation not lower, moves per hour at most 2%
of the running GPU pods. ``plot`` draws pending GPU demand per list and arm, and the default list
over time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "alibaba-gpu-v2023"
OUT = ROOT / "replay-out" / "rebalance"
ARMS = ("stock", "extender", "extender+rebalancer")
ORDER = ("default", "cpu050", "cpu100", "cpu200", "cpu250", "gpushare40", "gpushare60", "gpushare80",
         "gpushare100", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33", "multigpu20", "multigpu30",
         "multigpu40", "multigpu50")
"""The 17 lists of the published evaluation."""
LOAD = 0.95
COLUMNS = (("pending", "pending GPU demand %"), ("wait_p95", "p95 wait s"), ("allocation", "allocation %"),
           ("moves_per_hour_pct", "moves/h, % of GPU pods"))


def seeds_of(text: str) -> list[int]:
    """``42-51`` or ``42,45``: the replay command's reading of ``--seeds``."""
    sys.path.insert(0, str(ROOT))
    from webhook.commands.replay import parse_seeds

    return parse_seeds(text)


def done_keys(path: Path, load: float) -> set[tuple[str, str, int]]:
    return {(row["list"], row["arm"], row["seed"]) for row in rows(path) if row["load"] == load}


def rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from webhook.replay import timeline, timelinereport, trace
    from webhook.replay.runspec import RunSpec

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = done_keys(results, args.load)
    default = None  # the default list, read once something is left to run
    for name in args.lists.split(",") if args.lists else ORDER:
        specs = [timeline.TimelineSpec(run=RunSpec(arm=arm, seed=seed, device_policy="packed"), load=args.load)
                 for seed in seeds_of(args.seeds) for arm in args.arms.split(",") if (name, arm, seed) not in done]
        if not specs:
            continue
        default = default or trace.load_trace(Path(args.trace))
        loaded = trace.load_trace(Path(args.trace), f"openb_pod_list_{name}.csv")

        def record(result: Any, name: str = name) -> None:
            row = {"list": name, "arm": result.arm, "seed": result.seed, "load": args.load,
                   **{k: round(v, 4) for k, v in timelinereport.measures(result).items()},
                   "seconds": round(result.seconds, 1), "refused": result.refused,
                   "allocation_series": [round(float(v), 3) for v in result.allocation],
                   "pending_series": [round(float(v), 3) for v in result.pending],
                   "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            with results.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            print(f"{name:12} {result.arm:20} seed {result.seed}: pending {row['pending']:.2f} "
                  f"alloc {row['allocation']:.2f} moves {row['moves']:g} ({row['seconds']}s)", flush=True)

        timeline.run_many(loaded, specs, default=default, workers=args.workers, progress=record)
    return 0


def medians(path: Path, seeds: list[int], load: float) -> dict[tuple[str, str], dict[str, float]]:
    """Per (list, arm): the median over ``seeds`` of each measure, and how many runs."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    last = {(r["list"], r["arm"], r["seed"]): r for r in rows(path) if r["load"] == load and r["seed"] in seeds}
    for (name, arm, _), row in last.items():
        found.setdefault((name, arm), []).append(row)
    return {key: {**{field: statistics.median(r[field] for r in runs) for field, _ in COLUMNS},
                  "moves": statistics.median(r["moves"] for r in runs), "runs": len(runs),
                  "seconds": statistics.mean(r["seconds"] for r in runs)}
            for key, runs in found.items()}


def goals(ext: dict[str, float], reb: dict[str, float]) -> list[str]:
    """The misses of the rebalancer's goals against the extender alone (empty: all met)."""
    misses = []
    if ext["pending"] > 0 and reb["pending"] > 0.8 * ext["pending"]:
        misses.append(f"pending {100 * (reb['pending'] / ext['pending'] - 1):+.0f}%")
    if ext["pending"] == 0:
        misses.append("nothing waits with the extender")
    if reb["wait_p95"] >= ext["wait_p95"] and ext["wait_p95"] > 0:
        misses.append("p95 wait not lower")
    if reb["allocation"] < ext["allocation"]:
        misses.append(f"allocation {reb['allocation'] - ext['allocation']:+.2f}")
    if reb["moves_per_hour_pct"] > 2.0:
        misses.append(f"{reb['moves_per_hour_pct']:.2f}%/h moved")
    return misses


def table(args: argparse.Namespace) -> int:
    seeds = seeds_of(args.seeds)
    found = medians(Path(args.out) / "results.jsonl", seeds, args.load)
    header = ["list"]
    for field, label in COLUMNS:
        header += [f"{label}: {arm}" for arm in ARMS if field != "moves_per_hour_pct" or arm == ARMS[-1]]
    print("| " + " | ".join(header + ["goals"]) + " |")
    print("|---|" + "---:|" * (len(header) - 1) + "---|")
    met = 0
    for name in ORDER:
        if not all((name, arm) in found for arm in ARMS):
            continue
        cells = [name]
        for field, _ in COLUMNS:
            for arm in ARMS:
                if field == "moves_per_hour_pct" and arm != ARMS[-1]:
                    continue
                value = found[(name, arm)]
                runs = "" if value["runs"] == len(seeds) else f" ({value['runs']})"
                cells.append(f"{value[field]:.{0 if field == 'wait_p95' else 2}f}{runs}")
        misses = goals(found[(name, "extender")], found[(name, ARMS[-1])])
        met += not misses
        print("| " + " | ".join(cells + [", ".join(misses) or "met"]) + " |")
    print(f"\ngoals met on {met} lists; seconds per run (mean): " + ", ".join(
        f"{arm} {statistics.mean(v['seconds'] for (n, a), v in found.items() if a == arm):.0f}" for arm in ARMS
        if any(a == arm for _, a in found)))
    return 0


def plot(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    seeds = seeds_of(args.seeds)
    path = Path(args.out) / "results.jsonl"
    found = medians(path, seeds, args.load)
    lists = [n for n in ORDER if all((n, arm) in found for arm in ARMS)]
    figure, (bars, curve) = pyplot.subplots(2, 1, figsize=(10, 8), dpi=110)
    width = 0.27
    for offset, arm in enumerate(ARMS):
        xs = [i + (offset - 1) * width for i in range(len(lists))]
        bars.bar(xs, [found[(n, arm)]["pending"] for n in lists], width, label=arm)
    bars.set_xticks(range(len(lists)), lists, rotation=45, ha="right", fontsize=8)
    bars.set_ylabel("pending GPU demand, % of capacity\n(time average, median of seeds)")
    bars.set_title(f"The 17 openb lists in time, offered load {args.load:g}, seeds {args.seeds}")
    bars.legend(fontsize=8)
    runs = [r for r in rows(path) if r["list"] == "default" and r["load"] == args.load and r["seed"] in seeds]
    for arm in ARMS:
        series = [r["pending_series"] for r in runs if r["arm"] == arm]
        if series:
            points = [statistics.median(values) for values in zip(*series, strict=True)]
            curve.plot([100 * i / (len(points) - 1) for i in range(len(points))], points, label=arm)
    curve.set_xlabel("time, % of the replay's window (default list)")
    curve.set_ylabel("pending GPU demand, % of capacity\n(median of seeds)")
    curve.legend(fontsize=8)
    for axes in (bars, curve):
        axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(args.to)
    print(f"wrote {args.to}")
    return 0


def everything(args: argparse.Namespace) -> int:
    """What is not recorded yet, then the table and the plot of all that is."""
    return run(args) or table(args) or plot(args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "table", "plot", "all"):
        command = sub.add_parser(name)
        command.add_argument("--seeds", default="42-51")
        command.add_argument("--load", type=float, default=LOAD)
        command.add_argument("--out", default=str(OUT))
        command.add_argument("--trace", default=str(TRACE))
        if name in ("run", "all"):
            command.add_argument("--lists", default="")
            command.add_argument("--arms", default=",".join(ARMS))
            command.add_argument("--workers", type=int, default=2)
        if name in ("plot", "all"):
            command.add_argument("--to", default=str(ROOT / "docs" / "rebalance.png"))
    args = parser.parse_args()
    return {"run": run, "table": table, "plot": plot, "all": everything}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
