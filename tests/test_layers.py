"""The pure core never imports an edge (HTTP, the Kubernetes client, the CLI, processes).

An import-linter contract in test form: it reads the source, so it fails the moment someone
reaches for flask or kubernetes from the policy engine, the mutation core or the scheduler model.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "webhook"
CORE = ["policy/model.py", "policy/matching.py", "policy/overlap.py", "mutation.py", "patches.py", "validation.py",
        "pods.py", "quantity.py", "names.py"]
OPTIONAL_CORE = ["balancer/tiers.py", "balancer/state.py", "balancer/marks.py", "balancer/settings.py",
                 "replay/model.py", "stack/compat.py", "stack/plan.py"]
FORBIDDEN = ("flask", "kubernetes", "gunicorn", "requests", "urllib3", "subprocess", "socket", "http",
             "webhook.server", "webhook.cli", "webhook.commands", "webhook.kubeclient", "os", "time", "random")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def core_modules() -> list[str]:
    return CORE + [m for m in OPTIONAL_CORE if (PACKAGE / m).exists()]


@pytest.mark.parametrize("module", core_modules())
def test_core_module_imports_no_edge(module: str) -> None:
    bad = sorted(m for m in imported_modules(PACKAGE / module)
                 if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert not bad, f"webhook/{module} imports {bad}; the core takes data in and gives data out"


@pytest.mark.parametrize("module", core_modules())
def test_core_module_opens_no_file(module: str) -> None:
    tree = ast.parse((PACKAGE / module).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open"]
    assert not calls, f"webhook/{module} calls open(); file access belongs to an edge"


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os.path\nfrom kubernetes import client\nfrom . import x\n")
    assert imported_modules(sample) == {"os.path", "kubernetes"}
