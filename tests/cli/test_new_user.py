"""What a new user trips on: each check here failed, or said too little, before.

The CLI runs as a user runs it, on files in a temporary folder.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from webhook.admission import mutation
from webhook.cli import main
from webhook.errors import PolicyLoadError
from webhook.policy import loading
from webhook.policy.model import PolicySet
from webhook.policy.store import PolicyStore

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"


def run(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


# --- one rule for "servable" ------------------------------------------------------------

def test_policy_check_refuses_an_empty_folder_as_serve_does(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("no policies here\n")
    result = run("policy", "check", tmp_path)
    assert result.exit_code == 1, result.output
    assert "holds no GPUPolicy" in result.stderr and "--allow-empty-policies" in result.stderr
    refused = PolicyStore(tmp_path).check()
    assert not refused.loaded and refused.error in result.stderr  # the server's words, word for word
    allowed = run("policy", "check", tmp_path, "--allow-empty-policies")
    assert allowed.exit_code == 0 and "0 policies valid" in allowed.stdout
    assert PolicyStore(tmp_path, allow_empty=True).check().loaded


def test_policy_check_passes_exactly_what_the_store_loads(tmp_path: Path) -> None:
    shutil.copy(POLICIES / "training.yaml", tmp_path / "training.yaml")
    result = run("policy", "check", tmp_path)
    assert result.exit_code == 0 and "1 policy valid" in result.stdout, result.output
    assert PolicyStore(tmp_path).check().loaded
    with pytest.raises(PolicyLoadError, match="holds no GPUPolicy"):
        loading.require_servable(PolicySet.empty(), tmp_path)


# --- small things -----------------------------------------------------------------------

EXAMPLE = ROOT / "webhook" / "examples" / "pod-training.yaml"
MIG_CASE = POLICIES / "tests" / "inference-rightsized-to-mig-slice"


def test_a_denied_pod_gets_the_denial_alone() -> None:
    """web-no-gpus used to warn "set nvidia.com/gpu: 4" and then deny the pod."""
    result = run("mutate", EXAMPLE, "--policies", POLICIES, "-n", "web-shop")
    assert result.exit_code == 1
    assert result.stderr.startswith("denied: ") and "warning" not in result.stderr, result.stderr
    shaped = mutation.mutate(yaml.safe_load(EXAMPLE.read_text()), namespace="web-shop",
                             policies=loading.load_dir(POLICIES))
    assert shaped.patch == () and shaped.warnings == ()  # the server's /mutate answer: nothing to read


def test_right_sizing_to_a_whole_gpu_leaves_one_memory_bound_and_no_word_about_the_pods_own() -> None:
    result = run("mutate", MIG_CASE / "pod.yaml", "--policies", POLICIES, "-n", "ml-serving", "-o", "json")
    assert result.exit_code == 0, result.output
    pod = json.loads(result.stdout)
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    memory = [e for e in terms["nodeSelectorTerms"][0]["matchExpressions"] if e["key"] == "nvidia.com/gpu.memory"]
    assert memory == [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["23999"]}]
    assert "pod's own expression" not in result.stderr


def test_mutate_takes_an_inventory_and_judges_its_age_as_the_server_does(tmp_path: Path) -> None:
    document = json.loads((MIG_CASE / "inventory.json").read_text())
    fresh, stale = tmp_path / "fresh.json", tmp_path / "stale.json"
    now = datetime.now(UTC)
    for path, at in ((fresh, now), (stale, now - timedelta(hours=1))):
        path.write_text(json.dumps({**document, "generatedAt": at.isoformat().replace("+00:00", "Z")}))
    asked = {}
    for name, extra in (("none", []), ("fresh", ["--inventory", fresh]), ("stale", ["--inventory", stale])):
        result = run("mutate", MIG_CASE / "pod.yaml", "--policies", POLICIES, "-n", "ml-serving", "-o", "json", *extra)
        assert result.exit_code == 0, result.output
        asked[name] = json.loads(result.stdout)["spec"]["containers"][0]["resources"]["limits"]
    assert asked == {"none": {"nvidia.com/gpu": "1"}, "fresh": {"nvidia.com/mig-2g.20gb": "1"},
                     "stale": {"nvidia.com/gpu": "1"}}


def test_validate_and_policy_test_take_an_inventory(tmp_path: Path) -> None:
    bad = tmp_path / "inventory.json"
    bad.write_text("{}")
    for args in (["validate", MIG_CASE / "pod.yaml", "--policies", POLICIES], ["policy", "test", POLICIES]):
        result = run(*args, "--inventory", bad)
        assert result.exit_code == 1 and f"{bad}: not a GPUInventory" in result.output, result.output


def test_a_case_file_that_is_not_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    shutil.copy(POLICIES / "training.yaml", tmp_path / "training.yaml")
    case = tmp_path / "tests" / "broken"
    case.mkdir(parents=True)
    (case / "case.yaml").write_text("namespace: ml-a\nexpect: {mutated: [\n")
    shutil.copy(EXAMPLE, case / "pod.yaml")
    result = run("policy", "test", tmp_path)
    assert result.exit_code == 1
    assert f"{case / 'case.yaml'}, line 3" in result.stdout and "<unicode string>" not in result.stdout


def test_policy_test_diffs_in_the_pods_own_key_order(tmp_path: Path) -> None:
    for name in ("training.yaml",):
        shutil.copy(POLICIES / name, tmp_path / name)
    case = tmp_path / "tests" / "wrong"
    shutil.copytree(POLICIES / "tests" / "training-packs-on-clique", case)
    expected = (case / "expected.yaml").read_text()
    (case / "expected.yaml").write_text(expected.replace("weight: 40", "weight: 41", 1))
    result = run("policy", "test", tmp_path)
    assert result.exit_code == 1
    changed = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith(("-", "+"))]
    # Each preferred term as written leads with its weight; sorted keys put 'preference' first.
    assert "-      - weight: 41" in changed and "+      - weight: 40" in changed, changed


def test_a_replay_table_of_one_seed_says_seed() -> None:
    from webhook.replay import report

    assert report.table([], workload="w", seeds=[42]).splitlines()[0] == "workload w, seed 42; % of GPU capacity"
    assert report.table([], workload="w", seeds=[42, 43, 44]).splitlines()[0].startswith(
        "workload w, seeds 42-44; medians over seeds")


def test_binaries_check_says_so_when_every_binary_is_there(tmp_path: Path, monkeypatch, capsys) -> None:
    from tests.e2e import binaries

    monkeypatch.setattr(binaries.recipe, "missing", lambda components: [])
    assert binaries.main(["check"]) == 0
    assert "every e2e binary is built" in capsys.readouterr().out
