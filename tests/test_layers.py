"""The package's architecture as a test: the folder a module sits in says its layer.

An import-linter contract in test form, written as kopf writes its ``.importlinter`` (a ``layers``
contract over packages, ``independence`` between siblings): one rule per folder, no per-module table.

- ``LAYERS`` lists the folders of ``webhook/`` from the top down (the top-level modules are the
  ground, ``"."``). A module may import its own folder and any folder on a lower layer; an import
  of a higher layer is an arrow that runs back up and fails, and so does an import between two
  folders of one layer (siblings stay unaware of each other). ``cli`` (the one module above the
  commands) is the only importer of ``commands``; ``localcluster`` sits under the commands it
  serves. A new folder fails until it is placed.
- ``CORE_FOLDERS`` are the pure core: a module there takes data in and gives data out. It imports
  no edge library (HTTP, the Kubernetes client, processes, the clock, randomness, the
  environment), no edge module of gpugate, and opens no file. Every other folder is an edge.
- A folder holding both kinds says which are the odd ones out, by name: ``EDGE_IN_CORE`` (the
  edge modules of a core folder) and ``CORE_IN_EDGE`` (the pure modules of an edge folder, checked
  for purity like any core module). A folder takes the kind most of its modules have (an even
  split takes edge), so the named list is the short one; a name that no longer exists fails.
  Moving the odd ones out would cut a folder along a line its readers do not look for (the
  replay's file readers beside its pure model, the balancer's plans beside its loops).

Outside the package: ``webhook/`` imports neither ``tests/`` nor ``benchmarks/`` (the product is
apart from its test rig), and ``tests/`` imports no ``benchmarks/`` module (a benchmark may use a
test helper, never the other way).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "webhook"
CORE, EDGE = "core", "edge"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),  # the entry point: names each command, imports one when it is run
    ("commands",),  # one CLI command per module: options in, a call of the layers below, text out
    ("localcluster", "offline"),  # a local control plane for `gpugate demo`; golden cases run on files
    ("server", "audit", "replay"),  # what runs the admission core: over HTTP, on a cluster, along a trace
    ("admission", "balancer"),  # the webhook's pure core; the node-load controller
    ("usage",),  # GPU accounting, which the balancer's idle reclaim reads
    ("policy", "stack"),  # the GPUPolicy model; the GPU stack's lifecycle
    ("placement", "certs"),  # placement scores; the TLS material
    ("kube",),  # Kubernetes' own rules: quantities, GPU resources, a pod's demand
    (".",),  # the top-level modules: errors, names, durations, logs, the Kubernetes client, leases
)
"""Folders from the top down; a tuple holds the siblings of one layer."""

CORE_FOLDERS = {"admission", "placement", "usage", "kube", "policy", "replay"}
EDGE_IN_CORE = {
    "kube": {"documents"},  # reads YAML and JSON documents from files and stdin
    "policy": {"loading", "store"},  # reads a policy folder; watches it
    # read the trace's files, run the arms in worker processes, time and print the runs
    "replay": {"trace", "report", "runner", "sizing", "admitting", "timeline", "timelinereport"},
}
CORE_IN_EDGE = {
    ".": {"errors", "names", "kubetarget", "durations"},
    "server": {"framing", "outcome"},
    "audit": {"findings"},
    "localcluster": {"kubeletobjects", "webhooks"},
    "balancer": {"state", "backoff", "placementfeed", "healthpolicy", "healthschema", "healthsignals", "quarantine",
                 "quarantineledger", "quarantineplan", "quarantinereport", "moveplan"},
    "stack": {"compat", "plan", "model", "chartcheck", "checks", "releases", "messages", "rollback", "canary",
              "change", "clusterstate", "hardening", "nodestates", "consumers", "crdstate", "hardware",
              "dracutover", "canarymodes"},
}

FORBIDDEN_LIBRARIES = ("flask", "werkzeug", "kubernetes", "gunicorn", "requests", "urllib3", "subprocess",
                       "socket", "http", "ssl", "os", "time", "random", "threading", "multiprocessing",
                       "prometheus_client", "click", "shutil", "tempfile")
FILE_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "glob", "rglob"}
# Core modules that read their own package data through importlib.resources (never a user's file).
PACKAGE_DATA_READERS = {"webhook.policy.parsing"}
TEST_RIG = ("tests", "benchmarks")


def module_name(folder: str, stem: str) -> str:
    parts = ["webhook"] + ([] if folder == "." else folder.split("/")) + ([] if stem == "__init__" else [stem])
    return ".".join(parts)


@cache
def package_folders() -> frozenset[str]:
    """Every folder of ``webhook/`` that is a package, relative to it (``"."`` is the package itself)."""
    return frozenset(str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py"))


def folder_of(module: str) -> str:
    """The rule a module answers to: its folder, or ``cli`` for the entry point above the commands."""
    parts = module.split(".")[1:]
    if parts == ["cli"]:
        return "cli"
    folders = package_folders()
    for length in range(len(parts), 0, -1):
        if "/".join(parts[:length]) in folders:
            return "/".join(parts[:length])
    return "."


def layer_of(module: str) -> str:
    folder, stem = folder_of(module), module.split(".")[-1]
    if module_path(module).name == "__init__.py":
        return CORE  # a package's face: it only hands names on
    if folder in CORE_FOLDERS:
        return EDGE if stem in EDGE_IN_CORE.get(folder, set()) else CORE
    return CORE if stem in CORE_IN_EDGE.get(folder, set()) else EDGE


@cache
def placed() -> dict[str, str]:
    """Every module of the package with its layer, read from its folder."""
    found = {}
    for folder in package_folders():
        directory = PACKAGE if folder == "." else PACKAGE / folder
        for path in directory.glob("*.py"):
            name = module_name(folder, path.stem)
            found[name] = layer_of(name)
    return found


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
            folder = ROOT.joinpath(*node.module.split("."))
            if not all((folder / f"{alias.name}.py").is_file() for alias in node.names):
                found.add(node.module)
    return found


CORE_MODULES = sorted(name for name, layer in placed().items() if layer == CORE)


def rank(folder: str) -> tuple[int, int]:
    """(layer from the top, place among its siblings); KeyError names a folder no layer holds."""
    for depth, siblings in enumerate(LAYERS):
        if folder in siblings:
            return depth, siblings.index(folder)
    raise KeyError(folder)


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a higher layer's folder, or of a sibling folder on the same layer."""
    found = []
    for module, imports in sorted(graph.items()):
        mine = folder_of(module)
        for imported in sorted(imports):
            theirs = folder_of(imported)
            if theirs == mine:
                continue
            if rank(theirs)[0] < rank(mine)[0]:
                found.append(f"{module} -> {imported} (webhook/{theirs} is on a higher layer than webhook/{mine})")
            elif rank(theirs)[0] == rank(mine)[0]:
                found.append(f"{module} -> {imported} (webhook/{theirs} and webhook/{mine} are siblings)")
    return found


