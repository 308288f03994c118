"""Offline commands: shape a pod as the webhook would, check and test a policy folder. No cluster."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from webhook.admission import chain, dra
from webhook.errors import PolicyLoadError
from webhook.kube.documents import read_admission_file
from webhook.policy import cases, loading

DEFAULT_POLICIES = Path("policies")


def policies_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--policies", "policy_dir", type=click.Path(file_okay=False, path_type=Path),
                        default=DEFAULT_POLICIES, show_default=True,
                        help="Folder of GPUPolicy YAML files.")(function)


def namespace_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--namespace", "-n", default=None,
                        help="Namespace of the admission request (default: the pod's, else 'default').")(function)


def _namespace(pod: dict, namespace: str | None) -> str:
    return namespace or (pod.get("metadata") or {}).get("namespace") or "default"


def _yaml(obj: object) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)


@click.command()
@click.argument("pod_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@policies_option
@namespace_option
@click.option("-o", "--output", type=click.Choice(["yaml", "json", "patch", "diff"]), default="yaml",
              show_default=True, help="The mutated pod, the JSON patch, or a unified diff.")
def mutate(pod_file: Path, policy_dir: Path, namespace: str | None, output: str) -> None:
    """Print POD_FILE as the webhook would admit it (exit 1 when it would be denied).

    POD_FILE holds a Pod (optionally followed by the ResourceClaims and templates it references,
    so their devices count toward the policy's max per pod), a ResourceClaim or a ResourceClaimTemplate.
    """
    document = read_admission_file(pod_file)
    pod = document.subject
    policies = loading.load_dir(policy_dir)
    ns = _namespace(pod, namespace)
    outcome = chain.admit(pod, namespace=ns, policies=policies, resolved=dra.resolve_documents(document.claims))
    result = outcome.mutation
    for warning in outcome.warnings:
        click.echo(f"warning: {warning}", err=True)
    if not outcome.allowed:
        for reason in outcome.reasons:
            click.echo(f"denied: {reason}", err=True)
        raise click.exceptions.Exit(1)
    mutated = outcome.stored
    if output == "json":
        click.echo(json.dumps(mutated, indent=2))
    elif output == "patch":
        click.echo(json.dumps(list(result.patch), indent=2))
    elif output == "diff":
        before, after = _yaml(pod).splitlines(keepends=True), _yaml(mutated).splitlines(keepends=True)
        click.echo("".join(difflib.unified_diff(before, after, f"{pod_file}", f"{pod_file} (mutated)")), nl=False)
    else:
        click.echo(_yaml(mutated), nl=False)
    if result.policy is None:
        what = "claim" if document.is_claim else "pod"
        click.echo(f"note: no policy in {policy_dir} applies to this {what} in namespace '{ns}'", err=True)


@click.command()
@click.argument("pod_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@policies_option
@namespace_option
def validate(pod_file: Path, policy_dir: Path, namespace: str | None) -> None:
    """Say whether POD_FILE (a Pod, then the claims it references; or a ResourceClaim or template),
    as written, would be allowed (exit 1 when denied)."""
    document = read_admission_file(pod_file)
    pod = document.subject
    verdict = chain.validate(pod, namespace=_namespace(pod, namespace), policies=loading.load_dir(policy_dir),
                             resolved=dra.resolve_documents(document.claims))
    for warning in verdict.warnings:
        click.echo(f"warning: {warning}", err=True)
    if not verdict.allowed:
        for reason in verdict.reasons:
            click.echo(f"denied: {reason}")
        raise click.exceptions.Exit(1)
    click.echo(f"allowed (policy {verdict.policy or 'none'})")


@click.group(short_help="Check and test a folder of GPUPolicy files.")
def policy() -> None:
    """Check and test a folder of GPUPolicy files before committing it."""


@policy.command(short_help="Check every policy in a folder (default: policies).")
@click.argument("policy_dir", type=click.Path(path_type=Path), default=DEFAULT_POLICIES)
def check(policy_dir: Path) -> None:
    """Exit 0 when every policy in POLICY_DIR (default: policies) is valid; else list every problem, exit 1."""
    try:
        policies = loading.load_dir(policy_dir)
    except PolicyLoadError as err:
        for problem in err.problems:
            click.echo(problem, err=True)
        click.echo(f"{len(err.problems)} problem(s) in {policy_dir}", err=True)
        raise click.exceptions.Exit(1) from err
    click.echo(f"{policy_dir}: {len(policies.policies)} policies valid, revision {policies.revision}")


@policy.command("test", short_help="Run a folder's golden cases (default: policies).")
@click.argument("policy_dir", type=click.Path(path_type=Path), default=DEFAULT_POLICIES)
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the results as JUnit XML to this file (its folder must exist).")
def test_command(policy_dir: Path, junit: Path | None) -> None:
    """Run the golden cases under POLICY_DIR/tests/ (default: policies) and exit 1 on any failure."""
    if junit is not None and not junit.parent.is_dir():
        # Checked first: a report that cannot be written is an error before the cases run, not after.
        raise click.BadParameter(f"folder {junit.parent} does not exist", param_hint="--junit")
    results = cases.run_all(policy_dir)
    if not results:
        click.echo(f"no test cases under {policy_dir / 'tests'} (each case is a folder with case.yaml)", err=True)
        raise click.exceptions.Exit(1)
    for result in results:
        click.echo(f"{'PASS' if result.passed else 'FAIL'}  {result.name}")
        if not result.passed:
            click.echo("      " + result.detail.replace("\n", "\n      "))
    failed = sum(not r.passed for r in results)
    if junit:
        junit.write_bytes(cases.junit_xml(results))
    click.echo(f"{len(results) - failed} passed, {failed} failed")
    if failed:
        raise click.exceptions.Exit(1)
