"""What a new user hits first: every failure is a message that names the thing and the fix.

Each case was a traceback or a misleading message before; the CLI runs as a user runs it.
"""

from __future__ import annotations

import socket
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from webhook.cli import COMMANDS, SUMMARIES, main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "webhook" / "examples" / "pod-training.yaml"


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), env=env)


def no_traceback(result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output


def command_lines(output: str) -> list[str]:
    return output.split("Commands:", 1)[1].strip().splitlines()


def test_every_summary_in_help_ends_where_it_should() -> None:
    """click cuts a summary at ~45 characters with '...'; each one is written to fit instead."""
    result = run("--help")
    assert result.exit_code == 0
    assert not [line for line in command_lines(result.output) if line.endswith("...")]
    assert set(SUMMARIES) == set(COMMANDS)
    assert all(text.endswith(".") and len(text) <= 60 for text in SUMMARIES.values())
    policy = run("policy", "--help")
    assert not [line for line in command_lines(policy.output) if line.endswith("...")]
    assert "default: policies" in policy.output


@pytest.mark.parametrize("group", ["stack", "argocd", "policy"])
def test_every_subcommand_summary_fits_on_its_line(group: str) -> None:
    """click cut `gpugate stack --help` and `gpugate argocd --help` summaries with '...': each
    subcommand has an explicit short_help, a sentence that fits on its one line."""
    result = run(group, "--help")
    assert result.exit_code == 0
    lines = command_lines(result.output)
    command = main.get_command(click.Context(main), group)
    assert isinstance(command, click.Group)
    assert len(lines) == len(command.commands), lines  # one line each: nothing wrapped
    assert not [line for line in lines if line.endswith("...")]
    for name, sub in command.commands.items():
        assert sub.short_help and sub.short_help.endswith(".") and len(sub.short_help) <= 60, (name, sub.short_help)
        assert any(line.split(None, 1) == [name, sub.short_help] for line in lines), (name, lines)


def test_admit_takes_dash_n_like_mutate() -> None:
    assert "-n, --namespace" in run("admit", "--help").output


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_admit_with_a_ca_file_that_is_not_pem_says_so(tmp_path: Path) -> None:
    bad = tmp_path / "ca.crt"
    bad.write_text("not a certificate\n")
    result = run("admit", str(EXAMPLE), "--server", f"https://127.0.0.1:{closed_port()}", "--ca", str(bad))
    no_traceback(result)
    assert result.exit_code == 1 and f"--ca {bad}: not a PEM CA certificate" in result.output


def test_admit_on_a_binary_file_says_it_is_not_text(tmp_path: Path) -> None:
    blob = tmp_path / "pod.bin"
    blob.write_bytes(b"\xff\xfe\x00\x81binary")
    result = run("admit", str(blob), "--server", f"https://127.0.0.1:{closed_port()}")
    no_traceback(result)
    assert result.exit_code == 1 and "not UTF-8 text" in result.output


def test_admit_on_two_documents_says_how_many(tmp_path: Path) -> None:
    two = tmp_path / "pods.yaml"
    two.write_text(EXAMPLE.read_text() + "\n---\n" + EXAMPLE.read_text())
    result = run("admit", str(two), "--server", f"https://127.0.0.1:{closed_port()}")
    no_traceback(result)
    assert result.exit_code == 1 and "expected exactly one document, found 2" in result.output


def test_policy_test_checks_the_junit_folder_before_running_the_cases(tmp_path: Path) -> None:
    result = run("policy", "test", str(REPO / "policies"), "--junit", str(tmp_path / "missing" / "out.xml"))
    assert result.exit_code == 2 and "does not exist" in result.output and "PASS" not in result.output


def test_policy_check_on_a_missing_folder_says_no_such_folder(tmp_path: Path) -> None:
    result = run("policy", "check", str(tmp_path / "nope"))
    assert result.exit_code == 1 and "no such folder" in result.output


@pytest.mark.parametrize("args", [["certs", "--secret", "gpugate-system/tls", "--patch-webhooks", "gpugate-webhook"]])
def test_cluster_commands_without_a_kubeconfig_say_how_to_point_at_a_cluster(tmp_path: Path, args) -> None:
    env = {"KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    result = run(*args, env=env)
    no_traceback(result)
    assert result.exit_code == 1 and "no cluster to talk to" in result.output and "--server" in result.output


def test_cluster_commands_against_a_server_that_does_not_answer_say_so() -> None:
    result = run("certs", "--secret", "gpugate-system/tls", "--server", f"http://127.0.0.1:{closed_port()}")
    no_traceback(result)
    assert result.exit_code == 1 and "does not answer" in result.output


def test_replay_device_allocation_names_the_device_plugins_real_option() -> None:
    """The help said `--allocation-policy` (the first draft of NVIDIA/k8s-device-plugin PR #1621); the
    released flag is `--shared-devices-allocation-policy` (v0.20.0, config
    flags.plugin.sharedDevicesAllocationPolicy), as docs/placement.md says."""
    replay = main.get_command(click.Context(main), "replay")
    assert replay is not None
    option = next(p for p in replay.params if "--device-allocation" in p.opts)
    text = option.help or ""
    assert "--shared-devices-allocation-policy packed" in text and "--allocation-policy packed" not in text
    assert "flags.plugin.sharedDevicesAllocationPolicy" in text
    doc = (REPO / "docs" / "placement.md").read_text(encoding="utf-8")
    assert "--shared-devices-allocation-policy" in doc and "sharedDevicesAllocationPolicy" in doc


def test_certs_out_help_says_a_valid_bundle_is_kept() -> None:
    certs = main.get_command(click.Context(main), "certs")
    assert certs is not None
    text = next(p for p in certs.params if p.name == "out").help or ""
    assert "valid bundle already there is kept" in text and "--renew-within" in text


def test_certs_out_keeps_a_valid_bundle_and_replaces_one_for_another_service(tmp_path: Path) -> None:
    first = run("certs", "--out", str(tmp_path))
    assert first.exit_code == 0 and "created" in first.output
    kept = (tmp_path / "tls.crt").read_bytes()
    again = run("certs", "--out", str(tmp_path))
    assert again.exit_code == 0 and "unchanged" in again.output and (tmp_path / "tls.crt").read_bytes() == kept
    other = run("certs", "--out", str(tmp_path), "--service", "other")
    assert other.exit_code == 0 and "renewed" in other.output and (tmp_path / "tls.crt").read_bytes() != kept


@pytest.mark.parametrize("figure", ["92.91", "95.23"])
def test_the_docs_say_which_allocation_figures_are_published(figure: str) -> None:
    """The FGD paper's figures appear beside measured ones; each mention in prose (the README and the
    manual; table rows have their own headers) says it is the published one."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    prose = " ".join(line for page in pages for line in page.read_text(encoding="utf-8").splitlines()
                     if not line.lstrip().startswith("|"))
    sentences = [s for s in prose.split(". ") if figure in s]
    assert sentences, f"{figure} is no longer quoted; drop this case"
    assert all("publish" in s for s in sentences), sentences