def test_every_folder_is_on_one_layer() -> None:
    listed = [folder for siblings in LAYERS for folder in siblings]
    assert len(listed) == len(set(listed)), "a folder is on two layers"
    missing = sorted(package_folders() - set(listed))
    assert not missing, f"place the folders {missing} on a layer of LAYERS"
    gone = sorted(set(listed) - package_folders() - {"cli"})
    assert not gone, f"LAYERS names {gone}, which are no package folders"


def test_the_odd_modules_named_exist_and_sit_in_a_folder_of_the_other_kind() -> None:
    assert not set(EDGE_IN_CORE) - CORE_FOLDERS, "EDGE_IN_CORE names an edge folder"
    assert not set(CORE_IN_EDGE) & CORE_FOLDERS, "CORE_IN_EDGE names a core folder"
    for folder, stems in {**EDGE_IN_CORE, **CORE_IN_EDGE}.items():
        directory = PACKAGE if folder == "." else PACKAGE / folder
        stale = sorted(s for s in stems if not (directory / f"{s}.py").is_file())
        assert not stale, f"webhook/{folder}: {stale} do not exist; take them off the list"


def test_no_arrow_runs_up_the_layers() -> None:
    found = arrows_up(import_graph())
    assert not found, "imports against LAYERS (a lower layer imports none above it):\n" + "\n".join(found)


def test_the_layer_check_refuses_an_arrow_up_and_a_sideways_one() -> None:
    made_up = {"webhook.localcluster.demo": {"webhook.commands.smoke", "webhook.server.probe"},
               "webhook.server.routes": {"webhook.replay.runner", "webhook.admission.chain"},
               "webhook.kube.pods": {"webhook.names"}}
    assert arrows_up(made_up) == [
        "webhook.localcluster.demo -> webhook.commands.smoke "
        "(webhook/commands is on a higher layer than webhook/localcluster)",
        "webhook.server.routes -> webhook.replay.runner (webhook/replay and webhook/server are siblings)"]


def test_only_the_entry_point_imports_a_command() -> None:
    importers = sorted(m for m, imports in import_graph().items() if folder_of(m) not in ("cli", "commands")
                       and any(folder_of(i) == "commands" for i in imports))
    assert not importers, f"{importers} import webhook.commands; move what they share below the commands"


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


def test_the_folder_says_the_layer() -> None:
    assert (layer_of("webhook.admission.mutation"), layer_of("webhook.kube.documents")) == (CORE, EDGE)
    assert (layer_of("webhook.server.routes"), layer_of("webhook.server.framing")) == (EDGE, CORE)
    assert (layer_of("webhook.errors"), layer_of("webhook.cli"), layer_of("webhook.balancer")) == (CORE, EDGE, CORE)
    assert folder_of("webhook.cli") == "cli" and folder_of("webhook.lease") == "."


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os.path\nfrom kubernetes import client\nfrom . import x\n")
    assert imported_modules(sample) == {"os.path", "kubernetes", "kubernetes.client"}


def rig_imports(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    """``path -> module`` for each import, in the Python files under ``folder``, of a top-level
    package in ``forbidden``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for imported in sorted(imported_modules(path)):
            if imported.split(".")[0] in forbidden:
                found.append(f"{path.relative_to(folder.parent)} -> {imported}")
    return found


@pytest.mark.parametrize(("folder", "forbidden"), [("webhook", TEST_RIG), ("tests", ("benchmarks",))])
def test_the_product_and_the_tests_import_no_benchmark(folder: str, forbidden: tuple[str, ...]) -> None:
    found = rig_imports(ROOT / folder, forbidden)
    assert not found, (f"{folder}/ imports {forbidden}: move what they share into the importer's side "
                       f"(a test helper, or webhook/ if it is product code): {found}")


def test_the_rig_check_sees_a_benchmark_import(tmp_path: Path) -> None:
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "tests" / "e2e" / "test_x.py").write_text("import benchmarks.chaos\nfrom tests import clock\n")
    assert rig_imports(tmp_path / "tests", ("benchmarks",)) == ["tests/e2e/test_x.py -> benchmarks.chaos"]


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
