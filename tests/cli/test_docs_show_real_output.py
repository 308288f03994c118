"""The docs show real output: the before/after of one pod in docs/policies.md is what
``gpugate mutate ... -o diff`` prints today, the summary figures in docs/placement.md are its own
sharing-worlds table's, and the replay's default arms are the CLI's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
POLICIES = (ROOT / "docs" / "policies.md").read_text()
PLACEMENT = (ROOT / "docs" / "placement.md").read_text()


def section(text: str, heading: str) -> str:
    """From ``heading`` to the next heading of the same level."""
    level = heading.split(" ", 1)[0]
    body = text.split(heading + "\n", 1)[1]
    return re.split(rf"^{level} ", body, maxsplit=1, flags=re.MULTILINE)[0]


def test_the_before_and_after_is_what_gpugate_mutate_prints() -> None:
    block = section(POLICIES, "## One pod, before and after").split("```diff\n", 1)[1].split("\n```", 1)[0]
    done = subprocess.run([sys.executable, "-m", "webhook.cli", "mutate", "webhook/examples/pod-training.yaml",
                           "-n", "ml-team", "-o", "diff"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    real = re.sub(r"training@[0-9a-f]+", "training@REV", done.stderr + done.stdout).splitlines()
    shown = block.splitlines()
    assert len(shown) > 20 and real[:len(shown)] == shown


def test_the_summary_figures_are_the_sharing_worlds_table() -> None:
    """The figures in "In short" are the default row of the sharing-worlds table on the same page
    (printed by ``benchmarks/placement_table.py worlds``), with the commands that made them."""
    table = section(PLACEMENT, "## What a user gets, in each sharing world (median of seeds 42-51)")
    default = next(line for line in table.splitlines() if line.startswith("| default |"))
    cells = [cell.strip().strip("*") for cell in default.strip("|").split("|")]
    stock, extender, dra = cells[1], cells[3], cells[7]  # list, stock, bestfit-slots, extender, ..., dra extender
    summary = section(PLACEMENT, "## In short")
    for figure in (stock, extender, dra):
        assert f"**{figure}%**" in summary
    assert "--arms stock,bestfit-slots,extender" in summary and "--sharing timeslice" in summary
    assert "--arms extender --sharing dra" in summary


def test_the_replay_section_names_the_default_arms_and_their_run_count() -> None:
    from webhook.commands.replay import ALL_ARMS, parse_seeds

    said = re.search(r"runs the seven default arms \(`([a-z,-]+)`,\s+(\d+) runs",
                     section(PLACEMENT, "## Running the replay"))
    assert said is not None and said.group(1) == ALL_ARMS
    assert int(said.group(2)) == len(ALL_ARMS.split(",")) * len(parse_seeds("42-51"))
