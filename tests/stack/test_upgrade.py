"""`gpugate stack plan|upgrade|promote|rollback` on a real git repository in a temp folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.kubefake import fake_kube  # noqa: F401 - pytest fixture
from tests.kubeversion import KUBERNETES_VERSION
from tests.stack.conftest import git, snapshot
from webhook.cli import main
from webhook.stack import chartvalues, manifestcheck, manifests, upgrade, verify
from webhook.stack import plan as planning
from webhook.stack.gitrepo import Repo


def run(repo: Path, *args: str):
    result = CliRunner().invoke(main, ["stack", *args, "--repo", str(repo)], catch_exceptions=False)
    return result


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def committed_files(repo: Path, rev: str = "HEAD") -> list[str]:
    return sorted(git(repo, "show", "--name-only", "--format=", rev).split())


def message(repo: Path, rev: str = "HEAD") -> str:
    return git(repo, "log", "-n1", "--format=%B", rev)


def stack_yaml(repo: Path) -> dict:
    return yaml.safe_load((repo / manifests.STACK_FILE).read_text())


def pools(repo: Path) -> dict[str, str]:
    return {p["name"]: p["driver"] for p in stack_yaml(repo)["pools"]}


def assert_renders_and_validates(repo: Path, shared: Path | None) -> None:
    """The committed manifests render with kubectl kustomize and validate as the tool's own check does."""
    declared = stack_yaml(repo)
    objects = manifestcheck.kustomize(repo / manifests.DRIVERS_DIR)
    minor = int(declared["cluster"]["kubernetesVersion"].split(".")[1])
    checks = verify.rendered_drivers(manifests.read_files(repo), kubernetes_minor=minor,
                                     schema_root=shared / "schemas" if shared else None)
    assert all(c.ok for c in checks), checks
    if shared and objects:
        assert "against the CRD nvidia.com_nvidiadrivers.yaml" in checks[-1].reason
    values = yaml.safe_load((repo / manifests.VALUES_FILE).read_text())
    assert chartvalues.unknown_keys(values, declared["operator"]["version"]) == []
    app = yaml.safe_load((repo / manifests.ARGO_APP_FILE).read_text())
    chart = [s for s in app["spec"]["sources"] if s.get("chart") == "gpu-operator"][0]
    assert chart["targetRevision"] == declared["operator"]["version"]
    crs = {p.get("crName", p["name"]): p["driver"] for p in declared["pools"]}
    if declared["driver"]["management"] == "nvidiadriver":
        assert {o["metadata"]["name"]: o["spec"]["version"] for o in objects} == crs
    else:
        assert objects == [] and values["driver"]["version"] == declared["pools"][0]["driver"]


# ---------------------------------------------------------------------------- happy paths


def test_operator_upgrade_commits_exactly_the_pinned_files_with_a_structured_message(stack_repo, set_stack,
                                                                                     shared_or_none):
    set_stack(operator_version="v26.3.3", management="clusterpolicy",
              pools={"default": {"driver": "580.126.20"}}, message="stack at v26.3.3")
    before = head(stack_repo)
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "595.91.07")
    assert result.exit_code == 0, result.output
    assert git(stack_repo, "rev-parse", "HEAD~1").strip() == before
    assert committed_files(stack_repo) == sorted([manifests.STACK_FILE, manifests.VALUES_FILE, manifests.ARGO_APP_FILE])
    text = message(stack_repo)
    assert text.startswith("gpugate stack: upgrade gpu-operator v26.3.3 -> v26.7.0; driver 595.91.07 on pool default\n")
    assert "  operator: v26.3.3 -> v26.7.0\n" in text
    assert "  pool default: 580.126.20 -> 595.91.07\n" in text
    assert "Checks passed:\n  release-path: v26.3.3 -> v26.7.0 moves to the next release line v26.7" in text
    for name in ("kubernetes:", "driver-validated[default]:", "driver-mig-mixed[default]:", "values-keys:",
                 "drivers-render:", "drivers-valid:"):
        assert f"\n  {name}" in text, name
    assert text.rstrip().endswith(f"Gpugate-Stack-To: operator=v26.7.0 kubernetes={KUBERNETES_VERSION} "
                                  "management=clusterpolicy default=595.91.07")
    trailers = git(stack_repo, "log", "-n1", "--format=%(trailers:key=Gpugate-Stack,valueonly)").strip()
    assert trailers == "upgrade"
    diff = git(stack_repo, "diff", "HEAD~1", "--", manifests.VALUES_FILE)
    assert [line for line in diff.splitlines()
            if line.startswith(("+ ", "- ", "+\t", "-\t")) or line[:2] in ("+ ", "- ")] == [
        '-  version: "580.126.20"', '+  version: "595.91.07"']
    assert git(stack_repo, "status", "--porcelain") == ""
    assert_renders_and_validates(stack_repo, shared_or_none)


