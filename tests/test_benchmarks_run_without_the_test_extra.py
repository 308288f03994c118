"""Every benchmark runs, in its shortest mode, so none can rot (mutate_core.py crashed
after its table for weeks); and the benchmarks run on an install without the test extra (issue
20): a user who installed the project with `pip install -e .` runs `python benchmarks/X.py
--help` and gets the help, not an ImportError for pytest or hypothesis.

The shortest modes prove the scripts still run end to end and print their figures; the figures
themselves mean nothing at that size (speed is read from a full run, never asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.prerequisites import missing, needed
from webhook.localcluster import binaries

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
TRACE = REPO.parent / "shared" / "data" / "alibaba-gpu-v2023"


@dataclass(frozen=True)
class Shortest:
    """How a benchmark runs in its shortest mode, and what it needs."""

    args: tuple[str, ...]
    prints: str                      # a word of its figures' output, proof it got that far
    trace: bool = False              # reads ../shared's trace
    control_plane: bool = False      # starts the e2e control plane (built binaries)
    timeout: float = 240.0


# Every script in benchmarks/ is a key here (a test checks it): a new benchmark comes with its
# shortest mode. Modules that are not scripts (null_server.py is the server admission_load.py and
# create_latency.py start; realistic_review.py the review they send) are run through those.
SHORTEST: dict[str, Shortest | str] = {
    "admission_load.py": Shortest(("--seconds", "0.5", "--rounds", "1", "--rate", "50", "--connections", "2",
                                   "--drivers", "1", "--workers", "1", "--threads", "2"), "req/s"),
    "balancer_cluster.py": Shortest(("--nodes", "20", "--pods", "100", "--burst", "20", "--placements", "pack",
                                     "--code-before", "HEAD", "--patch-cost", "8", "--patch-rounds", "1"), "sender",
                                    control_plane=True, timeout=900),
    "balancer_scale.py": Shortest(("--nodes", "40", "--pods", "400", "--events", "100"), "labelled"),
    "create_latency.py": Shortest(("--pods", "4", "--rounds", "1", "--parallel", "2"), "creators",
                                  control_plane=True, timeout=400),
    "dra_counting.py": Shortest(("--quick",), "ratio:"),
    "chaos.py": Shortest(("--minutes", "0.05", "--clients", "2"), "alive at the end: True"),
    "health_quarantine.py": Shortest(("--nodes", "1", "--injections", "2", "--gap", "0", "--interval", "1",
                                      "--step", "1"), "DeviceTaintRule",
                                     control_plane=True, timeout=400),
    "extender_latency.py": Shortest(("--nodes", "20", "--pods", "60"), "p99"),
    "fuzz_admission.py": Shortest(("--reviews", "40", "--seed", "3"), "wrong allows: 0"),
    "mutate_core.py": Shortest(("--seconds", "0.3", "--before", "HEAD"), "x floor"),
    "placement_table.py": "run and table, test_placement_table_runs_and_tabulates",
    "rebalance_table.py": "table on recorded rows in tests/test_rebalance_table.py; run is the timeline replay",
    "replay_speed.py": Shortest(("--arms", "random", "--no-fidelity"), "s/run", trace=True, timeout=300),
    "replay_vs_scheduler.py": Shortest(("--nodes", "4", "--pods", "8", "--model-seeds", "1", "--arms", "stock",
                                        "--pod-files", "openb_pod_list_default.csv"), "stock",
                                       trace=True, control_plane=True, timeout=400),
    "null_server.py": "started by admission_load.py",
    "patchcost.py": "run by balancer_cluster.py --patch-cost",
    "hostile_load.py": "run by create_latency.py --hostile; its attacks alone in tests/server/test_cost_ceilings.py",
    "realistic_review.py": "sent by admission_load.py",
}
SCRIPTS = sorted(name for name, how in SHORTEST.items() if isinstance(how, Shortest))

# Each script is run with the test-only libraries made unimportable, as on such an install.
BLOCK = "import sys, runpy; sys.modules.update(pytest=None, hypothesis=None, _pytest=None); " \
        "sys.argv = [{path!r}, '--help']; runpy.run_path({path!r}, run_name='__main__')"
# These drive tests/ harnesses: developers' tools, run with the test extra.
NEEDS_THE_TEST_EXTRA = {"balancer_cluster.py", "chaos.py", "create_latency.py", "fuzz_admission.py",
                        "health_quarantine.py", "replay_vs_scheduler.py"}


def test_every_benchmark_has_a_shortest_mode() -> None:
    present = {path.name for path in BENCHMARKS.glob("*.py") if path.name != "__init__.py"}
    assert present == set(SHORTEST), f"benchmarks without a shortest mode here: {sorted(present - set(SHORTEST))}"


@pytest.mark.parametrize("script", sorted(set(SCRIPTS) - NEEDS_THE_TEST_EXTRA))
def test_a_benchmark_prints_its_help_without_pytest(script: str) -> None:
    path = str(BENCHMARKS / script)
    done = subprocess.run([sys.executable, "-c", BLOCK.format(path=path)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def run(script: str, *args: str, timeout: float = 240.0) -> str:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _prerequisites(how: Shortest) -> None:
    if how.trace:
        needed(TRACE, "../shared beside the clone holds the trace")
    if how.control_plane and binaries.paths() is None:
        missing("the e2e control-plane binaries are not built; run `python -m tests.e2e.binaries build`")


@pytest.mark.slow
@pytest.mark.parametrize("script", [pytest.param(name, marks=[pytest.mark.e2e] if how.control_plane else [])
                                    for name in SCRIPTS if isinstance(how := SHORTEST[name], Shortest)])
def test_a_benchmark_runs_in_its_shortest_mode(script: str) -> None:
    how = SHORTEST[script]
    assert isinstance(how, Shortest)
    _prerequisites(how)
    out = run(script, *how.args, timeout=how.timeout)
    assert how.prints in out, out[-3000:]


@pytest.mark.slow
def test_placement_table_runs_and_tabulates(tmp_path: Path) -> None:
    needed(TRACE, "../shared beside the clone holds the trace")
    common = ("--out", str(tmp_path), "--lists", "gpushare100", "--arms", "random", "--seeds", "42")
    run("placement_table.py", "run", *common, timeout=300)
    assert "random" in run("placement_table.py", "table", *common)


@pytest.mark.slow
@pytest.mark.e2e
def test_replay_vs_scheduler_in_a_sharing_world_says_how_kube_scheduler_broke_its_ties() -> None:
    """The ``--sharing`` and ``--ties`` paths (the shortest mode above runs the arms' path)."""
    how = SHORTEST["replay_vs_scheduler.py"]
    assert isinstance(how, Shortest)
    _prerequisites(how)
    out = run("replay_vs_scheduler.py", "--nodes", "4", "--pods", "8", "--model-seeds", "1", "--sharing", "dra",
              "--ties", "--pod-files", "openb_pod_list_default.csv", timeout=how.timeout)
    assert "[dra] lockstep: real choice among the model's best" in out, out[-3000:]
    [fidelity] = [line for line in out.splitlines() if line.startswith("gpugate-fidelity: ")]
    assert "scored bound pods" in fidelity, out[-3000:]  # the world's own scheduler, at --v=10
