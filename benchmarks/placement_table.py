"""docs/placement.md's table: every pod list of the openb trace, every arm, medians over seeds.

    python benchmarks/placement_table.py run [--lists default,cpu050,...] [--arms stock,...]
                                             [--seeds 42-44] [--tag NAME] [--workers 1]
    python benchmarks/placement_table.py table [--seeds 42-44] [--tags extender=extender-v2,...]
                                               [--arms stock,gpugate,extender,extender-mix,...]

``run`` replays each (list, arm, seed) not yet in OUT/results.jsonl (default
replay-out/table/, git-ignored) with ``webhook.replay.runner`` and appends one JSON line per run:
list, arm, tag, seed, allocation at 100% and 130% arrival, fragment at 100%, failed pods up to
100%, seconds. It resumes where it stopped. ``--tag`` names a variant of an arm (a different
policy folder or extender setting) so variants sit next to each other in the same file.
``table`` prints the markdown table of medians (allocation at 100% arrival) and the goal check;
``worlds`` the sharing worlds' table (``run --sharing timeslice|dra`` tags runs ``arm@world``):
GPU allocation, pods placed and overcommitted shares up to 100% arrival in timeslice, the
extender in dra against the fgd reference column, and the goals for each world.
The lists default to every ``openb_pod_list_*.csv`` in the trace folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.replay.placementgoals import dra_goals, fgd_figures, goals, timeslice_goal  # noqa: E402

TRACE = ROOT.parent / "shared" / "data" / "alibaba-gpu-v2023"
OUT = ROOT / "replay-out" / "table"
ARMS = ("stock", "gpugate", "extender", "bestfit", "fgd", "random")
"""The default ``--arms``; every arm and its world: ``webhook.replay.arms``."""
ORDER = ("default", "cpu050", "cpu100", "cpu200", "cpu250", "gpushare40", "gpushare60", "gpushare80",
         "gpushare100", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33", "multigpu20", "multigpu30",
         "multigpu40", "multigpu50")
"""The 17 evaluation lists first (default, cpu050-250, gpushare40-100, gpuspec10-33, multigpu20-50)."""


def seeds_of(text: str) -> list[int]:
    found: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        found.extend(range(int(low), int(high or low) + 1))
    return found


def all_lists(trace: Path) -> list[str]:
    present = sorted(p.stem.removeprefix("openb_pod_list_") for p in trace.glob("openb_pod_list_*.csv"))
    return [n for n in ORDER if n in present] + [n for n in present if n not in ORDER]


def done_keys(path: Path) -> set[tuple[str, str, int]]:
    if not path.exists():
        return set()
    keys = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            keys.add((row["list"], row["tag"], row["seed"]))
    return keys


def run(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from webhook.replay import runner, trace

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = done_keys(results)
    lists = args.lists.split(",") if args.lists else all_lists(Path(args.trace))
    arms = args.arms.split(",")
    seeds = seeds_of(args.seeds)
    extra = json.loads(args.spec) if args.spec else {}
    from webhook.replay import arms as arm_table

    sharing = extra.get("sharing", args.sharing)
    extra = {**extra, "sharing": sharing}

    def tag_of(arm: str) -> str:
        return args.tag or f"{arm}@{arm_table.world_of(arm, sharing)}"

    for name in lists:
        specs = []
        for arm in arms:
            for seed in seeds:
                if (name, tag_of(arm), seed) in done:
                    continue
                specs.append(runner.RunSpec(arm=arm, seed=seed,
                                            policies=args.policies if arm in arm_table.POLICY_ARMS else None, **extra))
        if not specs:
            continue
        loaded = trace.load_trace(Path(args.trace), f"openb_pod_list_{name}.csv")

        def record(result: runner.RunResult, name: str = name) -> None:
            row = {"list": name, "arm": result.arm, "tag": tag_of(result.arm), "world": result.world,
                   "seed": result.seed,
                   "alloc_100": round(result.alloc_at(100), 3), "alloc_130": round(result.alloc_at(130), 3),
                   "frag_100": round(result.frag_at(100), 3),
                   "failed_100": int((~result.placed[result.arrived <= 100.0]).sum()),
                   "placed": int(result.placed.sum()), "failed": result.failed,
                   "placed_100": int(result.placed[result.arrived <= 100.0].sum()),
                   "served_100": None if result.served is None else round(result.at(result.served, 100), 3),
                   "overcommitted": result.oversubscribed, "shares_placed": result.shares_placed,
                   "seconds": round(result.seconds, 1), "spec": extra, "policies": args.policies,
                   "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            with results.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            print(f"{name:12} {row['tag']:24} seed {result.seed}: {row['alloc_100']:.2f} ({row['seconds']}s)",
                  flush=True)

        runner.run_many(loaded, specs, workers=args.workers, progress=record)
    return 0


def rows_of(path: Path, seeds: list[int]) -> dict[tuple[str, str, int], dict]:
    """The last row per (list, tag, seed) among ``seeds`` (a run repeated counts once)."""
    found: dict[tuple[str, str, int], dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if row["seed"] in seeds:
                found[(row["list"], row["tag"], row["seed"])] = row
    return found


def medians(path: Path, seeds: list[int], field: str = "alloc_100") -> dict[tuple[str, str], tuple[float, int]]:
    values: dict[tuple[str, str], list[float]] = {}
    for (name, tag, _), row in rows_of(path, seeds).items():
        if row.get(field) is not None:
            values.setdefault((name, tag), []).append(row[field])
    return {key: (statistics.median(v), len(v)) for key, v in values.items()}


def table(args: argparse.Namespace) -> int:
    path = Path(args.out) / "results.jsonl"
    seeds = seeds_of(args.seeds)
    found = medians(path, seeds)
    columns = dict(pair.split("=", 1) for pair in args.tags.split(",")) if args.tags else {}
    arms = [a for a in args.arms.split(",")]
    tags = [columns.get(arm, arm) for arm in arms]
    lists = [n for n in all_lists(Path(args.trace)) if any((n, t) in found for t in tags)]
    print("| list | " + " | ".join(arms) + " | goals |")
    print("|---|" + "---:|" * len(arms) + "---|")
    for name in lists:
        cells = []
        for tag in tags:
            value = found.get((name, tag))
            cells.append("" if value is None else f"{value[0]:.2f}" + ("" if value[1] == len(seeds) else
                                                                        f" ({value[1]})"))
        got = {arm: found.get((name, tag), (None, 0))[0] for arm, tag in zip(arms, tags, strict=True)}
        print(f"| {name} | " + " | ".join(cells) + f" | {goals(name, got)} |")
    return 0


def _cell(value: float | None) -> str:
    """A table cell of two decimals, empty where nothing was run."""
    return "" if value is None else f"{value:.2f}"


def worlds_table(args: argparse.Namespace) -> int:
    """Both sharing worlds side by side, per list, and the goals for each world."""
    found = rows_of(Path(args.out) / "results.jsonl", seeds_of(args.seeds))
    fgd = fgd_figures()
    by: dict[tuple[str, str], list[dict]] = {}
    for (name, tag, _), row in found.items():
        by.setdefault((name, tag), []).append(row)

    def med(name: str, tag: str, field: str) -> float | None:
        values = [r[field] for r in by.get((name, tag), []) if r.get(field) is not None]
        return statistics.median(values) if values else None

    tags = ("stock@timeslice", "bestfit-slots@timeslice", "extender@timeslice")
    mixed_tag = "extender-mix@dra"
    with_mix = any(tag == mixed_tag for _, tag in by)
    print("| list | timeslice: stock | bestfit-slots | **extender** | pods placed (stock / bestfit-slots / "
          "extender, up to 100% arrival) | overcommitted shares (same arms, whole run; % of shares placed) "
          "| timeslice goal "
          "| dra: **extender** |" + (" dra: extender, configured mix |" if with_mix else "")
          + " fgd (published model) | dra goal |")
    print("|---|---:|---:|---:|---|---|---|---:|" + ("---:|" if with_mix else "") + "---:|---|")
    for name in [n for n in all_lists(Path(args.trace)) if any((n, t) in by for t in (*tags, "extender@dra"))]:
        alloc = [med(name, t, "alloc_100") for t in tags]
        placed = [med(name, t, "placed_100") for t in tags]
        over = [med(name, t, "overcommitted") for t in tags]
        shares = [med(name, t, "shares_placed") for t in tags]
        ts_goal = timeslice_goal(placed, over, shares)
        dra, ref = med(name, "extender@dra", "alloc_100"), fgd.get(name)
        mixed = med(name, mixed_tag, "alloc_100") if with_mix else None
        dra_goal = dra_goals(name, dra, ref, mixed)
        mixed_cell = f"{_cell(mixed)} | " if with_mix else ""
        cells = [_cell(v) for v in alloc]
        counts = [" / ".join("" if v is None else f"{v:g}" for v in placed),
                  " / ".join("" if o is None else f"{o:g}" + (f" ({100 * o / n:.1f}%)" if n else "")
                             for o, n in zip(over, shares, strict=True))]
        print(f"| {name} | " + " | ".join(cells) + f" | {counts[0]} | {counts[1]} | {ts_goal} | "
              f"{_cell(dra)} | {mixed_cell}{_cell(ref)} | {dra_goal} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "table", "worlds"))
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--lists", default="")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--seeds", default="42-44")
    parser.add_argument("--tag", default="", help="run: name this variant (default: the arm)")
    parser.add_argument("--tags", default="", help="table: arm=tag pairs, which variant fills an arm's column")
    parser.add_argument("--policies", default=str(ROOT / "policies"))
    parser.add_argument("--spec", default="", help='run: extra RunSpec fields as JSON, e.g. {"label_lag": 100}')
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--sharing", default="timeslice", choices=("timeslice", "dra"),
                        help="run: the sharing world of the kube arms (reference arms stay in the published model)")
    args = parser.parse_args()
    return {"run": run, "table": table, "worlds": worlds_table}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