def test_driver_upgrade_of_every_pool_rewrites_each_nvidiadriver_and_still_validates(stack_repo, shared_or_none):
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "610.57.04")
    assert result.exit_code == 0, result.output
    assert committed_files(stack_repo) == sorted([
        manifests.STACK_FILE, manifests.VALUES_FILE,
        f"{manifests.DRIVERS_DIR}/default.yaml", f"{manifests.DRIVERS_DIR}/canary.yaml"])
    assert pools(stack_repo) == {"default": "610.57.04", "canary": "610.57.04"}
    assert_renders_and_validates(stack_repo, shared_or_none)


def test_plan_prints_every_check_and_the_commit_without_touching_the_repo(stack_repo):
    before = snapshot(stack_repo)
    result = run(stack_repo, "plan", "--operator", "v26.7.0", "--driver", "610.57.04", "--pool", "canary")
    assert result.exit_code == 0, result.output
    assert "PASS  pool-scope[canary]" in result.output and "FAIL" not in result.output
    assert "1. gpugate stack: upgrade driver 610.57.04 on pool canary  [this run]" in result.output
    assert "files: manifests/gpu-operator/drivers/canary.yaml, manifests/gpu-operator/stack.yaml" in result.output
    assert snapshot(stack_repo) == before
    data = json.loads(run(stack_repo, "plan", "--operator", "v26.7.0", "--driver", "610.57.04",
                          "--pool", "canary", "-o", "json").output)
    assert data["ok"] is True and data["commits"][0]["changes"] == ["pool canary: 595.91.07 -> 610.57.04"]
    assert {c["name"] for c in data["checks"]} >= {"release-path", "kubernetes", "driver-validated",
                                                   "driver-mig-mixed", "values-keys", "drivers-valid"}


# ---------------------------------------------------------------------------- one test per refusal rule


def _refused(repo: Path, args: list[str], check: str, says: str) -> None:
    before = snapshot(repo)
    for command in ("plan", "upgrade"):
        result = run(repo, command, *args)
        assert result.exit_code == 1, result.output
        assert f"FAIL  {check}" in result.output, result.output
        assert says in result.output, result.output
    assert snapshot(repo) == before


def test_refused_skipping_a_release_line(stack_repo, set_stack):
    set_stack(operator_version="v24.9.2", management="clusterpolicy", kubernetes_minor=31,
              pools={"default": {"driver": "550.144.03"}})
    _refused(stack_repo, ["--operator", "v25.10.1", "--kubernetes", "1.31"], "release-path",
             "v24.9.2 -> v25.10.1 skips release line(s) v25.3")


def test_refused_kubernetes_outside_the_targets_range(stack_repo):
    _refused(stack_repo, ["--operator", "v26.7.0", "--driver", "610.57.04", "--kubernetes", "1.32"],
             "kubernetes", "Kubernetes 1.32 is outside v26.7.0's supported range 1.33-1.36")


def test_refused_known_bad_driver_on_a_pool_mixing_mig_and_full_gpus(stack_repo, set_stack):
    set_stack(operator_version="v25.3.4", management="clusterpolicy",
              pools={"default": {"driver": "580.82.07", "mig_and_full_gpus": True}})
    _refused(stack_repo, ["--operator", "v25.3.4", "--driver", "570.158.01"], "driver-mig-mixed[default]",
             "driver 570.158.01 on pool default, which mixes MIG and full GPUs: pods stay Pending")


def test_refused_unvalidated_driver_unless_allowed_then_warned(stack_repo):
    _refused(stack_repo, ["--operator", "v26.7.0", "--driver", "590.48.01", "--pool", "canary"],
             "driver-validated[canary]", "outside v26.7.0's validated branches 610, 595, 580, 535")
    # 590.48.01 is also older than the shipped 595.91.07: a downgrade, accepted on purpose here
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "590.48.01", "--pool", "canary",
                 "--allow-unvalidated-driver", "--allow-driver-downgrade")
    assert result.exit_code == 0, result.output
    warned = ["pool canary: driver downgraded 595.91.07 -> 590.48.01 (--allow-driver-downgrade)",
              "pool canary: driver 590.48.01 is not validated for v26.7.0"]
    assert set(warned) <= set(_listed(result.output, "warnings:"))
    assert set(warned) <= set(_listed(message(stack_repo), "Warnings:"))


