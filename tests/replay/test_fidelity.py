"""Fidelity: the reimplemented Random, BestFit and FGD against the published medians (ATC'23 artifact).

Published at 100% arrived GPU request on openb_pod_list_default.csv, median of seeds 42..51:
Random 86.25%, BestFit 92.91%, FGD 95.23% allocation; fragment 13.6%, 7.0%, 4.7% of capacity.
The benchmark uses all ten seeds with the 0.5-point bound; this test uses three seeds (42-44), so
its stated tolerance is wider: 1.0 point (the published seed spread at 100% is up to 0.9 points).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from webhook.replay import runner, trace

PUBLISHED_ALLOC = {"random": 86.25, "bestfit": 92.91, "fgd": 95.23}
PUBLISHED_FRAG = {"random": 13.6, "bestfit": 7.0, "fgd": 4.7}
SEEDS = (42, 43, 44)
TOLERANCE = 1.0


@pytest.fixture(scope="module")
def results(shared_dir: Path) -> dict[str, list[runner.RunResult]]:
    openb = trace.load_trace(shared_dir / "data" / "alibaba-gpu-v2023")
    specs = [runner.RunSpec(arm=arm, seed=seed) for arm in PUBLISHED_ALLOC for seed in SEEDS]
    grouped: dict[str, list[runner.RunResult]] = {}
    for result in runner.run_many(openb, specs, workers=2):
        grouped.setdefault(result.arm, []).append(result)
    return grouped


@pytest.mark.slow
@pytest.mark.parametrize("arm", PUBLISHED_ALLOC)
def test_median_allocation_at_full_arrival_matches_the_published_result(arm: str, results) -> None:
    median = statistics.median(r.alloc_at(100) for r in results[arm])
    assert abs(median - PUBLISHED_ALLOC[arm]) <= TOLERANCE, f"{arm}: {median:.2f}% vs published {PUBLISHED_ALLOC[arm]}%"


@pytest.mark.slow
@pytest.mark.parametrize("arm", PUBLISHED_FRAG)
def test_median_fragment_at_full_arrival_matches_the_published_result(arm: str, results) -> None:
    median = statistics.median(r.frag_at(100) for r in results[arm])
    assert abs(median - PUBLISHED_FRAG[arm]) <= TOLERANCE, f"{arm}: {median:.2f}% vs published {PUBLISHED_FRAG[arm]}%"


@pytest.mark.slow
def test_the_order_of_the_published_schedulers_holds(results) -> None:
    medians = {arm: statistics.median(r.alloc_at(100) for r in runs) for arm, runs in results.items()}
    assert medians["random"] < medians["bestfit"] < medians["fgd"]
