"""benchmarks/rebalance_table.py's table: medians over seeds and the goals called met or missed.

Its ``run`` is the timeline replay (``webhook.replay.timeline``, tested in tests/replay); a whole run
is minutes per list, so this checks the table on recorded rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _row(name: str, arm: str, seed: int, *, pending: float, wait: float, allocation: float,
         moves_pct: float = 0.0) -> dict:
    return {"list": name, "arm": arm, "seed": seed, "load": 0.95, "pending": pending, "wait_p95": wait,
            "allocation": allocation, "moves_per_hour_pct": moves_pct, "moves": 3 if moves_pct else 0,
            "seconds": 10.0, "pending_series": [pending, pending], "allocation_series": [allocation, allocation]}


def test_the_table_calls_each_goal_from_the_medians(tmp_path: Path) -> None:
    rows = []
    for seed, jitter in ((42, 0.0), (43, 0.2), (44, -0.2)):
        rows += [_row("default", "stock", seed, pending=17 + jitter, wait=0, allocation=75),
                 _row("default", "extender", seed, pending=3 + jitter, wait=500, allocation=89),
                 _row("default", "extender+rebalancer", seed, pending=2 + jitter, wait=400, allocation=89,
                      moves_pct=0.5),
                 _row("cpu050", "stock", seed, pending=19, wait=0, allocation=74),
                 _row("cpu050", "extender", seed, pending=2.5, wait=450, allocation=89.5),
                 _row("cpu050", "extender+rebalancer", seed, pending=2.4, wait=460, allocation=89.4,
                      moves_pct=2.5)]
    rows.append(_row("cpu100", "stock", 42, pending=1, wait=0, allocation=70))  # a list without every arm
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rebalance_table.py"), "table",
                           "--out", str(tmp_path), "--seeds", "42-44"], capture_output=True, text=True,
                          timeout=120, check=True)
    lines = {line.split(" | ")[0].strip("| "): line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert lines["default"].endswith("| met |")
    assert "| 3.00 | 2.00 |" in lines["default"], "the medians of the three seeds"
    missed = lines["cpu050"].rsplit("|", 2)[1].strip()
    assert missed == "pending -4%, p95 wait not lower, allocation -0.10, 2.50%/h moved"
    assert "cpu100" not in lines, "a list is tabled only once every arm ran"
    assert "goals met on 1 lists" in done.stdout


def test_all_runs_only_what_is_missing_then_writes_the_table_and_the_plot(tmp_path: Path) -> None:
    """The docs' one command: with every (list, arm, seed) recorded it replays nothing (no trace is
    read: ``--trace`` names a folder that does not exist) and prints the table and draws the plot."""
    rows = [_row(name, arm, seed, pending=p, wait=100, allocation=89)
            for seed in (42, 43) for name in ("default", "cpu050")
            for arm, p in (("stock", 17.0), ("extender", 3.0), ("extender+rebalancer", 2.0))]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    picture = tmp_path / "rebalance.png"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rebalance_table.py"), "all",
                           "--out", str(tmp_path), "--seeds", "42-43", "--lists", "default,cpu050",
                           "--trace", str(tmp_path / "no-trace-here"), "--to", str(picture)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "| default |" in done.stdout and "| cpu050 |" in done.stdout
    assert picture.read_bytes().startswith(b"\x89PNG")
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == len(rows), "nothing replayed again"
