"""Code says why, not which ticket: no tracker numbers in the code, its comments or its tests.

A number like "(issue 31)" tells a reader nothing the code should not say itself, and it ages: the
tracker is not shipped with the source. Upstream citations stay, because they name where a fact comes
from: ``NVIDIA/gpu-operator#1361``, ``gpu-operator issue #1361``, ``k8s-device-plugin PR #1621``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SWEPT = ("webhook", "tests", "benchmarks", "tools", "manifests", "argocd", "policies")
SUFFIXES = {".py", ".go", ".yaml", ".yml", ".sh", ".lua", ".toml", ".cfg", ".txt", ".json", ".md"}

# Our own tracker's style ("issue 28", "issues 24 and 25", "Issue 14 item 3"), and a bare short
# "#28" that no repository name precedes. Upstream numbers are cited with their repository
# ("NVIDIA/gpu-operator#2795") or written with a "#" and four or more digits ("issue #1361").
TICKET = re.compile(r"\b[Ii]ssues? \d+\b|\b[Ii]ssues? #\d{1,3}\b|(?<![\w/.#-])#\d{1,3}\b(?![\w-])")


def ticket_numbers(text: str) -> list[str]:
    """Every tracker reference in ``text``, as the matched words."""
    return [m.group(0) for m in TICKET.finditer(text)]


@pytest.mark.parametrize(("text", "found"), [
    ("Split out of worker (issue 31).", ["issue 31"]),
    ('"""Issue 14 item 3: the controller"""', ["Issue 14"]),
    ("# see #28 for the numbers", ["#28"]),
    ("issues 24 and 25", ["issues 24"]),
    ("NVIDIA/gpu-operator issue #1361 leaves pods Pending", []),
    ("differs forever (NVIDIA/gpu-operator#2795)", []),
    ("SSA on the parent ignores child waves (#13320)", []),
    ("k8s-device-plugin PR #1621", []),
    ("color: '#1f77b4'", []),
    ("an issue with 8 GPUs", []),
])
def test_the_pattern_tells_a_ticket_from_a_citation(text: str, found: list[str]) -> None:
    """The check below is only as good as this pattern: it must catch our style and spare citations."""
    assert ticket_numbers(text) == found


def swept_files() -> list[Path]:
    files = [p for top in SWEPT for p in sorted((ROOT / top).rglob("*"))
             if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts
             and p != Path(__file__).resolve()]  # this file holds the examples the pattern is tried on
    assert len(files) > 300, "the sweep found too few files: is the tree where this test thinks it is?"
    return files


def test_no_code_comment_or_test_names_a_ticket() -> None:
    """Where a number carried a reason, the reason is written instead."""
    found = [f"{path.relative_to(ROOT)}:{n}: {hit}"
             for path in swept_files()
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             for hit in ticket_numbers(line)]
    assert not found, "write the reason, not the ticket:\n" + "\n".join(found)