def _listed(text: str, header: str) -> list[str]:
    """The indented lines under ``header`` (the output's or the commit message's warnings)."""
    lines = text.splitlines()
    start = lines.index(header) + 1
    listed = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        listed.append(line.strip())
    return listed


def _cluster_policy(state: str, ready: str) -> dict:
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
            "spec": {}, "status": {"state": state, "conditions": [
                {"type": "Ready", "status": ready, "reason": "Reconciled" if ready == "True" else "OperandNotReady",
                 "message": "", "lastTransitionTime": "2026-08-21T10:00:00Z"}]}}


def test_moving_to_nvidiadriver_from_before_v26_7_0_plans_two_commits_and_makes_only_the_first(
        stack_repo, set_stack, shared_or_none, fake_kube):
    set_stack(operator_version="v26.3.3", management="clusterpolicy", pools={"default": {"driver": "580.126.20"}})
    args = ["--operator", "v26.7.0", "--driver-management", "nvidiadriver"]
    data = json.loads(run(stack_repo, "plan", *args, "-o", "json").output)
    assert [c["made_by_this_run"] for c in data["commits"]] == [True, False]
    assert data["commits"][0]["title"].endswith("(step 1 of 2)")
    assert data["commits"][1]["files"] == sorted([manifests.STACK_FILE, manifests.VALUES_FILE,
                                                  f"{manifests.DRIVERS_DIR}/default.yaml",
                                                  f"{manifests.DRIVERS_DIR}/kustomization.yaml"])
    result = run(stack_repo, "upgrade", *args)
    assert result.exit_code == 0, result.output
    assert "takes two commits" in result.output and "next: move the driver to NVIDIADriver" in result.output
    after_first = stack_yaml(stack_repo)
    assert after_first["operator"]["version"] == "v26.7.0"
    assert after_first["driver"]["management"] == "clusterpolicy"
    values = yaml.safe_load((stack_repo / manifests.VALUES_FILE).read_text())
    assert values["driver"]["nvidiaDriverCRD"]["enabled"] is False
    assert not (stack_repo / manifests.DRIVERS_DIR / "default.yaml").exists()
    assert "(step 1 of 2)" in message(stack_repo).splitlines()[0]
    # step 2 waits for step 1 to be synced healthy: refused while the ClusterPolicy is not ready
    plan = run(stack_repo, "plan", *args)
    assert plan.exit_code == 0 and "previous-step-healthy" in plan.output and "pass --kube" in plan.output
    fake_kube.put(_cluster_policy("notReady", "False"))
    before = snapshot(stack_repo)
    result = run(stack_repo, "upgrade", *args, "--server", fake_kube.url)
    assert result.exit_code == 1 and "FAIL  previous-step-healthy" in result.output
    assert "cluster-policy=notReady" in result.output and snapshot(stack_repo) == before
    fake_kube.put(_cluster_policy("ready", "True"))
    result = run(stack_repo, "upgrade", *args, "--server", fake_kube.url)
    assert result.exit_code == 0, result.output
    assert "PASS  previous-step-healthy" in result.output
    assert stack_yaml(stack_repo)["driver"]["management"] == "nvidiadriver"
    assert f"{manifests.DRIVERS_DIR}/default.yaml" in committed_files(stack_repo)
    assert_renders_and_validates(stack_repo, shared_or_none)


def test_refused_changing_driver_type_of_an_existing_nvidiadriver(stack_repo):
    text = (stack_repo / manifests.STACK_FILE).read_text()
    data = yaml.safe_load(text)
    data["pools"][1]["driverType"] = "vgpu"
    (stack_repo / manifests.STACK_FILE).write_text(yaml.safe_dump(data, sort_keys=False))
    git(stack_repo, "commit", "-q", "-am", "canary pool to vgpu (by hand)")
    _refused(stack_repo, ["--operator", "v26.7.0", "--driver", "610.57.04", "--pool", "canary"],
             "immutable-fields[canary]", "NVIDIADriver canary: driverType 'gpu' -> 'vgpu' is immutable")
    # the fix the message names: a new CR name; the old CR file goes, the new one comes
    data["pools"][1]["crName"] = "canary-vgpu"
    (stack_repo / manifests.STACK_FILE).write_text(yaml.safe_dump(data, sort_keys=False))
    git(stack_repo, "commit", "-q", "-am", "new CR name for the vgpu canary")
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "610.57.04", "--pool", "canary")
    assert result.exit_code == 0, result.output
    assert f"{manifests.DRIVERS_DIR}/canary-vgpu.yaml" in committed_files(stack_repo)
    assert not (stack_repo / manifests.DRIVERS_DIR / "canary.yaml").exists()


