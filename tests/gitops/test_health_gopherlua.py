"""Every health fixture judged by Argo CD itself: the built ``argocd`` binary and its gopher-lua.

``test_health.py`` runs the cases in C Lua 5.1 (lupa) for speed; Argo CD runs gopher-lua, whose
string library, number formatting and table semantics are its own. Here each case's input goes
through ``argocd admin settings resource-overrides health <file> --argocd-cm-path <argocd-cm>``
(argoproj/argo-cd ``cmd/argocd/commands/admin/settings.go``, ``NewResourceHealthCommand``: it
loads the scripts from the ConfigMap file, runs ``health.GetResourceHealth`` with
``lua.ResourceHealthOverrides`` and prints ``STATUS:`` and ``MESSAGE:``), with the argocd-cm
patch the project ships (``argocd/install/argocd-cm-health.yaml``, useOpenLibs included), and
must print exactly the status and message the case expects.

One thing the script-only runs could not show: Argo CD answers Progressing "Pending deletion" for
any object with a ``metadata.deletionTimestamp`` (and no hook finalizer) *before* it runs a health
script (gitops-engine ``pkg/health/health.go`` ``GetResourceHealth``). ``health_test.yaml`` (Argo
CD's own format, whose upstream runner calls the script directly) records the script's verdict,
so a case whose input is being deleted runs twice here: as it is, Argo CD must say "Pending
deletion" (what a person sees); without the deletionTimestamp, gopher-lua must give the case's
verdict (the script's branch for its conditions).

The binary is the one ``python -m tests.e2e.gitops_binaries build`` caches (``.ci/run`` builds
it); without it the test skips and says so, under ``CI`` it fails.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from tests.gitops.test_health import CASES, PATCH_FILE, installed
from tests.prerequisites import missing

BUILD = "`python -m tests.e2e.gitops_binaries build` builds it from github.com/argoproj/argo-cd/v3"
PENDING_DELETION = {"status": "Progressing", "message": "Pending deletion"}
"""gitops-engine pkg/health/health.go GetResourceHealth, for an object with a deletionTimestamp."""


def argocd_binary() -> Path:
    from tests.e2e import gitops_binaries

    path = gitops_binaries.binary_path(next(t for t in gitops_binaries.TOOLS if t.name == "argocd"))
    if not (path.is_file() and os.access(path, os.X_OK)):
        missing(f"no argocd binary at {path}: {BUILD}")
    return path


def judge(argocd: Path, resource: Path) -> dict[str, str]:
    """Status and message as Argo CD computes them for ``resource`` with the shipped argocd-cm."""
    done = subprocess.run(
        [str(argocd), "admin", "settings", "resource-overrides", "health", str(resource),
         "--argocd-cm-path", str(PATCH_FILE)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "ARGOCD_BINARY_NAME": "argocd"})
    assert done.returncode == 0, f"{resource}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    out = done.stdout
    assert out.startswith("STATUS: ") and "\nMESSAGE: " in out, f"{resource}: unexpected output\n{out}"
    status, _, message = out.removeprefix("STATUS: ").partition("\nMESSAGE: ")
    got = {"status": status}
    if message.removesuffix("\n"):
        got["message"] = message.removesuffix("\n")
    return got


def _runs(work_dir: Path) -> list[tuple[str, Path, dict[str, str]]]:
    """(what, input file, expected verdict) for every case; two runs for an object being deleted."""
    runs = []
    for case_id, kind_dir, case in CASES:
        health = case["healthStatus"]
        want = {"status": health["status"], **({"message": health["message"]} if health.get("message") else {})}
        source = kind_dir / case["inputPath"]
        obj = yaml.safe_load(source.read_text())
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            runs.append((f"{case_id} (as Argo CD shows it)", source, PENDING_DELETION))
            del obj["metadata"]["deletionTimestamp"]
            source = work_dir / f"{len(runs)}-{source.name}"
            source.write_text(yaml.safe_dump(obj))
            case_id += " (without its deletionTimestamp: the script's verdict)"
        runs.append((case_id, source, want))
    return runs


def test_argo_cds_own_lua_gives_every_fixture_its_expected_health() -> None:
    argocd = argocd_binary()
    with tempfile.TemporaryDirectory() as work_dir:
        runs = _runs(Path(work_dir))
        assert len(runs) >= len(CASES) >= 20
        # One process per case; a few at a time (each one loads the whole argocd binary).
        with ThreadPoolExecutor(4) as pool:
            verdicts = list(pool.map(lambda run: judge(argocd, run[1]), runs))
    wrong = [f"{what}:\n  want {want}\n  got  {got}"
             for (what, _, want), got in zip(runs, verdicts, strict=True) if got != want]
    assert not wrong, "Argo CD's gopher-lua disagrees with the fixtures:\n" + "\n".join(wrong)


def test_the_shipped_argocd_cm_configures_every_checked_kind() -> None:
    for _, kind_dir, _ in CASES:
        installed(kind_dir.parent.name, kind_dir.name)


def test_the_nvidia_glob_claims_no_other_kind(tmp_path: Path) -> None:
    """The block's ``nvidia.com/{ClusterPolicy,NVIDIADriver}`` is a glob Argo CD matches (the
    fixtures above get their verdicts through it); another kind of the group is not given the
    script (``nvidia.com/*`` would be)."""
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"apiVersion": "nvidia.com/v1", "kind": "NVIDIADriverPool",
                                     "metadata": {"name": "x"}, "status": {"state": "ready"}}))
    done = subprocess.run(
        [str(argocd_binary()), "admin", "settings", "resource-overrides", "health", str(other),
         "--argocd-cm-path", str(PATCH_FILE)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "ARGOCD_BINARY_NAME": "argocd"})
    assert "Health script is not configured for 'nvidia.com/NVIDIADriverPool'" in done.stdout + done.stderr
