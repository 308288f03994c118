"""``gpugate replay`` end to end on a synthetic cluster: table, CSVs, summary.json, plot, errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from webhook.balancer.settings import load_mix
from webhook.cli import main
from webhook.commands.replay import parse_seeds
from webhook.placement.shapes import ShapeMix
from webhook.replay import report, runner, trace


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["replay", *args])
    return result.exit_code, result.stdout, result.stderr


def test_a_run_on_a_fresh_clone_writes_the_summary_csvs_and_plot(tmp_path: Path, repo_root: Path) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = invoke("--arms", "stock,gpugate,fgd", "--seeds", "5-6", "--synthetic-nodes", "24",
                                  "--policies", str(repo_root / "policies"),
                                  "--out", str(out), "--workers", "2")
    assert code == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"mode", "workload", "seeds", "sharing", "ties", "arms"}
    assert summary["sharing"] == "timeslice"
    assert summary["mode"] == "published"
    assert summary["ties"] == "random"
    assert summary["workload"] == "synthetic-5" and summary["seeds"] == [5, 6]
    assert list(summary["arms"]) == ["stock", "gpugate", "fgd"]
    base = {"world", "alloc_at_100", "alloc_at_130", "frag_at_100", "runs"}
    in_world = {"served_at_100", "placed", "failed", "failed_at_100", "overcommitted"}
    for arm, values in summary["arms"].items():
        assert set(values) == (base if arm == "fgd" else base | in_world)
        assert values["world"] == ("published" if arm == "fgd" else "timeslice")
        assert values["runs"] == 2 and 0 < values["alloc_at_100"] <= 100
    assert "stock" in stdout and "alloc@100%" in stdout and "6/6 runs" in stderr
    rows = list(csv.DictReader((out / "runs" / "fgd-seed6.csv").open()))
    assert rows[0].keys() == {"arrived_pct", "alloc_pct", "frag_pct", "failed_pods"}
    assert float(rows[-1]["arrived_pct"]) >= 125
    assert (out / "allocation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curves = report.curves_from_csv(out, label="x-{arm}")
    assert sorted(curves) == sorted(f"x-{arm} ({summary['arms'][arm]['alloc_at_100']:.2f}% at 100%)"
                                    for arm in ("stock", "gpugate", "fgd"))
    combined = report.plot_curves(curves, tmp_path / "combined.png", title="t")
    assert combined.read_bytes()[:4] == b"\x89PNG"
    # The pod list's shape mix, for gpugate balance --extender-mix: the mix --extender-mix trace uses.
    assert "pod-mix.yaml" in stdout
    loaded = trace.synthetic(5, nodes=24)
    assert load_mix(str(out / "pod-mix.yaml")) == ShapeMix.from_demands(runner.demand_from_trace(loaded.pods))


@pytest.mark.parametrize(("args", "message"), [
    (("--seeds", "51-42"), "runs backwards"),
    (("--seeds", "forty"), "is not a seed"),
    (("--arms", "stock,tetris"), "unknown arm(s) tetris"),
    (("--pods", "x.csv"), "--pods needs --trace"),
    (("--ties", "first"), "'first' is not one of 'random', 'list'"),
])
def test_usage_errors_exit_2(args: tuple[str, ...], message: str) -> None:
    code, _, stderr = invoke(*args)
    assert code == 2 and message in stderr


def test_ties_list_is_named_in_the_table_and_the_summary_and_changes_what_stock_does(tmp_path: Path) -> None:
    """``--ties list``: v1.37.2's tie rule without an extender (the heap's top, no Randomizer)."""
    common = ("--arms", "stock", "--seeds", "5", "--synthetic-nodes", "24")
    code, stdout, stderr = invoke(*common, "--ties", "list", "--out", str(tmp_path / "list"))
    assert code == 0, stderr
    assert "kube-scheduler ties: list (v1.37.2 without an extender)" in stdout.splitlines()[0]
    assert json.loads((tmp_path / "list" / "summary.json").read_text())["ties"] == "list"
    assert invoke(*common, "--out", str(tmp_path / "random"))[0] == 0
    # The fragment after each pod: where the pods went differs (an empty synthetic cluster ties everywhere).
    fragment = {ties: [row["frag_pct"] for row in csv.DictReader((tmp_path / ties / "runs" / "stock-seed5.csv").open())]
                for ties in ("list", "random")}
    assert fragment["list"] != fragment["random"]


def test_a_bad_trace_or_policy_folder_exits_1_with_the_reason(tmp_path: Path) -> None:
    code, _, stderr = invoke("--trace", str(tmp_path), "--arms", "stock", "--out", str(tmp_path / "o"))
    assert code == 1 and "openb_node_list_gpu_node.csv: no such trace file" in stderr
    bad = tmp_path / "policies"
    bad.mkdir()
    (bad / "broken.yaml").write_text("apiVersion: gpugate.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: x}\n"
                                     "spec: {priority: high}\n")
    code, _, stderr = invoke("--arms", "gpugate", "--policies", str(bad), "--out", str(tmp_path / "o"))
    assert code == 1 and "broken.yaml" in stderr
    assert not (tmp_path / "o" / "summary.json").exists()


def test_seeds_accept_ranges_and_lists() -> None:
    assert parse_seeds("42-44,50,43") == [42, 43, 44, 50]


def test_a_timeline_run_writes_its_table_summary_csvs_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "t"
    code, stdout, stderr = invoke("--timeline", "--load", "0.9", "--arms", "stock,extender+rebalancer",
                                  "--seeds", "5", "--synthetic-nodes", "20", "--out", str(out), "--workers", "1")
    assert code == 0, stderr
    assert "in time, offered load 0.9" in stdout.splitlines()[0] and "pending%" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "timeline" and summary["load"] == 0.9 and list(summary["arms"]) == [
        "stock", "extender+rebalancer"]
    assert {"allocation", "pending", "offered", "wait_p95", "moves", "moves_per_hour_pct"} <= set(
        summary["arms"]["stock"])
    assert summary["arms"]["stock"]["offered"] == pytest.approx(90, abs=15)
    rows = list(csv.DictReader((out / "runs" / "extender+rebalancer-seed5.csv").open()))
    assert len(rows) > 100 and set(rows[0]) == {"hours", "allocation_pct", "pending_pct", "fragment_pct"}
    assert (out / "timeline.png").stat().st_size > 10_000


@pytest.mark.parametrize(("args", "message"), [
    (("--timeline", "--arms", "fgd"), "--timeline replays the kube-scheduler arms"),
    (("--timeline", "--sharing", "dra"), "not --sharing dra"),
    (("--arms", "extender+rebalancer"), "add --timeline"),
])
def test_the_timeline_refuses_what_it_cannot_replay(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    code, _, stderr = invoke(*args, "--seeds", "5", "--synthetic-nodes", "12", "--workers", "1",
                             "--out", str(tmp_path / "o"))
    assert code != 0 and message in stderr


def _press_ctrl_c_during_a_replay(out: Path, repo_root: Path) -> tuple[int, str]:
    """Run ``gpugate replay`` as a terminal's foreground job (SIGINT at its default), press Ctrl-C
    (SIGINT to its process group) once a run has finished: (exit status, stderr after the press)."""
    import os
    import signal
    import subprocess
    import sys

    command = [sys.executable, "-m", "webhook.cli", "replay", "--arms", "stock,gpugate", "--seeds", "42-49",
               "--synthetic-nodes", "60", "--policies", str(repo_root / "policies"), "--out", str(out),
               "--workers", "2"]
    child = subprocess.Popen(command, start_new_session=True, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert child.stderr is not None
        seen = ""
        while "1/16 runs" not in seen:  # the progress bar: a run has finished, others are under way
            chunk = child.stderr.read(1)
            assert chunk, f"replay ended before its first run: {seen}"
            seen += chunk
        os.killpg(child.pid, signal.SIGINT)
        return child.returncode if child.wait(timeout=60) is not None else -1, child.communicate()[1]
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def test_ctrl_c_stops_a_replay_at_once_with_130_and_leaves_the_out_folder_as_it_was(tmp_path: Path,
                                                                                   repo_root: Path) -> None:
    """Ctrl-C was ignored until the running runs ended, then click's "Aborted!", exit 1, and a
    half-written output folder."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("an earlier replay's\n")
    status, stderr = _press_ctrl_c_during_a_replay(out, repo_root)
    assert status == 130, stderr
    assert f"SIGINT: stopped the replay; {out} was not written" in stderr
    assert "Traceback" not in stderr and "Aborted!" not in stderr
    # The runs under way are stopped, not waited for (one may have ended as the key was pressed).
    assert "3/16 runs" not in stderr, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left beside it
    assert [p.name for p in out.iterdir()] == ["summary.json"]
    assert (out / "summary.json").read_text() == "an earlier replay's\n"