def test_refused_pool_upgrade_that_also_moves_the_operator(stack_repo, set_stack):
    set_stack(operator_version="v26.3.3")
    _refused(stack_repo, ["--operator", "v26.7.0", "--driver", "610.57.04", "--pool", "canary"], "pool-scope[canary]",
             "--operator v26.7.0 differs from the stack's v26.3.3; upgrade the operator for all pools first")


def test_refused_when_the_values_no_longer_match_the_chart(stack_repo):
    values = stack_repo / manifests.VALUES_FILE
    values.write_text(values.read_text().replace("  upgradeCRD: false\n", "  upgradeCRD: false\n  upgradeCrds: true\n"))
    git(stack_repo, "commit", "-q", "-am", "typo in values")
    _refused(stack_repo, ["--operator", "v26.7.0", "--driver", "610.57.04"], "values-keys", "operator.upgradeCrds")


def test_nothing_to_change_exits_1(stack_repo):
    result = run(stack_repo, "plan", "--operator", "v26.7.0")
    assert result.exit_code == 1 and "FAIL  changes" in result.output and "nothing to commit" in result.output


# ---------------------------------------------------------------------------- safety


def test_a_dirty_working_tree_is_refused(stack_repo):
    (stack_repo / manifests.VALUES_FILE).write_text((stack_repo / manifests.VALUES_FILE).read_text() + "# wip\n")
    before = snapshot(stack_repo)
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "610.57.04")
    assert result.exit_code == 1
    assert "uncommitted changes" in result.output and "values.yaml" in result.output
    assert snapshot(stack_repo) == before
    assert run(stack_repo, "rollback").exit_code == 1


def test_a_failure_after_the_first_file_is_written_leaves_the_repo_byte_identical(stack_repo):
    before = snapshot(stack_repo)
    request = planning.Request(operator="v26.7.0", driver="610.57.04")
    schema_root = verify.default_schema_root(stack_repo)
    prepared = upgrade.prepare_upgrade(stack_repo, request, schema_root=schema_root if schema_root.is_dir() else None)
    assert prepared.ok and len(prepared.changes) == 4
    written: list[str] = []

    def fail_after_first(path: str) -> None:
        written.append(path)
        assert (stack_repo / path).read_bytes() == prepared.changes[path]  # it really was written
        raise OSError("disk full (injected)")

    with pytest.raises(OSError, match="injected"):
        upgrade.execute(Repo(stack_repo), prepared, schema_root=None, after_write=fail_after_first)
    assert len(written) == 1
    assert snapshot(stack_repo) == before
    assert git(stack_repo, "status", "--porcelain") == ""


def test_a_failure_after_all_files_are_written_but_before_the_commit_restores_them(stack_repo):
    before = snapshot(stack_repo)
    prepared = upgrade.prepare_upgrade(stack_repo, planning.Request(operator="v26.7.0", driver="610.57.04"),
                                       schema_root=None)
    count = {"n": 0}

    def fail_on_last(path: str) -> None:
        count["n"] += 1
        if count["n"] == len(prepared.changes):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        upgrade.execute(Repo(stack_repo), prepared, schema_root=None, after_write=fail_on_last)
    assert snapshot(stack_repo) == before


# ---------------------------------------------------------------------------- canary, promote, rollback


