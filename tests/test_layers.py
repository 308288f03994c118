"""The package's architecture as a test: every module is placed in the pure core or at an edge.

An import-linter contract in test form. Each folder of ``webhook/`` lists all of its modules;
a module the table does not name fails (place it), and so does a module the table names that is
missing (the table is stale). A core module takes data in and gives data out: it imports no
edge (HTTP, the Kubernetes client, processes, the clock, randomness, the environment), no edge
module of gpugate, and opens no file.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "webhook"
CORE, EDGE = "core", "edge"

# folder (relative to webhook/) -> {module: layer}
LAYERS: dict[str, dict[str, str]] = {
    ".": {"__init__": CORE, "errors": CORE, "names": CORE, "filewatch": EDGE,
          "cli": EDGE, "logs": EDGE, "kubeclient": EDGE, "kubetarget": CORE, "lease": EDGE},
    "kube": {"__init__": CORE, "quantity": CORE, "resources": CORE, "pods": CORE, "yamlload": CORE, "inventory": CORE,
             "units": CORE, "claims": CORE, "slices": CORE, "allocations": CORE, "nodedevices": CORE,
             "rightsizedclaims": CORE, "affinity": CORE, "tolerations": CORE, "demand": CORE,
             "gpunode": CORE, "devicetaints": CORE, "claimowners": CORE, "documents": EDGE},
    "policy": {"__init__": CORE, "model": CORE, "parsing": CORE, "matching": CORE, "overlap": CORE,
               "loading": EDGE, "store": EDGE},
    "admission": {"__init__": CORE, "reviews": CORE, "envelope": CORE, "budget": CORE,
                  "mutation": CORE, "validation": CORE,
                  "patches": CORE, "patchcheck": CORE, "affinity": CORE, "chain": CORE, "rightsizing": CORE,
                  "dra": CORE, "claimladder": CORE, "cases": EDGE, "results": CORE, "answers": CORE,
                  "desiredpod": CORE, "requeststeps": CORE, "schedulingsteps": CORE, "preferences": CORE,
                  "podclaims": CORE, "rightsizedtemplate": CORE, "workloads": CORE, "judgement": CORE},
    "server": {"__init__": CORE, "framing": CORE, "outcome": CORE, "drain": EDGE, "claimlookup": EDGE,
               "serverstate": EDGE, "requestbody": EDGE, "worker": EDGE, "requestloop": EDGE, "connection": EDGE,
               "workershared": EDGE, "inventoryfile": EDGE, "routes": EDGE, "serving": EDGE, "metrics": EDGE,
               "client": EDGE, "deviceclasswatch": EDGE, "podlookup": EDGE},
    "certs": {"__init__": CORE, "pki": EDGE, "publish": EDGE, "reload": EDGE},
    "audit": {"__init__": CORE, "findings": CORE, "cluster": EDGE},
    "balancer": {"__init__": CORE, "state": CORE, "backoff": CORE,
                 "placementfeed": CORE, "drawatch": EDGE, "templatekeeper": EDGE,
                 "publisher": EDGE, "extenderserver": EDGE, "settings": EDGE,
                 "cluster": EDGE, "controller": EDGE, "health": EDGE, "labeller": EDGE, "labelwrites": EDGE,
                 "extendercache": EDGE, "inventorysource": EDGE, "utilization": EDGE, "listener": EDGE,
                 "metrics": EDGE, "prometheus": EDGE,
                 "healthpolicy": CORE, "healthschema": CORE, "healthsignals": CORE, "quarantine": CORE,
                 "quarantineledger": CORE, "quarantineplan": CORE, "quarantineapi": EDGE, "quarantineloop": EDGE,
                 "quarantinemetrics": EDGE, "quarantinereport": CORE,
                 "usagesource": EDGE, "podactions": EDGE, "idlereclaim": EDGE, "usagewiring": EDGE,
                 "moveplan": CORE, "mover": EDGE},
    "stack": {"__init__": CORE, "compat": CORE, "plan": CORE, "model": CORE, "chartcheck": CORE, "checks": CORE,
              "releases": CORE, "messages": CORE, "rollback": CORE,
              "chartrender": EDGE, "rendering": EDGE, "site": EDGE,
              "matrix": EDGE, "manifests": EDGE, "gitrepo": EDGE, "status": EDGE, "upgrade": EDGE,
              "verify": EDGE, "chartvalues": EDGE, "manifestcheck": EDGE, "canary": CORE, "canary_watch": EDGE,
              "change": CORE, "clusterstate": CORE, "hardening": CORE, "nodestates": CORE, "consumers": CORE,
              "crdstate": CORE, "hardware": CORE, "dracutover": CORE, "chartcrds": EDGE, "clusterread": EDGE,
              "canarymodes": CORE, "canarygit": EDGE, "canary_observe": EDGE, "canary_controller": EDGE,
              "canarymetrics": EDGE},
    "replay": {"__init__": CORE, "records": CORE, "kubescheduler": CORE, "nodelabels": CORE, "cluster": CORE,
               "fragmentation": CORE, "reference": CORE,
               "arrival": CORE, "demand": CORE, "workload": CORE, "labels": CORE,
               "migcluster": CORE, "trace": EDGE, "report": EDGE, "runner": EDGE, "sizing": EDGE,
               "arms": CORE, "runspec": CORE, "worlds": CORE, "admitting": EDGE,
               "stream": CORE, "timeline": EDGE, "timelineresult": CORE, "rebalancing": CORE,
               "timelinereport": EDGE},
    "placement": {"__init__": CORE, "devices": CORE, "inputs": CORE, "shapes": CORE, "fragment": CORE,
                  "scoring": CORE, "extender": CORE, "dra": CORE, "tiers": CORE, "marks": CORE,
                  "dracount": CORE, "gpuinventory": CORE, "moves": CORE, "freeing": CORE,
                  "rooms": CORE},
    "commands": {"__init__": CORE, "argocd": EDGE, "balance": EDGE, "certs": EDGE, "offline": EDGE,
                 "replay": EDGE, "serve": EDGE, "stack": EDGE, "stack_options": EDGE,
                 "stack_render": EDGE, "stack_canary": EDGE, "stack_canary_watch": EDGE, "smoke": EDGE,
                 "demo": EDGE, "health": EDGE, "usage": EDGE, "clusteroptions": EDGE, "audit": EDGE, "settingsoptions": EDGE},
    "usage": {"__init__": CORE, "workloads": CORE, "accounting": CORE, "idle": CORE, "durations": CORE,
              "promql": CORE, "report": CORE, "budget": CORE},
    "localcluster": {"__init__": CORE, "binaries": EDGE, "controlplane": EDGE, "pki": EDGE, "processes": EDGE,
                     "fakekubelet": EDGE, "kubeletobjects": CORE, "cluster": EDGE, "webhooks": CORE, "demo": EDGE,
                     "interrupts": EDGE},
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
            # ``from webhook.kube import pods`` imports the module webhook.kube.pods; the package
            # itself counts only when a name is taken from it (its __init__ holds no code here)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
            folder = PACKAGE.parent.joinpath(*node.module.split("."))
            if not all((folder / f"{alias.name}.py").is_file() for alias in node.names):
                found.add(node.module)
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


# --- one home for GPU facts ------------------------------------------------------------
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


# --- one reading of what a pod demands -------------------------------------------------
# kube/demand.py reads a pod's requests, claims, DRA-backed resources and right-sizing labels into
# one PodDemand; a module elsewhere that calls the readers under it, or declares a demand shape of
# its own, is reading the pod a second way.
DEMAND_READERS = {("pods", "effective_requests"), ("pods", "gpu_requests"), ("claims", "pod_claim_refs"),
                  ("allocations", "dra_backed_resources")}
DEMAND_FIELDS = {"share_milli", "num_gpu", "fraction"}


def demand_rederivations(tree: ast.AST) -> list[str]:
    """Calls of the readers kube/demand.py wraps, imports of them by name, and classes named
    ``*Demand`` or holding a demand's fields (a slot's share, a GPU count per pod, a right-size)."""
    found = []
    wrapped = {name for _, name in DEMAND_READERS}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in DEMAND_READERS:
            found.append(f"line {node.lineno}: {node.func.value.id}.{node.func.attr}() (kube.demand)")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("webhook.kube.") \
                and node.module != "webhook.kube.demand":
            found += [f"line {node.lineno}: imports {a.name} (kube.demand)" for a in node.names if a.name in wrapped]
        if isinstance(node, ast.ClassDef):
            fields = {t.target.id for t in node.body if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
            if node.name.endswith("Demand") or fields & DEMAND_FIELDS:
                found.append(f"line {node.lineno}: class {node.name}, its own demand shape (kube.demand.PodDemand)")
    return found


# The trace's row (num_gpu x gpu_milli, as the published CSV spells it) is read into a PodDemand by
# replay.runner.record_demand; the row itself is the file's shape, not a pod's.
TRACE_ROWS = {"webhook.replay.records"}
OUTSIDE_DEMAND = sorted(name for name in placed()
                        if name not in ("webhook.kube.demand", "webhook.kube.pods", "webhook.kube.claims",
                                        "webhook.kube.allocations") and name not in TRACE_ROWS)


# --- each rule with one home, checked over the modules outside it ---------------------------------
@dataclass(frozen=True)
class OneHome:
    """A rule with one home: the finder of a second writing of it, the modules it must not be in,
    and a sample the finder must flag ``in_sample`` times (so a finder that sees nothing fails)."""

    finder: Callable[[ast.AST], list[str]]
    modules: list[str]
    says: str
    sample: str
    in_sample: int


ONE_HOME = {
    "gpu fact": OneHome(gpu_fact_rederivations, OUTSIDE_KUBE, "re-derives what webhook/kube/ holds",
                        "share = g / 7\nkey = 'deviceClassName'\npat = r'^nvidia\\.com/mig-[0-9]+g'\n"
                        "na = spec['affinity'].get('nodeAffinity')\nclass Toleration: pass\n", 5),
    "pod demand": OneHome(demand_rederivations, OUTSIDE_DEMAND, "re-reads what kube.demand.PodDemand holds",
                          "from webhook.kube.pods import effective_requests\nn = pods.gpu_requests(p)\n"
                          "r = claims.pod_claim_refs(p)\nclass Demand: pass\nclass Ask:\n    fraction: float\n", 5),
}


@pytest.mark.parametrize(("rule", "module"), [(rule, m) for rule, home in ONE_HOME.items() for m in home.modules])
def test_no_module_writes_a_rule_with_one_home_again(rule: str, module: str) -> None:
    home = ONE_HOME[rule]
    found = home.finder(ast.parse(module_path(module).read_text()))
    assert not found, f"{module} {home.says}: {found}"


@pytest.mark.parametrize("rule", sorted(ONE_HOME))
def test_each_one_home_check_sees_a_second_writing(rule: str) -> None:
    home = ONE_HOME[rule]
    assert len(home.finder(ast.parse(home.sample))) == home.in_sample


# --- no cycles, no sideways imports between products, small rooms ---------------------
# Counted over every import of a module, a lazy one inside a function too: hiding a cycle behind a
# lazy import does not break it.
PRODUCTS = ("admission", "balancer", "stack", "replay", "certs")
"""Sibling products: each may import the shared vocabulary (kube/, policy/, placement/, the top-level
modules) but not another product."""
SHARED_PRODUCT_MODULES = {  # the only product modules a sibling may import, each for a reason of its own
    "webhook.certs.reload": "the serving certificate reloader both servers use",
    "webhook.admission.chain": "the pure admission core, which the replay runs on every trace pod",
}
SIDEWAYS_ALLOWED: set[tuple[str, str]] = set()  # none left: a new sideways import fails
CYCLES_ALLOWED: list[set[str]] = []  # none left: keep it so (the replay runner<->sizing cycle is broken)
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 60
LONG_MODULES_ALLOWED: set[str] = set()  # none left: a module that grows past the limit fails
LONG_FUNCTIONS_ALLOWED: set[tuple[str, str]] = set()  # likewise: (module path, function name)


def import_graph() -> dict[str, set[str]]:
    """Module -> the gpugate modules it imports (anywhere in it)."""
    modules = placed()
    return {m: {i for i in imported_modules(module_path(m)) if i in modules and i != m} for m in modules}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_no_import_cycle() -> None:
    found = [c for c in cycles(import_graph()) if c not in CYCLES_ALLOWED]
    assert not found, f"import cycles (a lazy import counts): {[sorted(c) for c in found]}"


def test_the_cycle_check_sees_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def product_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in PRODUCTS else None


def sideways(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, product package) for each import of another product's module."""
    found = set()
    for module, imports in graph.items():
        mine = product_of(module)
        for imported in imports:
            theirs = product_of(imported) or (imported.split(".")[1] if imported.count(".") == 1
                                              and imported.split(".")[1] in PRODUCTS else None)
            if mine and theirs and theirs != mine and imported not in SHARED_PRODUCT_MODULES:
                found.add((module, f"webhook.{theirs}"))
    return found


