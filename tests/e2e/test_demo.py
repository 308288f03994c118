"""`gpugate demo --once` on a fresh control plane of its own: every bundled example ends
where the policies and the node mix say, and the table says so."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.webhook_fixture import GPUGATE
from tests.prerequisites import missing
from webhook.localcluster import binaries

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_output() -> tuple[int, str, float]:
    if binaries.paths() is None:
        missing("the control-plane binaries are not built: `python -m tests.e2e.binaries build`")
    started = time.monotonic()
    done = subprocess.run([str(GPUGATE), "demo", "--once"], cwd=ROOT, capture_output=True, text=True, timeout=400,
                          check=False)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def _row(output: str, asked: str) -> str:
    [line] = [line for line in output.splitlines() if f"  {asked}  " in line]
    return line


def test_demo_runs_and_stops_by_itself(demo_output: tuple[int, str, float]) -> None:
    code, output, seconds = demo_output
    assert code == 0, output
    assert "POD" in output and "BECAME" in output and "stopping" in output
    print(f"gpugate demo --once took {seconds:.0f} s")


@pytest.mark.parametrize(("asked", "policy", "became", "node"), [
    ("training, gpus: 4", "training@", "nvidia.com/gpu: 4", r"h100-[ab]"),
    ("inference, gpus: 1", "inference@", "nvidia.com/gpu: 1", r"h100-[ab]"),
    ("notebook, a share", "notebooks@", "nvidia.com/gpu.shared: 1", r"h100-shared"),
    ("gpu-memory: 16Gi", "inference@", "nvidia.com/mig-2g.20gb: 1", r"h100-mig"),
])
def test_each_example_became_what_its_policy_says_and_landed_on_a_node_that_offers_it(
        demo_output: tuple[int, str, float], asked: str, policy: str, became: str, node: str) -> None:
    row = _row(demo_output[1], asked)
    assert policy in row and became in row, row
    assert re.search(rf"  {node}$", row), row


def test_the_web_pod_is_denied_with_the_policys_message(demo_output: tuple[int, str, float]) -> None:
    row = _row(demo_output[1], "web pod, nvidia.com/gpu: 1")
    assert "DENIED" in row and "GPUs are not available in web and frontend namespaces" in row, row


@dataclass(frozen=True)
class _Process:
    parent: int
    state: str
    cmdline: str


def _processes() -> dict[int, _Process]:
    """This machine's processes from /proc (nothing is signalled)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            found[int(entry.name)] = _Process(parent=int(stat[1]), state=stat[0], cmdline=cmdline)
    return found


def _processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line names ``text`` and that have not exited."""
    return [pid for pid, process in _processes().items() if text in process.cmdline and process.state != "Z"]


def _descendants(pid: int) -> dict[int, str]:
    """Every process under ``pid`` and its command line (the demo's servers run in sessions of
    their own, so a process group would miss them)."""
    processes = _processes()
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, process in processes.items():
            if process.parent == parent and child not in found:
                found[child] = process.cmdline
                frontier.append(child)
    return found


def _interrupted_demo(ready: str, env: dict[str, str] | None = None,
                      ) -> tuple[subprocess.Popen[str], list[str], dict[int, str], str]:
    """Run ``gpugate demo`` until a line starts with ``ready``, press Ctrl-C (SIGINT to its process
    group, as a terminal sends it) and wait for it to end: the process, the lines up to ``ready``,
    what ran under it then, and what it printed after."""
    demo = subprocess.Popen([str(GPUGATE), "demo"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, **(env or {})})
    lines = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if line.startswith(ready):
                break
        else:
            raise AssertionError(f"the demo ended before it printed {ready!r}:\n" + "".join(lines))
        started = _descendants(demo.pid)
        os.killpg(demo.pid, signal.SIGINT)
        rest, _ = demo.communicate(timeout=90)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    return demo, lines, started, rest


def test_ctrl_c_stops_everything_the_demo_started(demo_output: tuple[int, str, float]) -> None:
    """Without --once the demo keeps running until SIGINT, then stops every process and removes its folder."""
    demo, lines, started, rest = _interrupted_demo("Ctrl-C stops everything")
    [export] = [line for line in lines if line.startswith("export KUBECONFIG=")]
    workdir = str(Path(export.split("=", 1)[1].split()[0]).parent)
    assert any(workdir in line for line in started.values()), "etcd and kube-apiserver run from the demo's folder"
    assert demo.returncode == 0, "".join(lines) + rest
    assert "stopping" in rest
    assert _processes_mentioning(workdir) == []
    assert not Path(workdir).exists()


def test_ctrl_c_while_starting_stops_what_had_started_and_says_so(demo_output: tuple[int, str, float]) -> None:
    """A Ctrl-C before the table unwinds: etcd, kube-apiserver, the scheduler and gpugate serve are
    stopped, and the demo ends with 130 (as a shell reports Ctrl-C) and a line saying what it did."""
    demo, lines, started, rest = _interrupted_demo("gpugate serve at")
    assert any("kube-apiserver" in line for line in started.values()), started
    assert demo.returncode == 130, "".join(lines) + rest
    assert "SIGINT while starting: stopped everything the demo had started" in rest, rest
    assert "Aborted" not in rest and "Traceback" not in rest, rest
    assert _left_running(started) == []


def _left_running(started: dict[int, str], grace: float = 10.0) -> list[str]:
    """Which of ``started`` still run (by PID and the same command line) after up to ``grace`` seconds."""
    deadline = time.monotonic() + grace
    while True:
        still = _processes()
        left = [line for pid, line in started.items()
                if pid in still and still[pid].cmdline == line and still[pid].state != "Z"]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_ctrl_c_during_the_first_build_stops_go_and_caches_nothing_half_built(
        demo_output: tuple[int, str, float], tmp_path: Path) -> None:
    """On a machine without the binaries the demo first builds them (20-40 minutes); a Ctrl-C then
    ends it like any other while starting, leaves no ``go`` running and no binary in the cache.
    GOPROXY=off: the Go modules are in the machine's module cache from the suite's own build."""
    if shutil.which("go") is None:
        missing("go is needed to build the control plane's binaries")
    cache = tmp_path / "empty-cache"
    demo, lines, started, rest = _interrupted_demo("building ", env={binaries.CACHE_ENV: str(cache),
                                                                     "GOPROXY": "off"})
    assert "are not built yet" in "".join(lines), lines
    assert demo.returncode == 130, "".join(lines) + rest
    assert "SIGINT while starting: stopped everything the demo had started" in rest, rest
    assert _left_running(started) == []
    built = [path for path in cache.rglob("*") if path.is_file() and os.access(path, os.X_OK)
             and not path.name.endswith(".partial")]
    assert built == [], built