def test_canary_then_promote_then_rollback_twice_steps_back_twice(stack_repo, shared_or_none):
    """The second rollback undoes the canary upgrade; it does not re-apply the promote."""
    base = head(stack_repo)
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "610.57.04", "--pool", "canary")
    assert result.exit_code == 0, result.output
    assert committed_files(stack_repo) == sorted([manifests.STACK_FILE, f"{manifests.DRIVERS_DIR}/canary.yaml"])
    assert pools(stack_repo) == {"default": "595.91.07", "canary": "610.57.04"}
    canary_sha = head(stack_repo)

    # No cluster here: the canary gate (tests/stack/test_canary.py) is skipped with --force, said in the commit.
    result = run(stack_repo, "promote", "--from", "canary", "--to", "all", "--force")
    assert result.exit_code == 0, result.output
    assert committed_files(stack_repo) == sorted([manifests.STACK_FILE, manifests.VALUES_FILE,
                                                  f"{manifests.DRIVERS_DIR}/default.yaml"])
    assert pools(stack_repo) == {"default": "610.57.04", "canary": "610.57.04"}
    assert "Gpugate-Stack: promote" in message(stack_repo)
    assert "promoted with --force: the canary gate" in message(stack_repo)
    promote_sha = head(stack_repo)

    result = run(stack_repo, "rollback")
    assert result.exit_code == 0, result.output
    assert f"rolls back: {promote_sha}" in result.output
    assert "PASS  driver-published[default]" in result.output and "cannot undo:" in result.output
    assert "pool default: 610.57.04 -> 595.91.07" in result.output
    assert pools(stack_repo) == {"default": "595.91.07", "canary": "610.57.04"}
    text = message(stack_repo)
    assert f"Gpugate-Reverts: {promote_sha}" in text and "Gpugate-Stack: rollback" in text
    assert "Cannot undo:\n  drivers are replaced through the same node-by-node upgrade state machine" in text

    result = run(stack_repo, "rollback", "-o", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["reverts"] == canary_sha and data["committed"] == head(stack_repo)
    assert pools(stack_repo) == {"default": "595.91.07", "canary": "595.91.07"}

    subjects = git(stack_repo, "log", "--format=%s", f"{base}..HEAD").splitlines()
    assert subjects == [
        "gpugate stack: rollback upgrade driver 610.57.04 on pool canary",
        "gpugate stack: rollback promote driver 610.57.04 from pool canary to all pools",
        "gpugate stack: promote driver 610.57.04 from pool canary to all pools",
        "gpugate stack: upgrade driver 610.57.04 on pool canary",
    ]
    actions = git(stack_repo, "log", "--format=%(trailers:key=Gpugate-Stack,valueonly)", f"{base}..HEAD").split()
    assert actions == ["rollback", "rollback", "promote", "upgrade"]
    # history only grows: the original commits are still ancestors of HEAD
    git(stack_repo, "merge-base", "--is-ancestor", promote_sha, "HEAD")
    assert_renders_and_validates(stack_repo, shared_or_none)
    # nothing left to step back to
    result = run(stack_repo, "rollback")
    assert result.exit_code == 1 and "rolled back already" in result.output


def test_three_rollbacks_step_back_past_a_kubernetes_only_commit_and_say_why(stack_repo):
    """A rollback picked a commit changing only cluster.kubernetesVersion (which a rollback
    keeps), failed with "nothing to commit", and picked it again every time."""
    assert run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "610.57.04",
               "--pool", "canary").exit_code == 0
    canary_sha = head(stack_repo)
    assert run(stack_repo, "promote", "--from", "canary", "--to", "all", "--force").exit_code == 0
    promote_sha = head(stack_repo)
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--kubernetes", "1.35")
    assert result.exit_code == 0, result.output
    kubernetes_sha = head(stack_repo)
    assert stack_yaml(stack_repo)["cluster"]["kubernetesVersion"] == "1.35"

    first = run(stack_repo, "rollback")
    assert first.exit_code == 0, first.output
    assert f"rolls back: {promote_sha}" in first.output
    assert (f"chosen: {promote_sha[:12]} (gpugate stack: promote driver 610.57.04 from pool canary to all pools): "
            f"the newest stack commit not rolled back yet; passed over {kubernetes_sha[:12]}") in first.output
    assert "changes only cluster.kubernetesVersion, which a rollback keeps" in first.output
    assert "Chosen: " in message(stack_repo)
    assert pools(stack_repo) == {"default": "595.91.07", "canary": "610.57.04"}
    assert stack_yaml(stack_repo)["cluster"]["kubernetesVersion"] == "1.35"  # the cluster keeps its minor

    second = run(stack_repo, "rollback", "-o", "json")
    assert second.exit_code == 0, second.output
    data = json.loads(second.output)
    assert data["reverts"] == canary_sha
    assert f"{promote_sha[:12]} (gpugate stack: promote driver 610.57.04 from pool canary to all pools): rolled " \
           f"back by" in data["revertsWhy"] and kubernetes_sha[:12] in data["revertsWhy"]
    assert pools(stack_repo) == {"default": "595.91.07", "canary": "595.91.07"}

    third = run(stack_repo, "rollback")
    assert third.exit_code == 1
    assert "nothing further to step back to" in third.output and "nothing to commit" not in third.output
    assert f"{kubernetes_sha[:12]} (gpugate stack: upgrade" in third.output


