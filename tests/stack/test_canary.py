"""The canary gate of ``gpugate stack promote`` and ``gpugate stack canary``.

The decisions (``webhook.stack.canary``) are pure and tested directly, with hypothesis for the
rules that must hold over any sequence of observations; the commands run on a real git
repository against the fake API server (``tests.kubefake``: the real kubernetes client does the
talking), the nodes labelled as NVIDIA's upgrade library and GFD label them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kubefake import fake_kube  # noqa: F401 - pytest fixture
from tests.stack.conftest import git, snapshot
from webhook import names
from webhook.cli import main
from webhook.errors import GpugateError
from webhook.stack import canary, manifests, status
from webhook.stack.canary import Analysis, CanaryObservation, Condition, NodeUpgrade, Watch, gate, judge, parse_analysis

DRIVER = "610.57.04"
OLD = "595.91.07"


def node(name: str, state: str, driver: str | None) -> NodeUpgrade:
    return NodeUpgrade(name=name, state=state, driver=driver)


# ---------------------------------------------------------------------------- the gate (pure)


def test_the_gate_names_every_node_that_is_not_done_at_the_target_driver():
    verdict = gate("canary", DRIVER, [node("b", "upgrade-done", OLD), node("a", "upgrade-failed", DRIVER),
                                      node("c", "upgrade-done", DRIVER), node("d", "validation-required", DRIVER)])
    assert not verdict.ok
    assert verdict.blocking == ("a is upgrade-failed", f"b is upgrade-done at driver {OLD}, not {DRIVER}",
                                "d is validation-required")
    assert verdict.reason.startswith(f"pool canary is not upgrade-done at driver {DRIVER}: a is upgrade-failed")


def test_the_gate_is_closed_on_an_empty_pool_and_open_when_every_node_is_done():
    assert not gate("canary", DRIVER, []).ok and "no node in the cluster" in gate("canary", DRIVER, []).reason
    done = gate("canary", DRIVER, [node("a", "upgrade-done", DRIVER), node("b", "upgrade-done", DRIVER)])
    assert done.ok and done.reason == f"every node of pool canary (2) is upgrade-done at driver {DRIVER}"


# ---------------------------------------------------------------------------- the verdict (pure)


XID = Condition(name="no-new-xid", query="sum(increase(DCGM_FI_DEV_XID_ERRORS[5m]))", max=0)
ANALYSIS = Analysis(pool="canary", window_seconds=30, interval_seconds=5, timeout_seconds=600, conditions=(XID,))
DONE = (node("a", "upgrade-done", DRIVER), node("b", "upgrade-done", DRIVER))


def test_a_failed_node_rolls_back_at_once_whatever_else_holds():
    verdict = judge(ANALYSIS, DRIVER, Watch(started=0), CanaryObservation(
        at=1, nodes=(node("a", "upgrade-failed", DRIVER), node("b", "upgrade-required", OLD)),
        measurements={"no-new-xid": (0.0,)}))
    assert verdict.decision == "rollback" and verdict.reasons == ("driver upgrade failed on a (upgrade-failed)",)


def test_a_new_xid_error_rolls_back_even_when_every_node_is_done():
    verdict = judge(ANALYSIS, DRIVER, Watch(started=0), CanaryObservation(at=1, nodes=DONE,
                                                                   measurements={"no-new-xid": (0.0, 2.0)}))
    assert verdict.decision == "rollback" and verdict.reasons == ("no-new-xid: 2 > max 0",)


def test_promote_needs_the_whole_window_and_a_measurement_of_every_condition():
    watch = Watch(started=0)
    first = judge(ANALYSIS, DRIVER, watch, CanaryObservation(at=10, nodes=DONE))
    assert first.decision == "wait" and "not yet measured: no-new-xid" in first.reasons[0]
    second = judge(ANALYSIS, DRIVER, first.watch, CanaryObservation(at=25, nodes=DONE,
                                                                    measurements={"no-new-xid": (0.0,)}))
    assert second.decision == "wait" and "15s of the 30s window" in second.reasons[0]
    third = judge(ANALYSIS, DRIVER, second.watch, CanaryObservation(at=40, nodes=DONE,
                                                                    measurements={"no-new-xid": (0.0,)}))
    assert third.decision == "promote" and "for 30s (window 30s)" in third.reasons[0]


def test_the_window_starts_again_when_a_node_leaves_upgrade_done():
    open_ = judge(ANALYSIS, DRIVER, Watch(started=0), CanaryObservation(at=10, nodes=DONE,
                                                                        measurements={"no-new-xid": (0,)}))
    closed = judge(ANALYSIS, DRIVER, open_.watch,
                   CanaryObservation(at=20, nodes=(DONE[0], node("b", "upgrade-required", OLD))))
    assert closed.decision == "wait" and closed.watch.gate_since is None
    again = judge(ANALYSIS, DRIVER, closed.watch, CanaryObservation(at=45, nodes=DONE,
                                                                    measurements={"no-new-xid": (0,)}))
    assert again.decision == "wait" and again.watch.gate_since == 45


def test_no_data_fails_unless_the_condition_says_otherwise_and_the_deadline_rolls_back():
    assert XID.violation(()) == "no-new-xid: the query returned no data"
    assert Condition(name="x", query="q", min=1, no_data="pass").violation(()) is None
    assert Condition(name="x", query="q", min=1).violation((0.5,)) == "x: 0.5 < min 1"
    late = judge(ANALYSIS, DRIVER, Watch(started=0), CanaryObservation(at=600, nodes=(node("a", "upgrade-required",
                                                                                           OLD),)))
    assert late.decision == "rollback" and late.reasons[0].startswith("not done after 600s")


STATES = st.sampled_from(["upgrade-done", "upgrade-required", "cordon-required", "pod-restart-required",
                          "validation-required", "upgrade-failed", canary.NO_STATE])
NODES = st.lists(st.tuples(STATES, st.sampled_from([DRIVER, OLD, None])), min_size=1, max_size=4).map(
    lambda pairs: tuple(node(f"n{i}", state, driver) for i, (state, driver) in enumerate(pairs)))
XIDS = st.lists(st.sampled_from([0.0, 0.0, 0.0, 1.0]), min_size=1, max_size=3).map(tuple)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(NODES, XIDS), min_size=1, max_size=12))
def test_over_any_sequence_promote_only_after_a_clean_window_and_rollback_on_any_failure(steps):
    """Promote only if every node is done at the driver and every look since the gate opened had no
    XID error for the whole window; any failed node or XID error is a rollback."""
    watch, clean_since = Watch(started=0), None
    for index, (nodes, xids) in enumerate(steps):
        at = index * 10.0
        verdict = judge(ANALYSIS, DRIVER, watch, CanaryObservation(at=at, nodes=nodes,
                                                                   measurements={"no-new-xid": xids}))
        failed = any(n.state == "upgrade-failed" for n in nodes) or any(x > 0 for x in xids)
        done = all(n.state == "upgrade-done" and n.driver == DRIVER for n in nodes)
        clean_since = (clean_since if clean_since is not None else at) if done else None
        if failed:
            assert verdict.decision == "rollback"
            return
        if verdict.decision == "promote":
            assert done and clean_since is not None and at - clean_since >= ANALYSIS.window_seconds
            return
        assert verdict.decision == "wait"
        watch = verdict.watch


# ---------------------------------------------------------------------------- canary.yaml


GOOD = """
apiVersion: gpugate.io/v1alpha1
kind: CanaryAnalysis
pool: canary
windowSeconds: 120
prometheus: {url: http://prometheus.monitoring:9090}
conditions:
  - name: no-new-xid
    query: sum(increase(DCGM_FI_DEV_XID_ERRORS{pool="canary"}[5m]))
    max: 0
"""


def test_the_checked_in_canary_yaml_is_valid():
    root = Path(__file__).resolve().parents[2]
    pools = [p.name for p in manifests.load_stack(root).pools]
    analysis = parse_analysis((root / canary.ANALYSIS_FILE).read_text(), pools=pools)
    assert analysis.pool == "canary" and analysis.conditions == ()


def test_canary_yaml_is_read_with_its_conditions():
    analysis = parse_analysis(GOOD, pools=["default", "canary"])
    assert analysis.pool == "canary" and analysis.window_seconds == 120
    assert analysis.conditions == (Condition(name="no-new-xid", query='sum(increase(DCGM_FI_DEV_XID_ERRORS'
                                             '{pool="canary"}[5m]))', max=0),)


@pytest.mark.parametrize(("text", "message"), [
    (GOOD.replace("pool: canary", "pool: gold"), "pool(s) gold are not pools of stack.yaml (default, canary)"),
    (GOOD.replace("    max: 0", "    maxx: 0"), "conditions/0: Additional properties are not allowed ('maxx'"),
    (GOOD.replace("    max: 0", ""), "conditions/0:"),
    (GOOD.replace("windowSeconds: 120", "windowSeconds: soon"), "windowSeconds: 'soon' is not of type 'number'"),
    (GOOD.replace("prometheus: {url: http://prometheus.monitoring:9090}\n", ""),
     "conditions and xid need prometheus.url"),
    (GOOD + "  - name: no-new-xid\n    query: up\n    min: 1\n", "duplicate name(s) no-new-xid"),
    (GOOD.replace("kind: CanaryAnalysis", "kind: Canary"), "kind: 'CanaryAnalysis' was expected"),
    ("pool: [", ", line 1, column 8: invalid YAML: expected the node content"),  # no "<unicode string>"
])
def test_a_bad_canary_yaml_is_refused_naming_the_problem(text, message):
    with pytest.raises(GpugateError) as caught:
        parse_analysis(text, pools=["default", "canary"])
    assert message in str(caught.value) and canary.ANALYSIS_FILE in str(caught.value)


# ---------------------------------------------------------------------------- the commands


def labelled(name: str, *, owner: str, state: str, driver: str | None) -> dict:
    labels = {names.GPU_PRESENT_LABEL: "true", names.DRIVER_OWNER_LABEL: owner,
              status.DRIVER_UPGRADE_STATE_LABEL: state}
    if driver:
        labels["nvidia.com/cuda.driver-version.full"] = driver
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def run(repo: Path, *args: str):
    return CliRunner().invoke(main, ["stack", *args, "--repo", str(repo)], catch_exceptions=False)


def canary_upgraded(stack_repo: Path) -> None:
    result = run(stack_repo, "upgrade", "--operator", "v26.7.0", "--driver", DRIVER, "--pool", "canary")
    assert result.exit_code == 0, result.output


def test_promote_refuses_naming_the_canary_nodes_and_their_states(stack_repo, fake_kube):
    canary_upgraded(stack_repo)
    fake_kube.put(labelled("gpu-c1", owner="canary", state="upgrade-failed", driver=OLD))
    fake_kube.put(labelled("gpu-c2", owner="canary", state="upgrade-done", driver=DRIVER))
    fake_kube.put(labelled("gpu-d1", owner="default", state="upgrade-done", driver=OLD))
    before = snapshot(stack_repo)
    result = run(stack_repo, "promote", "--from", "canary", "--to", "all", "--server", fake_kube.url)
    assert result.exit_code == 1
    assert "FAIL  canary-gate[canary]" in result.output and "gpu-c1 is upgrade-failed" in result.output
    assert "gpu-c2" not in result.output.split("canary-gate")[1].split("\n")[0]
    assert snapshot(stack_repo) == before, "a refused promotion wrote something"


def test_promote_goes_through_once_every_canary_node_is_done_and_force_says_so(stack_repo, fake_kube):
    canary_upgraded(stack_repo)
    for name in ("gpu-c1", "gpu-c2"):
        fake_kube.put(labelled(name, owner="canary", state="upgrade-done", driver=DRIVER))
    result = run(stack_repo, "promote", "--from", "canary", "--to", "all", "--server", fake_kube.url)
    assert result.exit_code == 0, result.output
    text = git(stack_repo, "log", "-n1", "--format=%B")
    assert f"canary-gate[canary]: every node of pool canary (2) is upgrade-done at driver {DRIVER}" in text
    assert "--force" not in text


def test_promote_without_a_cluster_is_refused_unless_forced(stack_repo):
    canary_upgraded(stack_repo)
    before = snapshot(stack_repo)
    result = run(stack_repo, "promote", "--from", "canary", "--to", "all", "--server", "http://127.0.0.1:9")
    assert result.exit_code == 1 and "cannot read pool canary from the cluster" in result.output
    assert snapshot(stack_repo) == before
    forced = run(stack_repo, "promote", "--from", "canary", "--to", "all", "--force")
    assert forced.exit_code == 0, forced.output
    assert "promoted with --force" in git(stack_repo, "log", "-n1", "--format=%B")


def test_canary_decides_rollback_on_a_failed_node_and_commits_it(stack_repo, fake_kube):
    canary_upgraded(stack_repo)
    upgraded = git(stack_repo, "rev-parse", "HEAD").strip()
    fake_kube.put(labelled("gpu-c1", owner="canary", state="upgrade-failed", driver=OLD))
    fake_kube.put(labelled("gpu-c2", owner="canary", state="upgrade-required", driver=OLD))
    dry = run(stack_repo, "canary", "--server", fake_kube.url)
    assert dry.exit_code == 1 and "rollback: driver upgrade failed on gpu-c1" in dry.output
    assert "would run: gpugate stack rollback" in dry.output
    assert git(stack_repo, "rev-parse", "HEAD").strip() == upgraded
    done = run(stack_repo, "canary", "--commit", "--server", fake_kube.url)
    assert done.exit_code == 1 and "committed" in done.output, done.output
    assert f"Gpugate-Reverts: {upgraded}" in git(stack_repo, "log", "-n1", "--format=%B")
    assert manifests.load_stack(stack_repo).pools[1].driver == OLD
    assert "retry each failed node (the operator does not): kubectl label node gpu-c1" in done.output


def test_canary_promotes_a_done_canary_after_the_window(stack_repo, fake_kube):
    canary_upgraded(stack_repo)
    for name in ("gpu-c1", "gpu-c2"):
        fake_kube.put(labelled(name, owner="canary", state="upgrade-done", driver=DRIVER))
    result = run(stack_repo, "canary", "--commit", "--window", "0", "--server", fake_kube.url)
    assert result.exit_code == 0, result.output
    assert "promote" in git(stack_repo, "log", "-n1", "--format=%s")
    assert {p.name: p.driver for p in manifests.load_stack(stack_repo).pools} == {"default": DRIVER, "canary": DRIVER}


def test_canary_refuses_a_bad_canary_yaml_and_writes_nothing(stack_repo, fake_kube):
    (stack_repo / canary.ANALYSIS_FILE).write_text(GOOD.replace("pool: canary", "pool: gold"))
    git(stack_repo, "add", canary.ANALYSIS_FILE)
    git(stack_repo, "commit", "-qm", "a bad canary.yaml")
    before = snapshot(stack_repo)
    result = CliRunner().invoke(main, ["stack", "canary", "--commit", "--server", fake_kube.url,
                                       "--repo", str(stack_repo)])
    assert result.exit_code == 1 and "pool(s) gold are not pools of stack.yaml" in result.output
    assert snapshot(stack_repo) == before
