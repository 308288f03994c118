"""The published arrival model: shuffle by seed, inflate by sampling with replacement, never delete.

Pods are sorted by name and shuffled with the seed, then pods drawn uniformly with replacement from
the original list are appended until the next one would push the GPU request past ``tune`` times
capacity (the artifact's ``tuneUpPods``; it compares the drawn pod's per-GPU milli, kept here). A
list already above the target is cut by removing random pods (``tuneDownPods``).
"""

from __future__ import annotations

import numpy as np

from webhook.replay.records import TracePod


def arrival_order(pods: tuple[TracePod, ...], capacity_milli: int, seed: int, *, tune: float = 1.3) -> list[int]:
    """Indices into ``pods`` in submission order (an index may repeat: sampled copies)."""
    rng = np.random.default_rng(seed)
    by_name = sorted(range(len(pods)), key=lambda index: pods[index].name)
    order = [by_name[i] for i in rng.permutation(len(pods))]
    requested = sum(pods[i].gpu_request_milli for i in order)
    target = tune * capacity_milli
    if requested > target:
        while requested > target and order:
            removed = order.pop(int(rng.integers(len(order))))
            requested -= pods[removed].gpu_request_milli
        return order
    while True:
        index = int(rng.integers(len(pods)))
        if requested + pods[index].gpu_milli > target:
            return order
        requested += pods[index].gpu_request_milli
        order.append(index)
