"""The package's architecture as a test: every module is placed in the pure core or at an edge.

An import-linter contract in test form. Each folder of ``webhook/`` lists all of its modules;
a module the table does not name fails (place it), and so does a module the table names that is
missing (the table is stale). A core module takes data in and gives data out: it imports no
edge (HTTP, the Kubernetes client, processes, the clock, randomness, the environment), no edge
module of gpugate, and opens no file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "webhook"
CORE, EDGE = "core", "edge"

# folder (relative to webhook/) -> {module: layer}
LAYERS: dict[str, dict[str, str]] = {
    ".": {"__init__": CORE, "errors": CORE, "names": CORE, "filewatch": EDGE,
          "cli": EDGE, "logs": EDGE, "kubeclient": EDGE},
    "kube": {"__init__": CORE, "quantity": CORE, "resources": CORE, "pods": CORE, "yamlload": CORE, "inventory": CORE,
             "units": CORE, "claims": CORE, "slices": CORE, "allocations": CORE, "nodedevices": CORE,
             "affinity": CORE, "tolerations": CORE,
             "documents": EDGE},
    "policy": {"__init__": CORE, "model": CORE, "parsing": CORE, "matching": CORE, "overlap": CORE,
               "loading": EDGE, "store": EDGE},
    "admission": {"__init__": CORE, "reviews": CORE, "mutation": CORE, "validation": CORE, "patches": CORE,
                  "patchcheck": CORE, "affinity": CORE, "chain": CORE, "framing": CORE, "rightsizing": CORE,
                  "dra": CORE, "claimlookup": EDGE, "outcome": CORE, "cases": EDGE,
                  "worker": EDGE, "inventoryfile": EDGE, "routes": EDGE, "serving": EDGE, "metrics": EDGE,
                  "client": EDGE},
    "certs": {"__init__": CORE, "pki": EDGE, "publish": EDGE, "reload": EDGE},
    "balancer": {"__init__": CORE, "tiers": CORE, "state": CORE, "marks": CORE, "backoff": CORE, "inventory": CORE,
                 "placementfeed": CORE, "dracount": CORE, "drawatch": EDGE,
                 "publisher": EDGE, "extenderserver": EDGE, "settings": EDGE,
                 "cluster": EDGE, "controller": EDGE, "health": EDGE,
                 "lease": EDGE, "metrics": EDGE, "prometheus": EDGE},
    "stack": {"__init__": CORE, "compat": CORE, "plan": CORE, "model": CORE, "chartcheck": CORE, "checks": CORE, "releases": CORE,
              "messages": CORE, "rollback": CORE,
              "chartrender": EDGE, "site": EDGE,
              "matrix": EDGE, "manifests": EDGE, "gitrepo": EDGE, "status": EDGE, "upgrade": EDGE,
              "verify": EDGE, "chartvalues": EDGE, "manifestcheck": EDGE, "canary": CORE, "canary_watch": EDGE},
    "replay": {"__init__": CORE, "records": CORE, "model": CORE, "cluster": CORE, "metrics": CORE, "reference": CORE,
               "arrival": CORE, "demand": CORE, "workload": CORE, "labels": CORE,
               "migcluster": CORE, "trace": EDGE, "report": EDGE, "runner": EDGE, "sizing": EDGE},
    "placement": {"__init__": CORE, "devices": CORE, "inputs": CORE, "shapes": CORE, "fragment": CORE,
                  "scoring": CORE, "extender": CORE},
    "commands": {"__init__": CORE, "argocd": EDGE, "balance": EDGE, "certs": EDGE, "offline": EDGE,
                 "replay": EDGE, "serve": EDGE, "stack": EDGE, "stack_options": EDGE,
                 "stack_render": EDGE, "stack_canary": EDGE, "smoke": EDGE, "demo": EDGE},
    "localcluster": {"__init__": CORE, "binaries": EDGE, "controlplane": EDGE, "pki": EDGE, "processes": EDGE,
                     "fakekubelet": EDGE, "kubeletobjects": CORE, "cluster": EDGE, "webhooks": CORE, "demo": EDGE},
}

FORBIDDEN_LIBRARIES = ("flask", "werkzeug", "kubernetes", "gunicorn", "requests", "urllib3", "subprocess",
                       "socket", "http", "ssl", "os", "time", "random", "threading", "multiprocessing",
                       "prometheus_client", "click", "shutil", "tempfile")
FILE_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "glob", "rglob"}
# Core modules that read their own package data through importlib.resources (never a user's file).
PACKAGE_DATA_READERS = {"webhook.policy.parsing"}


def module_name(folder: str, stem: str) -> str:
    parts = ["webhook"] + ([] if folder == "." else folder.split("/")) + ([] if stem == "__init__" else [stem])
    return ".".join(parts)


def placed() -> dict[str, str]:
    return {module_name(folder, stem): layer for folder, table in LAYERS.items() for stem, layer in table.items()}


def module_path(name: str) -> Path:
    parts = name.split(".")[1:]
    candidate = PACKAGE.joinpath(*parts)
    return candidate / "__init__.py" if candidate.is_dir() else candidate.with_suffix(".py")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # ``from webhook.kube import pods`` imports the module webhook.kube.pods
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


CORE_MODULES = sorted(name for name, layer in placed().items() if layer == CORE)


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_every_module_of_a_folder_is_placed_and_every_placed_module_exists(folder: str) -> None:
    directory = PACKAGE if folder == "." else PACKAGE / folder
    present = {p.stem for p in directory.glob("*.py")}
    table = set(LAYERS[folder])
    assert not present - table, f"webhook/{folder}: place {sorted(present - table)} in LAYERS as core or edge"
    assert not table - present, f"webhook/{folder}: LAYERS names {sorted(table - present)}, which do not exist"


def test_every_package_folder_has_a_table() -> None:
    folders = {str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py")}
    assert folders == set(LAYERS), f"folders without a table: {sorted(folders - set(LAYERS))}"


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_no_edge(module: str) -> None:
    edges = {name for name, layer in placed().items() if layer == EDGE}
    found = imported_modules(module_path(module))
    bad = sorted(m for m in found if m in edges or any(m == f or m.startswith(f + ".") for f in FORBIDDEN_LIBRARIES))
    assert not bad, f"{module} imports {bad}; the core takes data in and gives data out"


@pytest.mark.parametrize("module", [m for m in CORE_MODULES if m not in PACKAGE_DATA_READERS])
def test_core_module_touches_no_file(module: str) -> None:
    tree = ast.parse(module_path(module).read_text())
    calls = sorted({(n.func.id if isinstance(n.func, ast.Name) else n.func.attr)
                    for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and ((isinstance(n.func, ast.Name) and n.func.id in FILE_CALLS)
                         or (isinstance(n.func, ast.Attribute) and n.func.attr in FILE_CALLS))})
    assert not calls, f"{module} calls {calls}; file access belongs to an edge"


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os.path\nfrom kubernetes import client\nfrom . import x\n")
    assert imported_modules(sample) == {"os.path", "kubernetes", "kubernetes.client"}


# --- one home for GPU facts (issue 24) ------------------------------------------------------------
# What a GPU unit is and how a DRA ask is spelled live in webhook/kube/ (units.py, resources.py,
# claims.py); a module elsewhere that writes one of these again is re-deriving it.
DRA_FIELDS = {"resourceClaims", "resourceClaimName", "resourceClaimTemplateName", "deviceClassName",
              "firstAvailable", "allocationMode", "adminAccess"}
OUTSIDE_KUBE = sorted(name for name in placed() if not name.startswith("webhook.kube") and name != "webhook.names")


def gpu_fact_rederivations(tree: ast.AST) -> list[str]:
    """Literal DRA field names, a division by the literal 7 (compute slices), a regex on MIG names,
    a hand-read nodeAffinity, a Toleration class."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in DRA_FIELDS:
                found.append(f"line {node.lineno}: {node.value!r}")
            if "mig-" in node.value and ("[0-9]" in node.value or "\\d" in node.value):
                found.append(f"line {node.lineno}: a MIG resource pattern")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "nodeAffinity":
            found.append(f"line {node.lineno}: reads nodeAffinity by hand (kube.affinity)")
        if isinstance(node, ast.ClassDef) and node.name == "Toleration":
            found.append(f"line {node.lineno}: a Toleration class of its own (kube.tolerations)")
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)) \
                and isinstance(node.right, ast.Constant) and node.right.value == 7:
            found.append(f"line {node.lineno}: divides by 7 (units.COMPUTE_SLICES_PER_GPU)")
    return found


@pytest.mark.parametrize("module", OUTSIDE_KUBE)
def test_no_module_outside_kube_rederives_a_gpu_fact(module: str) -> None:
    found = gpu_fact_rederivations(ast.parse(module_path(module).read_text()))
    assert not found, f"{module} re-derives what webhook/kube/ holds: {found}"


def test_the_rederivation_check_sees_one(tmp_path: Path) -> None:
    tree = ast.parse("share = g / 7\nkey = 'deviceClassName'\npat = r'^nvidia\\.com/mig-[0-9]+g'\n"
                     "na = spec['affinity'].get('nodeAffinity')\nclass Toleration: pass\n")
    assert len(gpu_fact_rederivations(tree)) == 5
