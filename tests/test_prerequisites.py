"""The rule for a missing prerequisite (tests/prerequisites.py): skip on a user's clone, fail in CI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import prerequisites

TESTS = Path(__file__).resolve().parent

# The only direct pytest.skip calls left: a choice of the person running the tests (an attached
# cluster cannot reach this machine's loopback), a later step of a chain whose first step
# already failed, and the CRD kinds ../shared/schemas does not hold yet (named: a missing external prerequisite).
ALLOWED_SKIPS = ("127.0.0.1", "attached to an existing cluster", "KUBECONFIG_ENV", "the first install did not finish",
                 "needs test 2's upgrade", "not validated: ")


def test_a_missing_prerequisite_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI is set and helm is gone"):
        prerequisites.missing("helm is gone")


def test_a_missing_prerequisite_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="helm is gone"):
        prerequisites.missing("helm is gone")


def test_a_missing_path_names_itself_and_what_it_holds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    absent = tmp_path / "charts"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=f"{absent} is absent \\(chart packages\\)"):
        prerequisites.needed(absent, "chart packages")
    with pytest.raises(pytest.fail.Exception, match="the chart render would be left out"):
        prerequisites.optional(absent, "the chart render")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        prerequisites.needed(absent, "chart packages")
    assert prerequisites.optional(absent, "the chart render") is None
    absent.mkdir()
    assert prerequisites.needed(absent, "chart packages") == absent
    assert prerequisites.optional(absent, "the chart render") == absent


def test_no_test_skips_for_a_missing_prerequisite_on_its_own() -> None:
    """Every other pytest.skip in tests/ is one of the allowed kinds; a new one for a missing tool
    or file goes through prerequisites.missing, or it would skip in CI too."""
    found = []
    # tests/e2e/local.py is the one home of the attached-cluster rule (its reasons name 127.0.0.1).
    homes = {Path(prerequisites.__file__), TESTS / "e2e" / "local.py"}
    for path in sorted(set(TESTS.rglob("*.py")) - homes):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.skip":
                text = ast.unparse(node)
                if not any(allowed in text for allowed in ALLOWED_SKIPS):
                    found.append(f"{path.relative_to(TESTS)}:{node.lineno}: {text}")
    assert found == [], "\n".join(found)
