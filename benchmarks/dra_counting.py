"""What one ResourceClaim event costs the balancer's DRA counting: per pool (as it runs) vs a recount.

``webhook.placement.dracount.DraCache`` recomputes only the pools a claim names. The alternative it
replaced in design, recounting every node's devices from all slices on each event
(``kube.nodedevices.by_node``), is timed on the same events, in the same run, side by side.

Cluster: ``--nodes`` nodes of 8 GPUs as NVIDIA's DRA driver publishes them (tests/e2e/dra_slices.py),
every fourth node's GPUs MIG-capable (partitionable: counter sets and 14 partitions per GPU).
Events: claims allocated and released, each on one node, one to four GPUs.

    python benchmarks/dra_counting.py [--nodes 1000] [--events 2000]
    python benchmarks/dra_counting.py --quick      # what the test suite runs: a few nodes and events
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e import dra_slices  # noqa: E402
from webhook.kube import allocations, nodedevices, slices  # noqa: E402
from webhook.placement import dracount  # noqa: E402


def cluster(nodes: int) -> dict[str, slices.Slice]:
    out = {}
    for n in range(nodes):
        node = f"gpu-{n:05d}"
        for i, body in enumerate(dra_slices.node_slices(node, dra_slices.gpus(8, node=node, mig=n % 4 == 0))):
            out[f"{node}-{i}"] = slices.parse(body)
    return out


def events(nodes: int, count: int, rng: random.Random) -> list[tuple[str, allocations.Claim | None]]:
    """Allocate then release claims: ``count`` events, half allocations, half releases."""
    out: list[tuple[str, allocations.Claim | None]] = []
    live: list[str] = []
    for i in range(count):
        if live and (len(live) > 50 or rng.random() < 0.5):
            out.append((live.pop(rng.randrange(len(live))), None))
            continue
        node = f"gpu-{rng.randrange(nodes):05d}"
        gpus = rng.sample(range(8), rng.randint(1, 4))
        key = f"ml/c{i}"
        out.append((key, allocations.Claim(
            namespace="ml", name=f"c{i}", allocated=True,
            results=tuple(allocations.Allocated(request="gpus", key=allocations.DeviceKey("gpu.nvidia.com", node,
                                                                                         f"gpu-{g}"))
                          for g in gpus),
            reserved_for=(allocations.Consumer(resource="pods", name=f"p{i}", uid=str(i)),))))
        live.append(key)
    return out


def incremental(found: dict[str, slices.Slice], stream: list[tuple[str, allocations.Claim | None]]) -> float:
    cache = dracount.DraCache()
    cache.replace_slices(found)
    started = time.perf_counter()
    for key, claim in stream:
        cache.set_claim(key, claim)
    return time.perf_counter() - started


def recount(found: dict[str, slices.Slice], stream: list[tuple[str, allocations.Claim | None]]) -> float:
    live: dict[str, allocations.Claim] = {}
    values = list(found.values())
    started = time.perf_counter()
    for key, claim in stream:
        if claim is None:
            live.pop(key, None)
        else:
            live[key] = claim
        nodedevices.by_node(values, nodedevices.held_keys(live.values()))
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--recount-events", type=int, default=50,
                        help="events for the recount (it is slow; per-event figures are compared)")
    parser.add_argument("--quick", action="store_true", help="20 nodes, 200 events: the test suite's run")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.events, args.recount_events = 20, 200, 20
    found = cluster(args.nodes)
    devices = sum(len(s.devices) for s in found.values())
    stream = events(args.nodes, args.events, random.Random(42))
    fast = incremental(found, stream)
    slow = recount(found, stream[:args.recount_events])
    per_fast = fast / len(stream) * 1e6
    per_slow = slow / max(args.recount_events, 1) * 1e6
    print(f"cluster: {args.nodes} nodes, {len(found)} slices, {devices} devices")
    print(f"{'':24}{'per event (us)':>16}{'events/s':>12}")
    print(f"{'per pool (DraCache)':24}{per_fast:16.1f}{1e6 / per_fast:12.0f}")
    print(f"{'recount from scratch':24}{per_slow:16.1f}{1e6 / per_slow:12.1f}")
    print(f"ratio: {per_slow / per_fast:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
