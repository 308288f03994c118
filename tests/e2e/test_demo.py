"""`gpugate demo --once` on a fresh control plane of its own (issue 29): every bundled example ends
where the policies and the node mix say, and the table says so."""

from __future__ import annotations

import re
import signal
import subprocess
import time
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


def _processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line names ``text`` (read from /proc, nothing is signalled)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_ctrl_c_stops_everything_the_demo_started(demo_output: tuple[int, str, float]) -> None:
    """Without --once the demo keeps running until SIGINT, then stops every process and removes its folder."""
    demo = subprocess.Popen([str(GPUGATE), "demo"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        else:
            raise AssertionError("the demo ended before it was ready:\n" + "".join(lines))
        [export] = [line for line in lines if line.startswith("export KUBECONFIG=")]
        workdir = str(Path(export.split("=", 1)[1].split()[0]).parent)
        assert _processes_mentioning(workdir), "etcd and kube-apiserver run from the demo's folder"
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=90)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, "".join(lines) + rest
    assert "stopping" in rest
    assert _processes_mentioning(workdir) == []
    assert not Path(workdir).exists()


def _descendants(pid: int) -> dict[int, str]:
    """Every process under ``pid`` and its command line, from /proc (the demo's servers run in
    sessions of their own, so a process group would miss them)."""
    parents: dict[int, int] = {}
    lines: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                lines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found[child] = lines[child]
                frontier.append(child)
    return found


def _alive(pid: int, cmdline: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        now = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return now == cmdline and stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_ctrl_c_while_starting_stops_what_had_started_and_says_so(demo_output: tuple[int, str, float]) -> None:
    """A Ctrl-C before the table unwinds: etcd, kube-apiserver, the scheduler and gpugate serve are
    stopped, and the demo ends with 130 (as a shell reports Ctrl-C) and a line saying what it did."""
    demo = subprocess.Popen([str(GPUGATE), "demo"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("gpugate serve at"):
                break
        else:
            raise AssertionError("the demo ended before it started the server:\n" + "".join(lines))
        started = _descendants(demo.pid)
        assert any("kube-apiserver" in line for line in started.values()), started
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=90)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 130, "".join(lines) + rest
    assert "SIGINT while starting: stopped everything the demo had started" in rest, rest
    assert "Aborted" not in rest and "Traceback" not in rest, rest
    assert [line for pid, line in started.items() if _alive(pid, line)] == []
