"""Seconds per replay run, per arm, and the fidelity medians over seeds 42..51.

    python benchmarks/replay_speed.py [--arms stock,...] [--sharing timeslice,dra] [--fidelity-seeds 42-51]
                                      [--no-fidelity]

Speed: one arm, one seed, the default pod list on the 1213-node cluster, in this process (one
core), in each sharing world asked (reference arms run once: their published model has no world).
Goal <= 10 s per run; the published artifact needed ~150 core-minutes per run.
Fidelity: Random, BestFit and FGD medians at 100% arrival against the published 86.25 / 92.91 /
95.23 (bound: 0.5 points), run in separate processes. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "alibaba-gpu-v2023"
PUBLISHED = {"random": (86.25, 87.38), "bestfit": (92.91, 93.11), "fgd": (95.23, 95.40)}
ARTIFACT_SECONDS = 150 * 60


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from webhook.commands.replay import parse_seeds
    from webhook.replay import runner, trace

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(runner.ARMS))
    parser.add_argument("--fidelity-seeds", default="42-51")
    parser.add_argument("--no-fidelity", action="store_true")
    parser.add_argument("--sharing", default="timeslice,dra", help="sharing worlds to time the kube arms in")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if not TRACE.is_dir():
        print(f"skipped: {TRACE} is absent (../shared beside the clone holds the trace)")
        return 0
    openb = trace.load_trace(TRACE)
    policies = str(ROOT / "policies")  # the starter set
    print(f"speed: one run = one arm, seed 42, {len(openb.pods)} pods inflated to 130%, "
          f"{len(openb.nodes)} nodes, one core")
    from webhook.replay import arms as arm_table

    print(f"{'arm':<16} {'world':<10} {'s/run':>7} {'vs 10 s goal':>13} {'vs artifact (150 core-min)':>27} "
          f"{'pods/s':>8}")
    for arm in args.arms.split(","):
        worlds = args.sharing.split(",") if not arm_table.BY_NAME[arm].world else [args.sharing.split(",")[0]]
        for sharing in worlds:
            spec = runner.RunSpec(arm=arm, seed=42, sharing=sharing, device_policy="packed",
                                  policies=policies if arm in arm_table.POLICY_ARMS else None)
            started = time.perf_counter()
            result = runner.run(openb, spec)
            seconds = time.perf_counter() - started
            print(f"{arm:<16} {result.world:<10} {seconds:7.2f} {seconds / 10:12.2f}x "
                  f"{ARTIFACT_SECONDS / seconds:25.0f}x faster {len(result.arrived) / seconds:8.0f}")
    if args.no_fidelity:
        return 0
    seeds = parse_seeds(args.fidelity_seeds)
    specs = [runner.RunSpec(arm=arm, seed=seed) for arm in PUBLISHED for seed in seeds]
    results = runner.run_many(openb, specs, workers=args.workers)
    print(f"\nfidelity: median over seeds {args.fidelity_seeds} at 100% / 130% arrived "
          f"(published; bound 0.5 points at 100%)")
    print(f"{'arm':<9} {'ours@100':>9} {'pub@100':>8} {'diff':>6} {'ours@130':>9} {'pub@130':>8} "
          f"{'seed range@100':>16}  within")
    for arm, (pub100, pub130) in PUBLISHED.items():
        mine = [r for r in results if r.arm == arm]
        at100 = [r.alloc_at(100) for r in mine]
        m100, m130 = statistics.median(at100), statistics.median(r.alloc_at(130) for r in mine)
        print(f"{arm:<9} {m100:9.2f} {pub100:8.2f} {m100 - pub100:+6.2f} {m130:9.2f} {pub130:8.2f} "
              f"{min(at100):7.2f}-{max(at100):<7.2f}  {'yes' if abs(m100 - pub100) <= 0.5 else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