def test_rollback_skips_ordinary_commits_and_reverts_the_newest_stack_commit(stack_repo):
    assert run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "610.57.04",
               "--pool", "canary").exit_code == 0
    upgrade_sha = head(stack_repo)
    (stack_repo / "README.md").write_text("unrelated\n")
    git(stack_repo, "add", "README.md")
    git(stack_repo, "commit", "-q", "-m", "docs")
    result = run(stack_repo, "rollback")
    assert result.exit_code == 0, result.output
    assert f"rolls back: {upgrade_sha}" in result.output
    assert pools(stack_repo)["canary"] == "595.91.07" and (stack_repo / "README.md").exists()


def test_rollback_of_an_operator_upgrade_runs_the_checks_and_refuses_a_silent_downgrade(stack_repo, set_stack):
    """Rolling back v26.3.3 -> v26.7.0 downgrades the operator and its CRDs: refused unless
    --allow-operator-downgrade, and then said in the commit."""
    set_stack(operator_version="v26.3.3", management="clusterpolicy", pools={"default": {"driver": "580.126.20"}})
    values = stack_repo / manifests.VALUES_FILE
    values.write_text(values.read_text().replace("    scrapeTimeout: 10s\n", ""))  # a v26.7.0-only key
    git(stack_repo, "commit", "-q", "-am", "values that both charts know")
    assert run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "595.91.07").exit_code == 0
    before = snapshot(stack_repo)
    result = run(stack_repo, "rollback")
    assert result.exit_code == 1, result.output
    assert "FAIL  rollback-path" in result.output and "--allow-operator-downgrade" in result.output
    assert "PASS  kubernetes" in result.output and "driver-published[default]" in result.output
    assert snapshot(stack_repo) == before
    result = run(stack_repo, "rollback", "--allow-operator-downgrade")
    assert result.exit_code == 0, result.output
    assert "PASS  values-keys" in result.output and "exists in chart v26.3.3" in result.output
    assert stack_yaml(stack_repo)["operator"]["version"] == "v26.3.3"
    assert pools(stack_repo) == {"default": "580.126.20"}
    text = message(stack_repo)
    assert "Cannot undo:\n  gpu-operator v26.7.0 -> v26.3.3 is a downgrade" in text
    assert "the CRDs go back too" in text and "--include-crds" in text
    assert "gpu-operator is downgraded v26.7.0 -> v26.3.3 (--allow-operator-downgrade)" in text


def test_rollback_refuses_a_version_the_driver_check_refuses(stack_repo):
    """The rollback target is checked like an upgrade: a driver that is not a published image is refused."""
    data = stack_yaml(stack_repo)
    data["pools"][1]["driver"] = "595.91.7"
    (stack_repo / manifests.STACK_FILE).write_text(yaml.safe_dump(data, sort_keys=False))
    git(stack_repo, "commit", "-q", "-am", "a hand edit outside the tool, with an unpadded version")
    result = run(stack_repo, "sync", "--allow-unlisted-driver")
    assert result.exit_code == 0, result.output
    assert run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "610.57.04", "--pool",
               "canary").exit_code == 0
    before = snapshot(stack_repo)
    result = run(stack_repo, "rollback")
    assert result.exit_code == 1 and "FAIL  driver-published[canary]" in result.output, result.output
    assert "did you mean 595.91.07?" in result.output and snapshot(stack_repo) == before


def test_rollback_without_a_stack_commit_says_so(stack_repo):
    result = run(stack_repo, "rollback")
    assert result.exit_code == 1 and "no stack commit to roll back" in result.output


def test_promote_refuses_a_known_bad_driver_for_a_mixed_mig_pool(stack_repo, set_stack):
    set_stack(operator_version="v26.7.0", pools={"canary": {"driver": "570.158.01", "mig_and_full_gpus": False}})
    before = snapshot(stack_repo)
    result = run(stack_repo, "promote", "--from", "canary", "--to", "default", "--allow-unvalidated-driver")
    assert result.exit_code == 1
    assert "FAIL  driver-mig-mixed[default]" in result.output and "mixes MIG and full GPUs" in result.output
    assert snapshot(stack_repo) == before


# ---------------------------------------------------------------------------- sync (hand edits of stack.yaml)


def _edit_stack(repo: Path, change) -> None:
    data = stack_yaml(repo)
    change(data)
    (repo / manifests.STACK_FILE).write_text(yaml.safe_dump(data, sort_keys=False))


