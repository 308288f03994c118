"""The replay model against the real kube-scheduler on one slice of the openb trace: do its figures hold?

    python benchmarks/replay_vs_scheduler.py [--nodes 32] [--pods 250] [--seed 42] [--model-seeds 10]
                                             [--pod-files all|NAME,...] [--arms gpugate,stock] [--repeats 1]
                                             [--sharing timeslice|dra] [--ties]

Starts a local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler
v1.36.3 from tests/e2e's cached binaries; builds them when missing), the real webhook with the
starter policies/ and the real balancer, and sends the slice's pods one at a time through it;
then runs `gpugate replay`'s model on the same nodes and pods in the same order
(tests/e2e/trace_slice.py says how the two are kept comparable). Prints, per arm: both GPU
allocations, their difference, how many pods landed on the same node and on the same node class,
and how often the real choice is one the model would make from the same state (lockstep); with
several pod lists, lockstep per list.
``--pod-files all`` takes an equal share of pods from every pod list of the trace (what
tests/e2e/test_replay_fidelity.py runs: ``--pods 288 --pod-files all``). ``--sharing`` runs the
slice *with* its shares in one sharing world instead, stock arm (the test's second part:
``--pods 240 --pod-files all --model-seeds 20 --sharing dra``). ``--ties`` runs kube-scheduler at
``--v=10`` and prints how each scheduler's ties fell (tests/e2e/scheduler_ties.py: in v1.36.3,
without an extender, not at random): the session's kube-scheduler (16 filter threads) places the
arms' slice, the world slices have their own with one thread (trace_slice.FIDELITY_SCHEDULER).
Asserts nothing; the test holds the bounds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from tests.e2e.scheduler_ties import tie_report
    from tests.e2e.trace_slice import (
        ARMS,
        FIDELITY_SCHEDULER,
        TRACE,
        SliceSpec,
        every_pod_file,
        fidelity,
        world_fidelity,
    )
    from webhook.localcluster.cluster import Cluster, ensure_binaries
    from webhook.localcluster.controlplane import Settings
    from webhook.replay.runspec import SHARING

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=SliceSpec.nodes)
    parser.add_argument("--pods", type=int, default=SliceSpec.pods)
    parser.add_argument("--seed", type=int, default=SliceSpec.seed)
    parser.add_argument("--model-seeds", type=int, default=SliceSpec.model_seeds)
    parser.add_argument("--pod-files", default=",".join(SliceSpec.pod_files),
                        help="pod lists to draw from, comma-separated, or 'all' (default: the default list)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--repeats", type=int, default=1, help="real runs per arm (the model runs --model-seeds)")
    parser.add_argument("--disagreements", type=int, default=5, help="examples of lockstep disagreements to print")
    parser.add_argument("--sharing", choices=SHARING, help="the slice with its shares, in this sharing world")
    parser.add_argument("--ties", action="store_true", help="log kube-scheduler's scores and say how its ties fell")
    args = parser.parse_args()
    if not TRACE.is_dir():
        print(f"skipped: {TRACE} is absent (../shared beside the clone holds the trace)")
        return 0
    pod_files = every_pod_file() if args.pod_files == "all" else tuple(args.pod_files.split(","))
    spec = SliceSpec(nodes=args.nodes, pods=args.pods, seed=args.seed, pod_files=pod_files,
                     model_seeds=args.model_seeds, sharing=args.sharing)
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {message}", flush=True)

    settings = Settings(scheduler_args=("--v=10",) if args.ties else ())
    with tempfile.TemporaryDirectory(prefix="gpugate-fidelity-") as scratch, \
            Cluster.local(ensure_binaries(log), settings=settings) as cluster:
        log("control plane up")
        if args.sharing:
            print(world_fidelity(cluster, spec, repeats=args.repeats, log=log).text(examples=args.disagreements))
        else:
            print(fidelity(cluster, Path(scratch), spec, arms=args.arms.split(","), repeats=args.repeats,
                           log=log).text(examples=args.disagreements))
        if args.ties:
            assert cluster.plane is not None
            for name in ("kube-scheduler", FIDELITY_SCHEDULER):
                path = cluster.plane.logs / f"{name}.log"
                if path.is_file():
                    with path.open(errors="replace") as scheduler_log:
                        print(f"{name}: {tie_report(scheduler_log).text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
