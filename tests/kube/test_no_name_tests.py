"""No module outside ``webhook/kube/`` compares a GPU resource name: each asks ``kube.units``
(``kind_of``, ``is_plugin_gpu``, ``is_shared``, ``is_mig``, ``pooled``, ``by_name``), so a new kind
is a row of its table and nothing else. Writing a name (a pod the replay builds, a patch) is not
comparing it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from webhook.kube import units

PACKAGE = Path(__file__).resolve().parents[2] / "webhook"
NAME_CONSTANTS = {"GPU_RESOURCE", "SHARED_GPU_RESOURCE", "MIG_RESOURCE_PREFIX"}
NAME_LITERALS = ("nvidia.com/gpu", "nvidia.com/mig-")
NVIDIAS_OWN_RULE = {"webhook/stack/consumers.py"}
"""The stack tool models NVIDIA's upgrade controller, whose own rule is a prefix test on
``nvidia.com/gpu`` and ``nvidia.com/mig-`` (gpuPodSpecFilter): that is NVIDIA's vocabulary, not ours."""


def _names_a_resource(node: ast.AST) -> bool:
    if isinstance(node, (ast.Attribute, ast.Name)):
        return (node.attr if isinstance(node, ast.Attribute) else node.id) in NAME_CONSTANTS
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return units.is_gpu_resource(node.value) or node.value in NAME_LITERALS
    if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
        return any(_names_a_resource(e) for e in node.elts)
    if isinstance(node, ast.JoinedStr):
        return any(_names_a_resource(v) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return _names_a_resource(node.value)
    return False


def name_tests(tree: ast.AST) -> list[str]:
    """Comparisons (``==``, ``!=``, ``in``), ``startswith``, and look-ups (``d.get(name)``, ``d[name]`` read)
    whose operand names a GPU resource."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(_names_a_resource(o) for o in (node.left, *node.comparators)):
            found.append(f"line {node.lineno}: compares a resource name")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "removeprefix") and any(_names_a_resource(a) for a in node.args):
            found.append(f"line {node.lineno}: tests a resource name's prefix")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop") \
                and node.args and _names_a_resource(node.args[0]):
            found.append(f"line {node.lineno}: looks a resource up by its name")
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _names_a_resource(node.slice):
            found.append(f"line {node.lineno}: reads a resource by its name")
    return found


OUTSIDE_KUBE = sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
                      if "kube" not in p.relative_to(PACKAGE).parts[:1] and p.name != "names.py")


@pytest.mark.parametrize("path", [p for p in OUTSIDE_KUBE if p not in NVIDIAS_OWN_RULE])
def test_no_module_outside_kube_compares_gpu_resource_names(path: str) -> None:
    tree = ast.parse((PACKAGE.parent / path).read_text(encoding="utf-8"))
    assert name_tests(tree) == []


@pytest.mark.parametrize(("source", "found"), [
    ("x == names.GPU_RESOURCE", True), ("r in (SHARED_GPU_RESOURCE, GPU_RESOURCE)", True),
    ("r.startswith(names.MIG_RESOURCE_PREFIX)", True), ("r == 'nvidia.com/gpu'", True),
    ("r == f'{names.MIG_RESOURCE_PREFIX}{p}'", True), ("units.is_plugin_gpu(r)", False),
    ("d[names.GPU_RESOURCE] = 1", False), ("d.get(GPU_RESOURCE, 0)", True), ("n = d[SHARED_GPU_RESOURCE]", True),
    ("label == 'nvidia.com/gpu.product'", False),
    ("r == 'nvidia.com/gpu.shared'", True), ("r in {'nvidia.com/mig-1g.10gb'}", True),
])
def test_the_check_sees_a_name_test(source: str, found: bool) -> None:
    assert bool(name_tests(ast.parse(source))) == found
