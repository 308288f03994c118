"""The replay's arms live in one table: code reads what an arm does from its row, never its name.

A comparison against an arm's name outside ``webhook/replay/arms.py`` would make adding an arm an
edit in several places; the scan below finds such tests in the syntax tree (an ``==``/``in``
against a name, a literal list of names, a mapping keyed by names), and the made-up arms below show
that one row is enough for the runner to run a new combination.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from webhook.replay import arms, migcluster, runner, trace

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "webhook" / "replay" / "arms.py"
NAMES = frozenset(arms.NAMES)
PRODUCT_NAMES = frozenset({"gpugate"})
"""Arm names that are also the product's own name (its logger, chart release, scheduler profile):
they count only in a comparison whose other side speaks of an arm."""


def _names_in(node: ast.AST, *, product: bool = False) -> list[str]:
    """Arm names a literal spells: a string, or a tuple/list/set of strings, or ``"a,b"``;
    ``product``: the product's own name counts too."""
    known = NAMES if product else NAMES - PRODUCT_NAMES
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        parts = node.value.split(",")
        named = [p for p in parts if p in known]
        return named if len(named) == len(parts) else []
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [name for element in node.elts for name in _names_in(element, product=product)]
    return []


def arm_name_tests(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place the module's code tells arms apart by name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = (node.left, *node.comparators)
            about_arms = any("arm" in ast.unparse(side) for side in sides)
            for side in sides:
                found += [(node.lineno, f"compares with {name!r}") for name in _names_in(side, product=about_arms)]
        elif isinstance(node, ast.Dict):
            found += [(node.lineno, f"keys a mapping by {name!r}") for key in node.keys if key is not None
                      for name in _names_in(key)]
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            named = _names_in(node.value)
            if len(named) >= 2:
                found.append((node.lineno, f"lists the arms {', '.join(named)} by hand"))
    return found


def test_the_scan_finds_each_way_of_telling_arms_apart_by_name() -> None:
    source = ('if spec.arm == "rightsized": pass\n'
              'routed = {"binpack-profile": "x"}.get(arm)\n'
              'SIZED = ("whole-gpu", "shares-only")\n'
              'DEFAULT = "stock,extender"\n'
              'ok = arm in table and ties == "list" and logger == "gpugate"\n'
              'if spec.arm != "gpugate": pass\n')
    assert sorted(line for line, _ in arm_name_tests(source)) == [1, 2, 3, 4, 6]


def test_no_module_outside_the_table_tells_arms_apart_by_name() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {what}"
             for path in sorted((ROOT / "webhook").rglob("*.py")) if path != TABLE
             for line, what in arm_name_tests(path.read_text(encoding="utf-8"))]
    assert found == [], "read what the arm does from its row in webhook/replay/arms.py:\n" + "\n".join(found)


def _register(monkeypatch: pytest.MonkeyPatch, arm: arms.Arm) -> None:
    """Add ``arm`` to the table the runs read (``BY_NAME``), for this test only."""
    monkeypatch.setitem(arms.BY_NAME, arm.name, arm)


def _same_curves(left: runner.RunResult, right: runner.RunResult) -> bool:
    return (np.array_equal(left.allocated, right.allocated) and np.array_equal(left.placed, right.placed)
            and left.denied == right.denied and left.world == right.world)


def test_a_made_up_kube_arm_runs_from_its_row_alone(monkeypatch: pytest.MonkeyPatch, repo_root: Path) -> None:
    """A row that sends every pod to the binpack profile through the policies: a combination no
    shipped arm has, so no code path can know it by name. Its run differs from the plain binpack
    arm only where admission does; with policies that admit every pod as written it is the same."""
    small = trace.synthetic(5, nodes=30)
    _register(monkeypatch, arms.Arm("made-up-binpack", "kube", "test arm", profile=arms.BINPACK_PROFILE))
    made_up = runner.run(small, runner.RunSpec(arm="made-up-binpack", seed=5))
    binpack = runner.run(small, runner.RunSpec(arm="binpack-profile", seed=5))
    stock = runner.run(small, runner.RunSpec(arm="stock", seed=5))
    assert made_up.arm == "made-up-binpack" and _same_curves(made_up, binpack)
    assert not _same_curves(made_up, stock), "the profile field changed nothing: the test shows nothing"
    _register(monkeypatch, arms.Arm("made-up-admitted-binpack", "kube", "test arm", policies=True,
                                    profile=arms.BINPACK_PROFILE))
    admitted = runner.run(small, runner.RunSpec(arm="made-up-admitted-binpack", seed=5,
                                                policies=str(repo_root / "policies")))
    assert admitted.arm == "made-up-admitted-binpack" and admitted.alloc_at(100) > 0


def test_a_made_up_sizing_arm_runs_from_its_row_alone(monkeypatch: pytest.MonkeyPatch, repo_root: Path) -> None:
    """Time-sliced partitioned nodes where fractional pods still ask a whole GPU: the slots stay
    unused, so it places as whole-gpu does on fewer whole GPUs, never more than shares-only."""
    small = trace.synthetic(7, nodes=30)
    row = arms.Arm("made-up-sliced-whole", "sizing", "test arm", policies=True, world="mig-twin",
                   sizing=arms.Sizing(partitioned="time-sliced", fractional_ask="gpu"))
    _register(monkeypatch, row)
    policies = str(repo_root / "policies")
    spec = runner.RunSpec(arm=row.name, seed=7, policies=policies, mig_mix="all-balanced=0.5")
    made_up = runner.run(small, spec)
    whole = runner.run(small, dataclasses.replace(spec, arm="whole-gpu"))
    assert made_up.arm == row.name and made_up.world == "mig-twin"
    assert made_up.failed > whole.failed, "the partitioned nodes' GPUs were not taken away"
    assert migcluster.pod_for(small.pods[0], row.name) == migcluster.pod_for(small.pods[0], "whole-gpu")


def test_a_name_missing_from_the_table_is_refused_with_the_known_arms() -> None:
    with pytest.raises(Exception, match="unknown arm 'no-such-arm'; choose from stock, gpugate"):
        runner.run(trace.synthetic(1, nodes=8), runner.RunSpec(arm="no-such-arm", seed=1))
    with pytest.raises(ValueError, match="not a right-sizing arm: 'stock'"):
        migcluster.sized_nodes((), "stock", ())
