"""The README's first screen shows real output: its before/after of one pod is what
``gpugate mutate ... -o diff`` prints today, and its measured figure is the one docs/placement.md holds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_before_and_after_is_what_gpugate_mutate_prints() -> None:
    block = README.split("**One pod, before and after.**", 1)[1].split("```diff\n", 1)[1].split("\n```", 1)[0]
    done = subprocess.run([sys.executable, "-m", "webhook.cli", "mutate", "webhook/examples/pod-training.yaml",
                           "-n", "ml-team", "-o", "diff"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    real = re.sub(r"training@[0-9a-f]+", "training@REV", done.stderr + done.stdout).splitlines()
    shown = block.splitlines()
    assert real[:len(shown)] == shown


def test_the_measured_figures_are_docs_placements_worlds_table() -> None:
    """The first screen's figures are the default row of docs/placement.md's sharing-worlds table
    (printed by ``benchmarks/placement_table.py worlds``), with the command that made them."""
    table = (ROOT / "docs" / "placement.md").read_text().split("## What a user gets, in each sharing world")[1]
    default = next(line for line in table.splitlines() if line.startswith("| default |"))
    cells = [cell.strip().strip("*") for cell in default.strip("|").split("|")]
    stock, extender, dra = cells[1], cells[3], cells[7]  # list, stock, bestfit-slots, extender, ..., dra extender
    first_screen = README.split("## Quick start", 1)[0]
    for figure in (stock, extender, dra):
        assert f"**{figure}%**" in first_screen
    assert "--arms stock,bestfit-slots,extender --sharing timeslice" in first_screen
    assert "--arms extender --sharing dra" in first_screen


def test_the_replay_section_names_the_default_arms_and_their_run_count() -> None:
    from webhook.commands.replay import ALL_ARMS, parse_seeds

    section = README.split("## Replay", 1)[1]
    said = re.search(r"runs the seven default arms \(`([a-z,-]+)`,\s+(\d+) runs", section)
    assert said is not None and said.group(1) == ALL_ARMS
    assert int(said.group(2)) == len(ALL_ARMS.split(",")) * len(parse_seeds("42-51"))
