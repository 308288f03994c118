"""benchmarks/placement_table.py's goal check: each of the placement goals, for both extender columns.

The goals are a test helper (tests/replay/placementgoals.py) the benchmark imports; its worlds
table is read from a run of the benchmark itself, so no test imports a benchmark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.replay.placementgoals import dra_goals, fgd_figures, goals, timeslice_goal, world_dra_goal

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "placement_table.py"

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


def test_the_dra_goals_judge_a_configured_mix_apart() -> None:
    assert dra_goals("default", 95.14, 95.19) == "< 95.2"
    assert dra_goals("default", 95.14, 95.19, 95.3) == "< 95.2"
    assert dra_goals("default", 95.25, 95.19, 95.3) == "met"
    assert dra_goals("default", 95.25, 95.19, 94.6) == "fgd -0.59 (configured mix), < 95.2 (configured mix)"
    assert dra_goals("cpu050", 94.5, 95.07, 94.6) == "fgd -0.57"


def test_the_fgd_reference_is_docs_placements_fgd_column() -> None:
    found = fgd_figures()
    assert len(found) == 17 and found["default"] == 95.19


def worlds_table(folder: Path) -> str:
    """What ``placement_table.py worlds`` prints for the results and pod lists in ``folder``."""
    ran = subprocess.run([sys.executable, str(BENCHMARK), "worlds", "--out", str(folder), "--seeds", "42-44",
                          "--trace", str(folder)], capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def test_the_worlds_table_shows_the_configured_mix_beside_the_shipped_extender(tmp_path: Path) -> None:
    """Medians per (list, arm@world) from a results file; the configured-mix column appears only
    when such runs are in it, after the shipped extender's (docs/placement.md's summary reads the 8th cell)."""
    (tmp_path / "openb_pod_list_default.csv").write_text("")
    rows = [("stock@timeslice", 76.5, 7400), ("bestfit-slots@timeslice", 79.9, 7295),
            ("extender@timeslice", 81.2, 7616), ("extender@dra", 95.1, 7900), ("extender-mix@dra", 95.3, 7950)]
    with (tmp_path / "results.jsonl").open("w") as out:
        for seed in (42, 43, 44):
            for tag, alloc, placed in rows:
                out.write(json.dumps({"list": "default", "tag": tag, "seed": seed, "alloc_100": alloc + seed / 100,
                                      "placed_100": placed, "overcommitted": 100, "shares_placed": 200}) + "\n")
    header, _, default = worlds_table(tmp_path).splitlines()
    assert "| dra: **extender** | dra: extender, configured mix | fgd" in header
    cells = [cell.strip() for cell in default.strip("|").split("|")]
    assert cells[7:] == ["95.53", "95.73", "95.19", "met"]  # seed 43's: medians of three seeds
    (tmp_path / "results.jsonl").write_text("\n".join(line for line in (tmp_path / "results.jsonl").read_text()
                                                      .splitlines() if "extender-mix" not in line))
    header, _, default = worlds_table(tmp_path).splitlines()
    assert "configured mix" not in header and default.split("|")[9].strip() == "95.19"
