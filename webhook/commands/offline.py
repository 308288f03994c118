"""Offline commands: shape a pod as the webhook would, check and test a policy folder. No cluster."""

from __future__ import annotations

import difflib
import io
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import jsonpatch
import yaml

from webhook.admission import cases, chain, dra
from webhook.errors import PolicyLoadError
from webhook.kube.documents import read_admission_file
from webhook.kube.inventory import EMPTY, Inventory
from webhook.policy import loading
from webhook.server import inventoryfile

DEFAULT_POLICIES = Path("policies")


def policies_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--policies", "policy_dir", type=click.Path(file_okay=False, path_type=Path),
                        default=DEFAULT_POLICIES, show_default=True,
                        help="Folder of GPUPolicy YAML files.")(function)


def namespace_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--namespace", "-n", default=None,
                        help="Namespace of the admission request (default: the pod's, else 'default').")(function)


def inventory_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--inventory", "inventory_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        help="The balancer's GPUInventory (inventory.json of ConfigMap gpugate-inventory), judged "
                        "now as gpugate serve --inventory judges it [default: none: no right-sizing by what "
                        "is free].")(function)


def _inventory(inventory_file: Path | None) -> tuple[Inventory, datetime]:
    """The inventory and the time to judge its age by: the server's clock rule, so offline and
    server give one answer for one file."""
    return (inventoryfile.read(inventory_file) if inventory_file else EMPTY), datetime.now(UTC)


def _namespace(pod: dict, namespace: str | None) -> str:
    return namespace or (pod.get("metadata") or {}).get("namespace") or "default"


def _yaml(obj: object) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)


def _patched_text(text: str, patch: list[dict[str, Any]]) -> str:
    """``text`` (the pod file as written) with ``patch`` applied, its comments, quoting, flow style
    and list indentation kept, so ``-o diff`` shows only what the webhook changes, against the file."""
    if text.lstrip().startswith("{"):  # JSON: the same JSON, indented
        return json.dumps(jsonpatch.apply_patch(json.loads(text), patch), indent=2) + "\n"
    from ruamel.yaml import YAML

    editor = YAML()
    editor.preserve_quotes = True
    editor.width = 4096
    indented = re.search(r"^( *)[^\s#-][^\n]*:\n\1( +)- ", text, re.MULTILINE)  # "key:\n  - item" style
    if indented:
        offset = len(indented.group(2))
        editor.indent(mapping=2, sequence=offset + 2, offset=offset)
    out = io.StringIO()
    editor.dump(jsonpatch.apply_patch(editor.load(text), patch), out)
    return out.getvalue()


@click.command()
@click.argument("pod_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@policies_option
@namespace_option
@inventory_option
@click.option("-o", "--output", type=click.Choice(["yaml", "json", "patch", "diff"]), default="yaml",
              show_default=True, help="The mutated pod, the JSON patch, or a unified diff of the file.")
def mutate(pod_file: Path, policy_dir: Path, namespace: str | None, inventory_file: Path | None, output: str) -> None:
    """Print POD_FILE as the webhook would admit it (exit 1 when it would be denied).

    POD_FILE holds a Pod (optionally followed by the ResourceClaims and templates it references,
    so their devices count toward the policy's max per pod), a ResourceClaim or a ResourceClaimTemplate.
    """
    document = read_admission_file(pod_file)
    pod = document.subject
    policies = loading.load_dir(policy_dir)
    ns = _namespace(pod, namespace)
    inventory, now = _inventory(inventory_file)
    outcome = chain.admit(pod, namespace=ns, policies=policies, inventory=inventory, now=now,
                          resolved=dra.resolve_documents(document.claims))
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
        text = pod_file.read_text(encoding="utf-8")
        before = text.splitlines(keepends=True)
        after = _patched_text(text, list(result.patch)).splitlines(keepends=True)
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
@inventory_option
def validate(pod_file: Path, policy_dir: Path, namespace: str | None, inventory_file: Path | None) -> None:
    """Say whether POD_FILE (a Pod, then the claims it references; or a ResourceClaim or template),
    as written, would be allowed (exit 1 when denied)."""
    document = read_admission_file(pod_file)
    pod = document.subject
    inventory, now = _inventory(inventory_file)
    verdict = chain.validate(pod, namespace=_namespace(pod, namespace), policies=loading.load_dir(policy_dir),
                             inventory=inventory, now=now, resolved=dra.resolve_documents(document.claims))
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
@click.option("--allow-empty-policies", is_flag=True,
              help="Accept a folder with no GPUPolicy, as gpugate serve --allow-empty-policies does.")
def check(policy_dir: Path, allow_empty_policies: bool) -> None:
    """Exit 0 when POLICY_DIR (default: policies) is a set gpugate serve loads; else list every problem, exit 1."""
    try:
        policies = loading.load_servable(policy_dir, allow_empty=allow_empty_policies)
    except PolicyLoadError as err:
        for problem in err.problems:
            click.echo(problem, err=True)
        click.echo(f"{len(err.problems)} problem(s) in {policy_dir}", err=True)
        raise click.exceptions.Exit(1) from err
    count = len(policies.policies)
    click.echo(f"{policy_dir}: {count} {'policy' if count == 1 else 'policies'} valid, revision {policies.revision}")


@policy.command("test", short_help="Run a folder's golden cases (default: policies).")
@click.argument("policy_dir", type=click.Path(path_type=Path), default=DEFAULT_POLICIES)
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the results as JUnit XML to this file (its folder must exist).")
@inventory_option
def test_command(policy_dir: Path, junit: Path | None, inventory_file: Path | None) -> None:
    """Run the golden cases under POLICY_DIR/tests/ (default: policies) and exit 1 on any failure."""
    if junit is not None and not junit.parent.is_dir():
        # Checked first: a report that cannot be written is an error before the cases run, not after.
        raise click.BadParameter(f"folder {junit.parent} does not exist", param_hint="--junit")
    inventory, now = _inventory(inventory_file)
    results = cases.run_all(policy_dir, inventory=inventory, now=now)
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
