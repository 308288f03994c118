"""benchmarks/placement_table.py's goal check: each of issue 16's goals, for both extender columns."""

from __future__ import annotations

from benchmarks.placement_table import fgd_figures, goals, timeslice_goal, world_dra_goal

REFS = {"stock": 90.0, "stock-packed": 91.0, "bestfit": 92.0, "fgd": 95.0}


def test_every_goal_met_reads_met() -> None:
    assert goals("default", {**REFS, "extender-packed": 95.2, "extender-mix": 95.3, "gpugate": 93.0}) == "met"


def test_each_miss_is_named_and_the_configured_mix_apart() -> None:
    got = {**REFS, "extender-packed": 95.19, "extender-mix": 94.4, "gpugate": 89.0,
           "gpugate-packed": 90.9}
    assert goals("default", got) == ("< 95.2, < 95.2 (configured mix), fgd -0.60 (configured mix), "
                                     "gpugate -1.00 vs stock, gpugate-packed -0.10 vs stock-packed")
    assert goals("cpu300", {**REFS, "extender": 90.5}) == "< bestfit, fgd -4.50, < stock"
    assert goals("cpu300", {"stock": 90.0, "extender": 99.0}) == "incomplete"


def test_the_sharing_worlds_goals() -> None:
    assert timeslice_goal([100, 90, 101], [50, 40, 39]) == "met"
    assert timeslice_goal([100, 90, 95], [50, 40, 45]) == "places -5 pods, not fewer overcommitted"
    assert timeslice_goal([100, None, 95], [50, 40, 45]) == "incomplete"
    # With the shares placed, "fewer" is per share placed: 45 of 300 is fewer than 50 of 250.
    assert timeslice_goal([100, 90, 101], [50, 40, 45], [250, 200, 300]) == "met"
    assert timeslice_goal([100, 90, 101], [50, 40, 66], [250, 200, 300]) == "overcommits +2.0 points more shares"
    assert world_dra_goal("default", 95.25, 95.19) == "met"
    assert world_dra_goal("default", 94.6, 95.19) == "fgd -0.59, < 95.2"
    assert world_dra_goal("cpu050", 94.6, 95.07) == "met"
    assert world_dra_goal("cpu050", None, 95.07) == "incomplete"


def test_the_fgd_reference_is_docs_placements_fgd_column() -> None:
    found = fgd_figures()
    assert len(found) == 17 and found["default"] == 95.19
