"""The preflight corpus: every real failure is flagged by the rule meant for it, every clean upgrade passes.

Each case (``tests/stack/preflight/<case>/``, format in ``preflight_corpus``) is planned by the same
pure planner ``gpugate stack plan --kube`` runs, with the recorded cluster as what ``--kube`` read.
A ``missed`` case is one nothing shows beforehand: it must plan clean, so the score cannot drift
either way without its case being rewritten. The score test counts both and prints them.
"""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from tests.prerequisites import needed
from tests.stack import preflight_corpus as corpus
from webhook.cli import main

CASES = corpus.cases()


@pytest.fixture(scope="module", autouse=True)
def chart_packages() -> None:
    needed(corpus.CHARTS, "NVIDIA's chart packages (the CRDs the recordings serve)")


def _failed(plan) -> list[str]:
    return [f"{c.label}: {c.reason}" for c in plan.checks if not c.ok]


@pytest.mark.parametrize("folder", CASES, ids=[p.name for p in CASES])
def test_each_case_comes_out_as_its_thread_says(folder) -> None:
    case = corpus.load(folder)
    assert case.data.get("source"), f"{case.name}: cite the public thread or release note it comes from"
    plan = corpus.plan(case)
    expect = case.expect
    if "flagged" in expect:
        hits = corpus.flagged_by(plan, expect["flagged"])
        assert hits, f"{case.name}: {expect['flagged']} did not report it; checks: " + "; ".join(
            f"{'PASS' if c.ok else 'FAIL'} {c.label}: {c.reason}" for c in plan.checks)
        assert all(h.reason and h.fix and h.source for h in hits), hits
    else:
        assert plan.ok, f"{case.name} ({'clean' if expect.get('clean') else 'missed'}) is blocked: {_failed(plan)}"
        assert not [c for c in plan.checks if corpus.reported(c) and c.name != "device-hardening"], \
            f"{case.name}: a rule reports it: {[c.label for c in plan.checks if corpus.reported(c)]}"


def score() -> tuple[int, int, int, int]:
    """(failures flagged, failure cases, clean cases blocked, clean cases)."""
    flagged = failures = blocked = clean = 0
    for folder in CASES:
        case = corpus.load(folder)
        plan = corpus.plan(case)
        if case.kind == "clean":
            clean += 1
            blocked += not plan.ok
        else:
            failures += 1
            name = case.expect.get("flagged")
            flagged += bool(name and corpus.flagged_by(plan, name))
    return flagged, failures, blocked, clean


def test_the_corpus_flags_nine_in_ten_real_failures_and_blocks_no_clean_upgrade(capsys) -> None:
    flagged, failures, blocked, clean = score()
    with capsys.disabled():
        print(f"\npreflight corpus: {flagged}/{failures} failure cases flagged ({100 * flagged / failures:.1f}%), "
              f"{blocked}/{clean} clean upgrades blocked")
    assert failures >= 20 and clean >= 5, (failures, clean)
    assert flagged / failures >= 0.9
    assert blocked == 0


def test_the_clean_cases_cover_a_release_move_the_driver_migration_and_a_label_only_change() -> None:
    changes = {folder.name: corpus.load(folder).data["change"] for folder in CASES
               if corpus.load(folder).kind == "clean"}
    assert any(c.get("upgrade", {}).get("operator") == "v26.7.0" for n, c in changes.items() if "263" in n)
    assert any(c.get("upgrade", {}).get("driverManagement") == "nvidiadriver" for c in changes.values())
    assert any(set((c.get("edit") or {}).get("pools", {}).get("default", {})) == {"labels"} for c in changes.values())


def test_stack_plan_reads_a_recorded_cluster_and_prints_each_failure_with_its_cause_and_fix(tmp_path) -> None:
    """The CLI path: ``gpugate stack plan --cluster-state FILE`` on the project's own stack.yaml, the
    recording of a case written out as ``kubectl get ... -o yaml`` would (a List)."""
    folder = corpus.CORPUS / "hostpath-dev-nvidia-agent"
    recorded = tmp_path / "cluster.yaml"
    recorded.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                        "items": corpus.recorded_objects(folder / "cluster.yaml")}))
    args = ["stack", "plan", "--repo", str(corpus.ROOT), "--operator", "v26.7.0", "--driver", "610.57.04",
            "--pool", "canary", "--skip-chart-render", "--cluster-state", str(recorded)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    failed = next(i for i, line in enumerate(lines) if line.strip().startswith("FAIL  gpu-consumers"))
    assert "pod ops/gpu-probe-0" in lines[failed] and "hostPath /dev/nvidia0" in lines[failed]
    assert lines[failed + 1].strip().startswith("fix: stop them on the reloaded nodes")
    assert "commits: none (a check failed)" in result.output
    assert CliRunner().invoke(main, [*args, "--kube"]).exit_code == 2, "a recording or the cluster, not both"
