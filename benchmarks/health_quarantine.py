"""Time from a fatal XID on a GPU's DCGM page to the DeviceTaintRule that quarantines exactly that GPU.

The e2e control plane (Kubernetes v1.37.2 on 127.0.0.1), ``--nodes`` DRA nodes of 8 GPUs each
(tests/e2e/health_env.py: ResourceSlices publishing each GPU under the UUID its dcgm-exporter
series carries), a real Prometheus scraping the exporter page every ``--scrape``, and ``gpugate
balance`` as its shipped ServiceAccount with a health policy (``--interval``, ``--step``; the
shipped defaults are 5 s and 5 s). ``--injections`` XIDs, one GPU at a time on a GPU not yet
quarantined, ``--gap`` seconds plus a random share of a pass apart (so injections do not lock to
the loop's phase: each lands anywhere in a pass); for each, three moments:

- the exporter starts serving XID 79 for the GPU (the clock starts);
- Prometheus first answers the series (polled every 50 ms: the scrape's share);
- the DeviceTaintRule is first seen by a watch (the balancer's share: its pass, the step of its
  subquery, its write).

Percentiles are nearest-rank over the injections (with 20, p99 is the slowest). Figures move with
the machine's load: run it alone and say how loaded the machine was.

    python benchmarks/health_quarantine.py [--nodes 3] [--injections 20] [--scrape 1s] [--interval 5] [--step 5]
    python benchmarks/health_quarantine.py --nodes 1 --injections 2        # shortest
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e import dra_slices  # noqa: E402
from tests.e2e.balancer_access import rbac_applied  # noqa: E402
from tests.e2e.health_env import HealthRig, RuleWatch, config, health_rig  # noqa: E402
from tests.e2e.waiting import wait_until  # noqa: E402
from webhook.balancer.quarantineplan import rule_name  # noqa: E402
from webhook.kube.allocations import DeviceKey  # noqa: E402
from webhook.localcluster import binaries  # noqa: E402
from webhook.localcluster.cluster import Cluster, Nodes  # noqa: E402

GPUS_PER_NODE = 8


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(share * len(ordered)) - 1, 0)]


def summary(name: str, values: list[float]) -> str:
    return (f"{name:<28} p50 {percentile(values, 0.5):6.2f} s   p90 {percentile(values, 0.9):6.2f} s   "
            f"p99 {percentile(values, 0.99):6.2f} s   max {max(values):6.2f} s   (n={len(values)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3, help="DRA nodes of 8 GPUs")
    parser.add_argument("--injections", type=int, default=20, help="XIDs injected, each on a fresh GPU")
    parser.add_argument("--scrape", default="1s", help="Prometheus' scrape interval of the exporter")
    parser.add_argument("--interval", type=float, default=5.0, help="health.interval of the balancer (s)")
    parser.add_argument("--step", type=float, default=5.0, help="health.step of the balancer (s)")
    parser.add_argument("--gap", type=float, default=1.0,
                        help="seconds between two injections, plus a uniform draw in [0, --interval)")
    parser.add_argument("--seed", type=int, default=42, help="of the draws above")
    args = parser.parse_args()
    if args.injections > args.nodes * GPUS_PER_NODE:
        parser.error(f"--injections {args.injections} needs at least {math.ceil(args.injections / 8)} --nodes")
    found = binaries.paths()
    if found is None:
        raise SystemExit("the e2e control-plane binaries are not built: python -m tests.e2e.binaries build")
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="health-quarantine-")))
        print("starting the control plane ...", flush=True)
        cluster = Cluster.local(found)
        stack.callback(cluster.stop)
        nodes = Nodes(cluster)
        stack.enter_context(rbac_applied(cluster))
        rig = stack.enter_context(health_rig(cluster, work, scrape=args.scrape))
        stack.callback(nodes.remove_all)
        dra_slices.install_device_classes(cluster.api_client())
        hosts = [f"bench-{i}" for i in range(args.nodes)]
        for name in hosts:
            rig.dra_node(nodes, name, gpus=GPUS_PER_NODE)
        rig.start("bench", config(hold=3600, interval=args.interval, step=args.step, effect="NoSchedule"))
        wait_until(lambda: _leading(rig), what="the balancer holding the Lease", timeout=60, explain=rig.logs)
        time.sleep(max(args.interval, args.step) * 2)  # a pass or two over the quiet cluster first
        watch = RuleWatch(cluster)
        stack.callback(watch.stop)
        print(f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs, scrape {args.scrape}, health.interval {args.interval:g} s, "
              f"health.step {args.step:g} s, {args.injections} injections {args.gap:g} s apart", flush=True)
        to_prometheus, to_rule = [], []
        draws = random.Random(args.seed)
        for i in range(args.injections):
            node, gpu = hosts[i // GPUS_PER_NODE], i % GPUS_PER_NODE
            series = f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{node}",gpu="{gpu}",err_code="79"}}'
            name = rule_name(DeviceKey("gpu.nvidia.com", node, f"gpu-{gpu}"))
            start = rig.xid(node, gpu, 79)
            seen_series = None
            deadline = start + 60
            while name not in watch.seen and time.monotonic() < deadline:
                if seen_series is None and rig.prometheus.query(series):
                    seen_series = time.monotonic()
                time.sleep(0.05)
            if name not in watch.seen:
                raise SystemExit(f"no DeviceTaintRule {name} within 60 s:\n{rig.logs()}")
            to_rule.append(watch.seen[name] - start)
            to_prometheus.append((seen_series or watch.seen[name]) - start)
            print(f"  {node} gpu-{gpu}: in Prometheus after {to_prometheus[-1]:5.2f} s, "
                  f"DeviceTaintRule after {to_rule[-1]:5.2f} s", flush=True)
            time.sleep(args.gap + draws.uniform(0, args.interval))
        print(summary("XID page -> Prometheus", to_prometheus))
        print(summary("XID page -> DeviceTaintRule", to_rule))
        print(summary("Prometheus -> DeviceTaintRule", [r - p for r, p in zip(to_rule, to_prometheus, strict=True)]))
    return 0


def _leading(rig: HealthRig) -> bool:
    try:
        return bool(rig.leader())
    except Exception:
        return False


if __name__ == "__main__":
    sys.exit(main())
