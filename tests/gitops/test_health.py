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


def _open_libs(group: str, kind: str) -> bool:
    return _patch_data().get(f"resource.customizations.useOpenLibs.{group}_{kind}") == "true"


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
    """ClusterPolicy, NVIDIADriver, Application and CustomResourceDefinition each have a script and cases."""
    for group_kind in REQUIRED_KINDS:
        kind_dir = HEALTH_DIR / group_kind
        assert (kind_dir / "health.lua").is_file(), group_kind
        cases = yaml.safe_load((kind_dir / "health_test.yaml").read_text())["tests"]
        assert len(cases) >= 5, f"{group_kind}: too few cases"


@pytest.mark.parametrize(("case_id", "kind_dir", "case"), CASES, ids=[c[0] for c in CASES])
def test_health_case(case_id, kind_dir, case):
    """Each case yields exactly the expected status and message in the argocd-cm sandbox."""
    obj = yaml.safe_load((kind_dir / case["inputPath"]).read_text())
    script = (kind_dir / "health.lua").read_text()
    got = run_health(script, obj, open_libs=_open_libs(kind_dir.parent.name, kind_dir.name))
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
    script = (HEALTH_DIR / "nvidia.com" / kind / "health.lua").read_text()
    got = run_health(script, {"status": {"state": "rebooting"}}, open_libs=False)
    assert got == {"status": "Unknown", "message": f"{kind} reports an unexpected state: rebooting"}


def test_clusterpolicy_error_condition_false_does_not_degrade():
    """Only a True Error condition counts: the operator keeps a False one with reason Ready."""
    script = (HEALTH_DIR / "nvidia.com" / "ClusterPolicy" / "health.lua").read_text()
    obj = {"status": {"state": "notReady", "conditions": [
        {"type": "Error", "status": "False", "reason": "ReconcileFailed", "message": "old"}]}}
    assert run_health(script, obj, open_libs=False)["status"] == "Progressing"


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
    """Each data entry is the file's text; none of our scripts needs string/math."""
    data = _patch_data()
    scripts = sorted(HEALTH_DIR.glob("*/*/health.lua"))
    assert len(scripts) == 4
    for path in scripts:
        key = f"{path.parent.parent.name}_{path.parent.name}"
        assert data[f"resource.customizations.health.{key}"] == path.read_text()
    assert not [k for k in data if k.startswith("resource.customizations.useOpenLibs.")]


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
    out.write_text(PATCH_FILE.read_text().replace("ClusterPolicy is ready", "ClusterPolicy is fine"))
    runner = CliRunner()
    args = ["argocd", "health-patch", "--health-dir", str(HEALTH_DIR), "--out", str(out)]
    stale = runner.invoke(main, [*args, "--check"])
    assert stale.exit_code == 1
    assert "out of date" in stale.output
    assert runner.invoke(main, args).exit_code == 0
    assert out.read_text() == PATCH_FILE.read_text()
    assert runner.invoke(main, [*args, "--check"]).exit_code == 0