def test_sync_commits_a_paused_canary_pool_with_its_nvidiadriver(stack_repo, shared_or_none):
    _edit_stack(stack_repo, lambda d: d["pools"][1]["upgradePolicy"].update(autoUpgrade=False))
    check = run(stack_repo, "sync", "--check")
    assert check.exit_code == 0, check.output
    assert "files: manifests/gpu-operator/drivers/canary.yaml, manifests/gpu-operator/stack.yaml" in check.output
    result = run(stack_repo, "sync")
    assert result.exit_code == 0, result.output
    assert committed_files(stack_repo) == sorted([manifests.STACK_FILE, f"{manifests.DRIVERS_DIR}/canary.yaml"])
    canary = yaml.safe_load((stack_repo / manifests.DRIVERS_DIR / "canary.yaml").read_text())
    assert canary["spec"]["upgradePolicy"]["autoUpgrade"] is False
    assert "Gpugate-Stack: sync" in message(stack_repo)
    assert git(stack_repo, "status", "--porcelain") == ""
    assert_renders_and_validates(stack_repo, shared_or_none)


def test_sync_applies_the_upgrade_rules_to_a_hand_edit(stack_repo):
    _edit_stack(stack_repo, lambda d: d["pools"][0].update(driver="570.148.08"))
    before = snapshot(stack_repo)
    result = run(stack_repo, "sync", "--allow-unvalidated-driver")
    assert result.exit_code == 1
    assert "FAIL  driver-mig-mixed[default]" in result.output
    assert snapshot(stack_repo) == before  # the user's edit is still there, nothing else changed


def test_sync_refuses_other_uncommitted_changes(stack_repo):
    _edit_stack(stack_repo, lambda d: d["pools"][1]["upgradePolicy"].update(autoUpgrade=False))
    derived = stack_repo / manifests.DRIVERS_DIR / "canary.yaml"
    derived.write_text(derived.read_text() + "# wip\n")
    result = run(stack_repo, "sync")
    assert result.exit_code == 1 and "uncommitted changes" in result.output and "canary.yaml" in result.output
    assert "stack.yaml" not in result.output.split("uncommitted changes")[1].split(")")[0]


def test_sync_commits_a_hand_edit_of_values_yaml_and_checks_it(stack_repo):
    """values.yaml is edited by hand (its keys beyond those stack.yaml derives); sync commits it
    after the same checks, and says what the edit drops (here NVIDIA's device hardening)."""
    values = stack_repo / manifests.VALUES_FILE
    values.write_text(values.read_text().replace("value: volume-mounts", "value: envvar"))
    result = run(stack_repo, "sync")
    assert result.exit_code == 0, result.output
    assert "device-hardening" in result.output and "DEVICE_LIST_STRATEGY='envvar'" in result.output
    assert git(stack_repo, "status", "--porcelain").strip() == ""
    assert "value: envvar" in git(stack_repo, "show", "HEAD:" + manifests.VALUES_FILE)
    assert manifests.VALUES_FILE in git(stack_repo, "show", "--name-only", "--format=", "HEAD").split()


@pytest.mark.parametrize(("args", "says"), [
    (["--operator", "26.7"], "vYY.MM.PP"),
    (["--operator", "v26.7.0", "--kubernetes", "133"], "1.NN"),
    (["--operator", "v26.7.0", "--driver", "latest"], "NNN.NN.NN"),
])
def test_a_malformed_version_is_a_usage_error(stack_repo, args, says):
    result = run(stack_repo, "plan", *args)
    assert result.exit_code == 2 and says in result.output


# ------------------------------------------------------------ sync adds a pool; unlisted drivers


def test_sync_adds_a_pool_with_its_nvidiadriver(stack_repo, shared_or_none):
    """docs/stack.md says `sync` can add a pool: it crashed on the pool HEAD's stack.yaml does not have."""
    def add(data: dict) -> None:
        data["pools"].append(dict(data["pools"][1], name="a100", nodeSelector={"gpugate.io/driver-pool": "a100"},
                                  driver="580.173.02"))
    _edit_stack(stack_repo, add)
    result = run(stack_repo, "sync")
    assert result.exit_code == 0, result.output
    assert "PASS  driver-published[a100]" in result.output
    assert committed_files(stack_repo) == sorted([manifests.STACK_FILE, f"{manifests.DRIVERS_DIR}/a100.yaml",
                                                  manifests.DRIVERS_KUSTOMIZATION])
    assert message(stack_repo).startswith("gpugate stack: sync add pool a100 (driver 580.173.02)\n")
    assert "  pool a100: (none) -> 580.173.02\n" in message(stack_repo)
    assert_renders_and_validates(stack_repo, shared_or_none)