def test_products_import_each_other_only_through_the_shared_folders() -> None:
    found = sorted(sideways(import_graph()) - SIDEWAYS_ALLOWED)
    assert not found, (f"a product imports a sibling product {found}; share it through kube/, policy/ or placement/ "
                       f"instead ({', '.join(PRODUCTS)} are siblings)")


def test_the_sideways_check_sees_one_and_the_allow_list_is_not_stale() -> None:
    assert sideways({"webhook.stack.plan": {"webhook.admission.mutation", "webhook.kube.pods"}}) == {
        ("webhook.stack.plan", "webhook.admission")}
    stale = SIDEWAYS_ALLOWED - sideways(import_graph())
    assert not stale, f"no longer imported sideways: take {sorted(stale)} off SIDEWAYS_ALLOWED"
    gone = [sorted(c) for c in CYCLES_ALLOWED if c not in cycles(import_graph())]
    assert not gone, f"no longer a cycle: take {gone} off CYCLES_ALLOWED"


def long_functions(tree: ast.AST) -> list[tuple[str, int]]:
    return [(node.name, (node.end_lineno or node.lineno) - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES]


def sizes() -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Modules over MAX_MODULE_LINES and functions over MAX_FUNCTION_LINES, with their lengths."""
    modules, functions = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE.parent))
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            modules[name] = len(text.splitlines())
        for function, length in long_functions(ast.parse(text)):
            functions[(name, function)] = length
    return modules, functions


def test_no_module_over_450_lines_and_no_function_over_60() -> None:
    modules, functions = sizes()
    big = {name: n for name, n in modules.items() if name not in LONG_MODULES_ALLOWED}
    long = {f"{name}:{function}": n for (name, function), n in functions.items()
            if (name, function) not in LONG_FUNCTIONS_ALLOWED}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split along their seams): {big}"
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_size_allow_lists_only_shrink() -> None:
    modules, functions = sizes()
    stale = sorted(LONG_MODULES_ALLOWED - set(modules))
    stale += sorted(f"{m}:{f}" for m, f in LONG_FUNCTIONS_ALLOWED - set(functions))
    assert not stale, f"no longer over the limit: take {stale} off the allow-list"


def test_the_size_check_sees_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(ast.parse(f"def f():\n{body}\n")) == [("f", MAX_FUNCTION_LINES + 1)]
