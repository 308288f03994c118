"""The Lua health checks behave as documented when run the way argocd-cm runs them.

Every case of every ``health_test.yaml`` runs its ``health.lua`` in real Lua 5.1 with only
the libraries Argo CD opens for argocd-cm scripts (string/math only where the checked-in
patch sets useOpenLibs), and the checked-in argocd-cm patch is exactly what the generator
produces from the folders.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.gitops.luasandbox import HealthScriptError, run_health
from webhook.commands import argocd as argocd_cmd

REPO = Path(__file__).resolve().parents[2]
HEALTH_DIR = REPO / "argocd" / "health"
PATCH_FILE = REPO / "argocd" / "install" / "argocd-cm-health.yaml"
REQUIRED_KINDS = ("nvidia.com/ClusterPolicy", "nvidia.com/NVIDIADriver", "argoproj.io/Application",
                  "apiextensions.k8s.io/CustomResourceDefinition")


def _patch_data() -> dict[str, str]:
    return yaml.safe_load(PATCH_FILE.read_text())["data"]


def _block_kinds(glob: str) -> tuple[str, set[str]]:
    """``group/{A,B}`` (or ``group/A``) of the resource.customizations block: group and kinds."""
    group, _, kinds = glob.partition("/")
    return group, set(kinds.removeprefix("{").removesuffix("}").split(","))


def installed(group: str, kind: str) -> tuple[str, bool]:
    """The script the shipped argocd-cm patch runs for ``group/kind``, and its useOpenLibs: a split
    key first, then a block entry whose glob names the kind (the order of argo-cd util/lua/lua.go
    GetHealthScript)."""
    data = _patch_data()
    split = data.get(f"resource.customizations.health.{group}_{kind}")
    if split is not None:
        return split, data.get(f"resource.customizations.useOpenLibs.{group}_{kind}") == "true"
    for glob, entry in (yaml.safe_load(data.get("resource.customizations") or "{}") or {}).items():
        glob_group, kinds = _block_kinds(glob)
        if glob_group == group and kind in kinds:
            return entry["health.lua"], entry.get("health.lua.useOpenLibs") is True
    raise AssertionError(f"the argocd-cm patch has no health check for {group}/{kind}")


def _cases() -> list[tuple[str, Path, dict]]:
    cases = []
    for test_file in sorted(HEALTH_DIR.glob("*/*/health_test.yaml")):
        kind_dir = test_file.parent
        for case in yaml.safe_load(test_file.read_text())["tests"]:
            case_id = f"{kind_dir.parent.name}/{kind_dir.name}/{case['inputPath']}"
            cases.append((case_id, kind_dir, case))
    return cases


CASES = _cases()


def test_every_required_kind_has_a_tested_check():
    """ClusterPolicy, NVIDIADriver, Application and CustomResourceDefinition each have a script
    (their own or their group's) and cases."""
    for group_kind in REQUIRED_KINDS:
        kind_dir = HEALTH_DIR / group_kind
        assert (kind_dir / "health.lua").is_file() or (kind_dir.parent / "health.lua").is_file(), group_kind
        cases = yaml.safe_load((kind_dir / "health_test.yaml").read_text())["tests"]
        assert len(cases) >= 5, f"{group_kind}: too few cases"


@pytest.mark.parametrize(("case_id", "kind_dir", "case"), CASES, ids=[c[0] for c in CASES])
def test_health_case(case_id, kind_dir, case):
    """Each case yields exactly the expected status and message in the argocd-cm sandbox."""
    obj = yaml.safe_load((kind_dir / case["inputPath"]).read_text())
    assert obj["kind"] == kind_dir.name, "a fixture is an object of its folder's kind"
    script, open_libs = installed(kind_dir.parent.name, kind_dir.name)
    got = run_health(script, obj, open_libs=open_libs)
    expected = {"status": case["healthStatus"]["status"]}
    if case["healthStatus"].get("message"):
        expected["message"] = case["healthStatus"]["message"]
    assert got == expected


def test_testdata_files_are_all_used_and_named_for_their_verdict():
    """Every testdata file is a case, and its name starts with the expected status (argo-cd convention)."""
    for test_file in HEALTH_DIR.glob("*/*/health_test.yaml"):
        kind_dir = test_file.parent
        cases = yaml.safe_load(test_file.read_text())["tests"]
        used = {case["inputPath"] for case in cases}
        present = {f"testdata/{p.name}" for p in (kind_dir / "testdata").glob("*.yaml")}
        assert used == present, kind_dir
        for case in cases:
            prefix = Path(case["inputPath"]).name.split("_")[0]
            assert prefix == case["healthStatus"]["status"].lower(), case["inputPath"]


@pytest.mark.parametrize("kind", ["ClusterPolicy", "NVIDIADriver"])
def test_unexpected_state_is_unknown_not_a_crash(kind):
    """A state the CRD enum does not know is reported as Unknown with the state named."""
    script, _ = installed("nvidia.com", kind)
    got = run_health(script, {"kind": kind, "status": {"state": "rebooting"}}, open_libs=False)
    assert got == {"status": "Unknown", "message": f"{kind} reports an unexpected state: rebooting"}


def test_clusterpolicy_error_condition_false_does_not_degrade():
    """Only a True Error condition counts: the operator keeps a False one with reason Ready."""
    script, _ = installed("nvidia.com", "ClusterPolicy")
    obj = {"kind": "ClusterPolicy", "status": {"state": "notReady", "conditions": [
        {"type": "Error", "status": "False", "reason": "ReconcileFailed", "message": "old"}]}}
    assert run_health(script, obj, open_libs=False)["status"] == "Progressing"


@pytest.mark.parametrize(("state", "reason", "cluster_policy"), [
    ("disabled", "Reconciled", {"status": "Unknown", "message": "ClusterPolicy reports an unexpected state: disabled"}),
    ("notReady", "ConflictingNodeSelector",
     {"status": "Progressing", "message": "ClusterPolicy is not ready (ConflictingNodeSelector): m"}),
])
def test_what_only_an_nvidiadriver_writes_means_nothing_special_on_a_clusterpolicy(state, reason, cluster_policy):
    """The one nvidia.com script branches on obj.kind: ``disabled`` and ConflictingNodeSelector are
    NVIDIADriver writes (Suspended, Degraded); a ClusterPolicy is judged as before the two scripts
    were one (its own rules never name them)."""
    script, _ = installed("nvidia.com", "ClusterPolicy")
    status = {"state": state, "conditions": [{"type": "Error", "status": "True", "reason": reason, "message": "m"}]}
    assert run_health(script, {"kind": "ClusterPolicy", "status": status}, open_libs=False) == cluster_policy
    driver = run_health(script, {"kind": "NVIDIADriver", "status": status}, open_libs=False)
    assert driver["status"] == ("Suspended" if state == "disabled" else "Degraded")


def test_a_kind_the_nvidia_script_has_no_rules_for_is_unknown():
    script, _ = installed("nvidia.com", "ClusterPolicy")
    got = run_health(script, {"kind": "NVIDIADriverPool", "status": {"state": "ready"}}, open_libs=False)
    assert got == {"status": "Unknown",
                   "message": "gpugate's GPU Operator health check has no rules for kind NVIDIADriverPool"}


# --- CustomResourceDefinition: what the apiextensions-apiserver writes ----------------------

CRD_DIR = HEALTH_DIR / "apiextensions.k8s.io" / "CustomResourceDefinition"
APIEXTENSIONS = "staging/src/k8s.io/apiextensions-apiserver/pkg/"
CRD_WRITES = {
    # controller/status/naming_controller.go calculateNamesAndConditions
    ("NamesAccepted", "True", "NoConflicts"),
    *{("NamesAccepted", "False", reason) for reason in (
        "PluralConflict", "SingularConflict", "ShortNamesConflict", "KindConflict", "ListKindConflict")},
    ("Established", "False", "NotAccepted"),
    ("Established", "False", "Installing"),
    # controller/establish/establishing_controller.go sync
    ("Established", "True", "InitialNamesAccepted"),
    ("Established", "False", "InvalidCABundle"),
    # controller/nonstructuralschema/nonstructuralschema_controller.go calculateCondition
    ("NonStructuralSchema", "True", "Violations"),
    ("NonStructuralSchema", "Unknown", "StructuralError"),
    # registry/customresourcedefinition/etcd.go Delete; controller/finalizer/crd_finalizer.go sync
    ("Terminating", "True", "InstanceDeletionPending"),
    ("Terminating", "True", "InstanceDeletionInProgress"),
    ("Terminating", "True", "InstanceDeletionFailed"),
    ("Terminating", "True", "InstanceDeletionCheck"),
    ("Terminating", "False", "InstanceDeletionCompleted"),
    ("Terminating", "False", "NeverEstablished"),
    ("Terminating", "False", "OverlappingBuiltInResource"),
}
"""(type, status, reason) of every CRD condition the apiextensions-apiserver writes, transcribed
from kubernetes/kubernetes ``staging/src/k8s.io/apiextensions-apiserver/pkg/``: the naming
controller (``controller/status``), the establishing controller (``controller/establish``), the
NonStructuralSchema controller, the registry's Delete and the CRD finalizer."""


def _crd(name: str) -> dict:
    return yaml.safe_load((CRD_DIR / "testdata" / name).read_text())


def _crd_health(obj: dict) -> dict:
    return run_health((CRD_DIR / "health.lua").read_text(), obj, open_libs=False)


@pytest.mark.parametrize("path", sorted((CRD_DIR / "testdata").glob("*.yaml")), ids=lambda p: p.name)
def test_crd_fixtures_are_what_the_apiextensions_apiserver_writes(path):
    """Each fixture names the apiextensions-apiserver code that writes it (``# Written by:``, a path
    under staging/src/k8s.io/apiextensions-apiserver/pkg/) and carries only conditions it writes."""
    header = path.read_text().split("\napiVersion:")[0]
    assert header.startswith(f"# Written by: {APIEXTENSIONS}"), path.name
    cited = header.split()[3].removeprefix(APIEXTENSIONS)
    assert cited.startswith(("controller/status/", "controller/establish/", "controller/nonstructuralschema/",
                             "controller/finalizer/", "registry/customresourcedefinition/")), cited
    conditions = yaml.safe_load(path.read_text())["status"].get("conditions") or []
    for c in conditions:
        assert (c["type"], c["status"], c["reason"]) in CRD_WRITES, (path.name, c)
    assert len({c["type"] for c in conditions}) == len(conditions), "one condition per type (SetCRDCondition)"


def test_a_new_crd_goes_progressing_then_healthy_and_is_never_degraded():
    """The API server's writes for a new CRD, in order: the empty status of PrepareForCreate
    (registry/customresourcedefinition/strategy.go), the naming controller's NamesAccepted=True
    with Established=False/Installing (controller/status/naming_controller.go), the establishing
    controller's Established=True (controller/establish/establishing_controller.go). Argo CD
    v3.2.11's built-in check is Degraded on the second; ours is Progressing until the third."""
    seen = [_crd_health(_crd(name))["status"] for name in
            ("progressing_noConditions.yaml", "progressing_installing.yaml", "healthy_established.yaml")]
    assert seen == ["Progressing", "Progressing", "Healthy"]


@pytest.mark.parametrize("status", [
    None,
    {},
    {"conditions": []},
    {"conditions": [{"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"}]},
    {"conditions": [{"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                    {"type": "Established", "status": "Unknown"}]},
    {"conditions": [{"type": "NamesAccepted", "status": "Unknown"},
                    {"type": "Established", "status": "False", "reason": "Installing"}]},
    {"conditions": [{"type": "Established", "status": "False", "reason": "Installing"}]},
], ids=["no status", "empty status", "no conditions", "names only", "Established Unknown",
        "NamesAccepted Unknown", "Established only"])
def test_a_crd_not_established_yet_is_progressing(status):
    """Not Established (yet) and no condition saying why it never will be: Progressing, never
    Degraded, whatever part of the status is written (also states the API server does not write)."""
    obj = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "nvidiadrivers.nvidia.com"}}
    if status is not None:
        obj["status"] = status
    assert _crd_health(obj)["status"] == "Progressing"


def test_a_crd_marked_for_deletion_is_progressing_before_any_condition_says_so():
    """A deletionTimestamp alone is enough (Argo CD's built-in check does the same): the registry's
    Delete writes it with Terminating=True (registry/customresourcedefinition/etcd.go), and an
    object may show only the former; an Established=True does not make a terminating CRD Healthy."""
    obj = _crd("healthy_established.yaml")
    obj["metadata"]["deletionTimestamp"] = "2026-08-29T14:20:05Z"
    assert _crd_health(obj) == {"status": "Progressing", "message": "CRD is terminating"}


# --- the sandbox itself: it must be as strict as argocd-cm ------------------------------

STRING_FIND = 'if string.find("notReady", "Ready") then return {status = "Healthy"} end\nreturn {status = "Degraded"}\n'
STRING_METHOD = 'local s = "notReady"\nif s:find("Ready") then return {status = "Healthy"} end\nreturn {}\n'


@pytest.mark.parametrize("script", [STRING_FIND, STRING_METHOD], ids=["string.find", "s:find"])
def test_string_library_is_closed_without_use_open_libs(script):
    """A script using string.find fails without useOpenLibs and works with it."""
    with pytest.raises(HealthScriptError):
        run_health(script, {}, open_libs=False)
    assert run_health(script, {}, open_libs=True) == {"status": "Healthy"}


@pytest.mark.parametrize("name", ["io", "debug", "package", "require", "load", "loadstring", "dofile", "loadfile",
                                  "math"])
def test_unsafe_globals_are_absent(name):
    got = run_health(f'if {name} == nil then return {{status = "Healthy"}} end\nreturn {{status = "Degraded"}}',
                     {}, open_libs=False)
    assert got == {"status": "Healthy"}


def test_os_is_reduced_to_a_safe_subset():
    script = ('if os.time ~= nil and os.date ~= nil and os.execute == nil and os.remove == nil '
              'and os.getenv == nil then return {status = "Healthy"} end\nreturn {status = "Degraded"}')
    assert run_health(script, {}, open_libs=False) == {"status": "Healthy"}


def test_invalid_status_and_runaway_script_are_errors():
    with pytest.raises(HealthScriptError, match="invalid health status"):
        run_health('return {status = "Fine"}', {}, open_libs=False)
    with pytest.raises(HealthScriptError, match="timeout"):
        run_health("while true do end", {}, open_libs=False)


# --- the generated argocd-cm patch -----------------------------------------------------

def test_checked_in_patch_equals_generator_output():
    """argocd/install/argocd-cm-health.yaml is byte-for-byte what the generator makes now."""
    expected = argocd_cmd.render_health_patch(argocd_cmd.load_health_checks(HEALTH_DIR))
    assert PATCH_FILE.read_text() == expected, "run `gpugate argocd health-patch` and commit"


def test_patch_installs_each_script_verbatim_and_no_open_libs():
    """Each kind's script is installed as the file's text: a ``<Kind>/health.lua`` under its split
    key, the ``nvidia.com/health.lua`` once, in the block under a glob naming exactly the kind
    folders it serves; none of our scripts needs string/math."""
    data = _patch_data()
    assert len(sorted(HEALTH_DIR.glob("*/*/health.lua"))) == 2
    for path in sorted(HEALTH_DIR.glob("*/*/health.lua")):
        key = f"{path.parent.parent.name}_{path.parent.name}"
        assert data[f"resource.customizations.health.{key}"] == path.read_text()
    block = yaml.safe_load(data["resource.customizations"])
    assert block == {"nvidia.com/{ClusterPolicy,NVIDIADriver}": {
        "health.lua": (HEALTH_DIR / "nvidia.com" / "health.lua").read_text()}}
    assert not [k for k in data if k.startswith("resource.customizations.useOpenLibs.")]
    assert not [k for k in data if k.startswith("resource.customizations.health.nvidia.com")]


def _write_check(root: Path, group: str, kind: str, script: str) -> None:
    kind_dir = root / group / kind
    (kind_dir / "testdata").mkdir(parents=True)
    (kind_dir / "health.lua").write_text(script)
    (kind_dir / "testdata" / "healthy_any.yaml").write_text("kind: X\n")
    (kind_dir / "health_test.yaml").write_text(
        "tests:\n- healthStatus:\n    status: Healthy\n  inputPath: testdata/healthy_any.yaml\n")


def test_generator_sets_use_open_libs_only_for_scripts_that_need_it(tmp_path):
    """A string.find script gets useOpenLibs, a libs-free one does not; the sandbox agrees."""
    _write_check(tmp_path, "example.com", "Uses", STRING_FIND)
    _write_check(tmp_path, "example.com", "Method", STRING_METHOD)
    _write_check(tmp_path, "example.com", "Plain", '-- string.find in a comment only\nreturn {status = "Healthy"}\n')
    data = yaml.safe_load(argocd_cmd.render_health_patch(argocd_cmd.load_health_checks(tmp_path)))["data"]
    assert data["resource.customizations.useOpenLibs.example.com_Uses"] == "true"
    assert data["resource.customizations.useOpenLibs.example.com_Method"] == "true"
    assert "resource.customizations.useOpenLibs.example.com_Plain" not in data
    for kind in ("Uses", "Method", "Plain"):
        open_libs = data.get(f"resource.customizations.useOpenLibs.example.com_{kind}") == "true"
        script = data[f"resource.customizations.health.example.com_{kind}"]
        assert run_health(script, {}, open_libs=open_libs) == {"status": "Healthy"}


def test_a_group_script_goes_in_the_block_under_its_tested_kinds(tmp_path):
    """``<group>/health.lua`` serves the kind folders beside it that have no script of their own:
    one block entry whose glob names exactly those kinds; a kind with its own script keeps its
    split key; a kind folder without cases is refused."""
    _write_check(tmp_path, "example.com", "Own", 'return {status = "Healthy"}\n')
    for kind in ("Beta", "Alpha"):
        _write_check(tmp_path, "example.com", kind, "")
        (tmp_path / "example.com" / kind / "health.lua").unlink()
    (tmp_path / "example.com" / "health.lua").write_text(STRING_FIND)
    data = yaml.safe_load(argocd_cmd.render_health_patch(argocd_cmd.load_health_checks(tmp_path)))["data"]
    assert yaml.safe_load(data["resource.customizations"]) == {
        "example.com/{Alpha,Beta}": {"health.lua": STRING_FIND, "health.lua.useOpenLibs": True}}
    assert set(data) == {"resource.customizations", "resource.customizations.health.example.com_Own"}
    (tmp_path / "example.com" / "Gamma").mkdir()
    with pytest.raises(argocd_cmd.GpugateError, match="no health_test.yaml in Gamma"):
        argocd_cmd.load_health_checks(tmp_path)


def test_untested_script_is_refused(tmp_path):
    kind_dir = tmp_path / "example.com" / "Untested"
    kind_dir.mkdir(parents=True)
    (kind_dir / "health.lua").write_text("return {}\n")
    with pytest.raises(argocd_cmd.GpugateError, match="no health_test.yaml"):
        argocd_cmd.load_health_checks(tmp_path)


def test_cli_check_fails_on_drift_and_write_fixes_it(tmp_path):
    """`gpugate argocd health-patch --check` exits 1 on a stale file; without --check it rewrites it."""
    from webhook.cli import main

    out = tmp_path / "argocd-cm-health.yaml"
    out.write_text(PATCH_FILE.read_text().replace("CRD is established", "CRD is fine"))
    runner = CliRunner()
    args = ["argocd", "health-patch", "--health-dir", str(HEALTH_DIR), "--out", str(out)]
    stale = runner.invoke(main, [*args, "--check"])
    assert stale.exit_code == 1
    assert "out of date" in stale.output
    assert runner.invoke(main, args).exit_code == 0
    assert out.read_text() == PATCH_FILE.read_text()
    assert runner.invoke(main, [*args, "--check"]).exit_code == 0