@pytest.mark.parametrize("driver", ["595.99.99", "595.91.7"])
def test_an_unlisted_driver_needs_the_override_and_the_commit_says_so(stack_repo, driver):
    _refused(stack_repo, ["--operator", "v26.7.0", "--driver", driver, "--pool", "canary"],
             "driver-published[canary]", "not in the list of published driver images")
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", driver, "--pool", "canary",
                 "--allow-unlisted-driver")
    assert result.exit_code == 0, result.output
    said = (f"pool canary: driver {driver} is not a listed published image; committed with "
            f"--allow-unlisted-driver")
    assert any(line.startswith(said) for line in _listed(message(stack_repo), "Warnings:"))


def test_a_bare_branch_without_precompiled_images_is_refused_even_with_the_override(stack_repo):
    result = run(stack_repo, "plan", "--operator", "v26.7.0", "--driver", "610", "--pool", "canary",
                 "--allow-unlisted-driver", "--allow-unvalidated-driver")
    assert result.exit_code == 1 and "FAIL  driver-published[canary]" in result.output
    assert "bare branch" in result.output


# ------------------------------------------------------------ downgrades, no phantom commits, no extra


def test_upgrade_to_an_older_driver_is_refused_as_a_downgrade_then_committed_as_one(stack_repo):
    """610.57.04 -> 595.91.07 passed every check and was committed as an "upgrade"."""
    assert run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", "610.57.04").exit_code == 0
    args = ["--operator", "v26.7.0", "--driver", "595.91.07"]
    _refused(stack_repo, args, "driver-path[default]", "610.57.04 -> 595.91.07 on pool default is a downgrade")
    result = run(stack_repo, "plan", *args)
    title = "downgrade driver 595.91.07 on pools default, canary (from 610.57.04)"
    assert result.output.startswith(f"plan: {title}\n") and "pass --allow-driver-downgrade" in result.output
    result = run(stack_repo, "upgrade", *args, "--allow-driver-downgrade")
    assert result.exit_code == 0, result.output
    assert f"committed {head(stack_repo)[:12]}: gpugate stack: {title}" in result.output
    text = message(stack_repo)
    assert text.startswith(f"gpugate stack: {title}\n")
    assert "  pool default: driver downgraded 610.57.04 -> 595.91.07 (--allow-driver-downgrade)" in text
    assert pools(stack_repo) == {"default": "595.91.07", "canary": "595.91.07"}


def test_a_failed_plan_lists_no_commit(stack_repo):
    """A failed plan printed "FAIL changes ... nothing to commit" right above "commits (1): ... [this run]"."""
    result = run(stack_repo, "plan", "--operator", "v26.7.0", "--driver", "595.91.07")
    assert result.exit_code == 1
    assert "FAIL  changes" in result.output and "nothing to commit" in result.output
    assert "commits: none (a check failed)" in result.output
    assert "[this run]" not in result.output and "commits (" not in result.output
    data = json.loads(run(stack_repo, "plan", "--operator", "v26.7.0", "--driver", "595.91.07", "-o", "json").output)
    assert data["ok"] is False and data["commits"] == []


def test_plan_runs_without_kubernetes_validate_and_shows_the_check_skipped(stack_repo, monkeypatch):
    """On the quick start's install (no `stack` extra) `plan` failed drivers-valid;
    it now says what it would do and shows the schema check skipped with the install command.
    Committing still needs the extra, as docs/stack.md says."""
    monkeypatch.setitem(sys.modules, "kubernetes_validate", None)  # import kubernetes_validate fails
    args = ["--operator", "v26.7.0", "--driver", "610.57.04", "--pool", "canary"]
    result = run(stack_repo, "plan", *args)
    assert result.exit_code == 0, result.output
    assert "SKIP  drivers-valid" in result.output
    assert "kubernetes-validate is not installed; pip install 'gpugate[stack]'" in result.output
    assert "commits (1):" in result.output and "result: every check that ran passes; " in result.output
    assert "all checks pass" not in result.output  # one was skipped
    data = json.loads(run(stack_repo, "plan", *args, "-o", "json").output)
    assert [c.get("skipped") for c in data["checks"] if c["name"] == "drivers-valid"] == [True]
    before = snapshot(stack_repo)
    result = run(stack_repo, "upgrade", *args)
    assert result.exit_code == 1
    assert "FAIL  drivers-valid" in result.output and "pip install 'gpugate[stack]'" in result.output
    assert snapshot(stack_repo) == before
