"""Every `gpugate stack` command of docs/stack.md runs as the page says, in a temp clone.

The examples were no-ops on the shipped pins and printed "FAIL changes ... nothing to commit"
right above "commits (1): ... [this run]". Each fenced block runs here in a fresh clone of the
repository's manifests (``stack_repo``), from the folder of the clone as a reader would, with the
commands exactly as written: each must exit 0, never say "nothing to commit", and make one commit
when it commits (upgrade, promote, sync, rollback) or none when it only looks (plan, --check,
status). A block that needs another starting point than the shipped stack.yaml says so in the
page; ``SETUPS`` builds that starting point and is checked to be used, so it cannot go stale.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.kubefake import FakeKube, fake_kube  # noqa: F401 - pytest fixture
from tests.stack.conftest import ROOT, git
from tests.stack.test_status import populate
from webhook.cli import main
from webhook.stack import manifests

DOC = ROOT / "docs" / "stack.md"
LOOKS = {"plan", "status"}
"""Subcommands that never commit (besides any subcommand run with --check)."""


@dataclass(frozen=True)
class Example:
    heading: str
    commands: tuple[tuple[str, ...], ...]
    """argv after ``gpugate`` of each command, in the order of the block."""

    @property
    def id(self) -> str:
        return f"{self.heading}: {' '.join(self.commands[0])}"


def examples(text: str) -> list[Example]:
    """The fenced code blocks of ``text`` that hold `gpugate stack` commands (comments dropped)."""
    found: list[Example] = []
    heading = ""
    block: list[tuple[str, ...]] | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            if block is None:
                block = []
            else:
                if block:
                    found.append(Example(heading=heading, commands=tuple(block)))
                block = None
            continue
        if block is None:
            if line.startswith("## "):
                heading = line[3:].strip()
            continue
        if not line.strip().startswith("gpugate stack"):
            continue  # output or YAML in a block, not a command (it need not parse as a shell line)
        argv = shlex.split(line, comments=True)
        block.append(tuple(argv[1:]))
    return found


def _edit_stack(repo: Path, change: Callable[[dict], None]) -> None:
    data = yaml.safe_load((repo / manifests.STACK_FILE).read_text())
    change(data)
    (repo / manifests.STACK_FILE).write_text(yaml.safe_dump(data, sort_keys=False))


def _from_clusterpolicy_at_v26_3_3(repo: Path, set_stack) -> None:
    """"for example a stack at v26.3.3 with `driver.management: clusterpolicy`" (the migration block)."""
    set_stack(operator_version="v26.3.3", management="clusterpolicy", pools={"default": {"driver": "580.126.20"}},
              message="stack at v26.3.3, ClusterPolicy manages the driver")


def _pause_the_canary_pool(repo: Path, set_stack) -> None:
    """"edit `stack.yaml` only" (the sync block): pause a pool with upgradePolicy.autoUpgrade: false."""
    _edit_stack(repo, lambda d: d["pools"][1]["upgradePolicy"].update(autoUpgrade=False))


# The first command of a block -> the starting point its text names (else the shipped stack.yaml).
SETUPS: dict[tuple[str, ...], Callable[[Path, Callable[..., object]], None]] = {
    ("stack", "upgrade", "--operator", "v26.7.0", "--driver-management", "nvidiadriver"):
        _from_clusterpolicy_at_v26_3_3,
    ("stack", "sync", "--check"): _pause_the_canary_pool,
}

def _canary_pool_done(fk: FakeKube) -> None:
    """"once they are" (the canary block): promote's gate reads every canary node upgrade-done at the
    canary's driver, as NVIDIA's upgrade library and GFD label them."""
    from tests.stack.test_status import node

    for name in ("gpu-d", "gpu-e"):
        done = node(name, owner="canary", state="upgrade-done", pool_label="canary")
        done["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"] = "610.57.04"
        fk.put(done)


# The first command of a block -> what the cluster shows when the page's text says it does.
CLUSTERS: dict[tuple[str, ...], Callable[[FakeKube], None]] = {
    ("stack", "upgrade", "--operator", "v26.7.0", "--driver", "610.57.04", "--pool", "canary"): _canary_pool_done,
}

EXAMPLES = examples(DOC.read_text(encoding="utf-8"))


def test_the_page_has_examples_and_every_setup_belongs_to_one() -> None:
    assert len(EXAMPLES) >= 4
    assert set(SETUPS) <= {e.commands[0] for e in EXAMPLES}
    assert set(CLUSTERS) <= {e.commands[0] for e in EXAMPLES}


def test_the_parser_reads_commands_and_drops_comments() -> None:
    text = "## A\n```sh\ngpugate stack plan --operator v1   # read\n# push first\nkubectl get nodes\n```\n"
    assert examples(text) == [Example(heading="A", commands=(("stack", "plan", "--operator", "v1"),))]


def _use_fake_cluster(fk: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status --kube` without --server reads the kubeconfig: point one at the fake API server."""
    from kubernetes import client
    from kubernetes.config import kube_config

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fk.url}}],
        "users": [{"name": "fake", "user": {"token": "doc-example"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.setattr(client.Configuration, "_default", None)  # load_kube_config sets a process default
    populate(fk)


def _commits(repo: Path) -> list[str]:
    return git(repo, "rev-list", "HEAD").split()


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_every_example_of_docs_stack_md_runs_as_the_page_says(example: Example, stack_repo: Path, set_stack,
                                                             fake_kube: FakeKube, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    setup = SETUPS.get(example.commands[0])
    if setup is not None:
        setup(stack_repo, set_stack)
    if any("--kube" in argv and "--server" not in argv for argv in example.commands):
        _use_fake_cluster(fake_kube, tmp_path, monkeypatch)
    if example.commands[0] in CLUSTERS:
        CLUSTERS[example.commands[0]](fake_kube)
    monkeypatch.chdir(stack_repo)
    for argv in example.commands:
        before = _commits(stack_repo)
        result = CliRunner().invoke(main, list(argv))
        shown = f"$ gpugate {' '.join(argv)}\n{result.output}"
        assert result.exception is None or isinstance(result.exception, SystemExit), shown
        assert result.exit_code == 0, shown
        assert "nothing to commit" not in result.output, shown
        listed = re.findall(r"^commits \((\d+)\):$", result.output, flags=re.M)
        assert "FAIL  " not in result.output.split("commits (")[0] or not listed, shown
        if argv[1] == "status" and "--kube" in argv:  # it asked the (fake) cluster, through the kubeconfig
            assert "Cluster (kubeconfig / in-cluster):" in result.output and "NVIDIADriver canary:" in result.output
        after = _commits(stack_repo)
        commits = argv[1] not in LOOKS and "--check" not in argv
        assert len(after) - len(before) == (1 if commits else 0), shown
        if commits:
            assert after[1:] == before, shown
            subject = git(stack_repo, "log", "-n1", "--format=%s").strip()
            assert f"committed {after[0][:12]}: {subject}" in result.output, shown
            assert git(stack_repo, "status", "--porcelain") == "", shown
