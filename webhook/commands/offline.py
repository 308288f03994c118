"""Offline commands: shape a pod as the webhook would, check and test a policy folder. No cluster."""

from __future__ import annotations

import difflib
import io
import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import jsonpatch
import yaml

from webhook.admission import chain, dra, judgement, rightsizing, workloads
from webhook.errors import InputError, PolicyLoadError
from webhook.kube import documents
from webhook.kube.inventory import EMPTY, Inventory
from webhook.offline import cases
from webhook.policy import PolicySet, loading
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


def _inventory(inventory_file: Path | None, policies: PolicySet) -> tuple[Inventory, datetime]:
    """The inventory and the time to judge its age by: the server's clock rule, so offline and
    server give one answer for one file. A file too old for a policy's right-sizing is said on
    stderr (the server ignores it the same way, and so does this command)."""
    now = datetime.now(UTC)
    if inventory_file is None:
        return EMPTY, now
    inventory = inventoryfile.read(inventory_file)
    limits = sorted({p.rightsizing.max_inventory_age_seconds for p in policies.policies if p.rightsizing})
    if limits and not inventory.fresh(now, limits[0]):
        click.echo(f"warning: --inventory {inventory_file}: {rightsizing.stale(inventory, now, limits[0])}; "
                   f"right-sizing ignores it, as gpugate serve would", err=True)
    return inventory, now


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


def _read(files: tuple[str, ...], *, with_workloads: bool) -> list[documents.Subject]:
    """The subjects of FILES (``-`` for stdin, folders recursively); other kinds in them are said on stderr."""
    found, skipped = documents.read_inputs(files, lambda: sys.stdin.read(),
                                           workload=lambda d: workloads.kind_of_document(d) is not None)
    if skipped:
        click.echo(f"note: left out {skipped} document(s) that are not a Pod, a DRA claim or a workload", err=True)
    for subject in found:
        kind = workloads.kind_of_document(subject.file.subject)
        if kind is not None and not with_workloads:
            raise InputError(f"{subject.source}: a {kind.kind} is not mutated (the webhook shapes its pods as they "
                             f"are created); `gpugate validate {subject.source}` judges its pod template and shows "
                             f"the warnings its pods get")
    return found


def files_argument(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.argument("files", nargs=-1, required=True, metavar="FILE...")(function)


@click.command()
@files_argument
@policies_option
@namespace_option
@inventory_option
@click.option("-o", "--output", type=click.Choice(["yaml", "json", "patch", "diff"]), default="yaml",
              show_default=True, help="The mutated pod, the JSON patch, or a unified diff of the file.")
def mutate(files: tuple[str, ...], policy_dir: Path, namespace: str | None, inventory_file: Path | None,
           output: str) -> None:
    """Print each pod of FILE... as the webhook would admit it (exit 1 when one would be denied).

    A FILE holds a Pod (optionally followed by the ResourceClaims and templates it references, so
    their devices count toward the policy's max per pod), a ResourceClaim or a ResourceClaimTemplate,
    or several of these; a folder is read for its *.yaml, *.yml and *.json files; - reads stdin.
    """
    subjects = _read(files, with_workloads=False)
    policies = loading.load_dir(policy_dir)
    inventory, now = _inventory(inventory_file, policies)
    if output == "diff" and any(s.path is None for s in subjects):
        raise InputError("-o diff shows changes against a file holding one pod; give such files, or -o yaml")
    many = len(subjects) > 1
    shown: list[Any] = []
    denied = False
    for subject in subjects:
        pod = subject.file.subject
        ns = _namespace(pod, namespace)
        outcome = chain.admit(pod, namespace=ns, policies=policies, inventory=inventory, now=now,
                              resolved=dra.resolve_documents(subject.file.claims))
        tag = f"{subject.source}: " if many else ""
        for warning in outcome.warnings:
            click.echo(f"warning: {tag}{warning}", err=True)
        if not outcome.allowed:
            denied = True
            for reason in outcome.reasons:
                click.echo(f"denied: {tag}{reason}", err=True)
            continue
        if outcome.mutation.policy is None:
            what = "claim" if subject.file.is_claim else "pod"
            click.echo(f"note: {tag}no policy in {policy_dir} applies to this {what} in namespace '{ns}'", err=True)
        shown.append(_shown(subject, outcome, output))
    _print_mutated(shown, output, many)
    if denied:
        raise click.exceptions.Exit(1)


def _shown(subject: documents.Subject, outcome: chain.Admission, output: str) -> Any:
    if output == "patch":
        return list(outcome.mutation.patch)
    if output == "diff":
        assert subject.path is not None
        text = subject.path.read_text(encoding="utf-8")
        after = _patched_text(text, list(outcome.mutation.patch)).splitlines(keepends=True)
        return "".join(difflib.unified_diff(text.splitlines(keepends=True), after, str(subject.path),
                                            f"{subject.path} (mutated)"))
    return outcome.stored


def _print_mutated(shown: list[Any], output: str, many: bool) -> None:
    if not shown:
        return
    if output == "diff":
        click.echo("".join(shown), nl=False)
    elif output in ("json", "patch"):
        click.echo(json.dumps(shown if many else shown[0], indent=2))
    else:
        click.echo("---\n".join(_yaml(item) for item in shown), nl=False)


@click.command()
@files_argument
@policies_option
@namespace_option
@inventory_option
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="One line per verdict, or a JSON list of them.")
def validate(files: tuple[str, ...], policy_dir: Path, namespace: str | None, inventory_file: Path | None,
             output: str) -> None:
    """Say whether the cluster would admit each pod, claim or workload of FILE... (exit 1 when one is denied).

    Runs what the API server runs: the mutating webhook (whose refusals count), then the validating
    one on the mutated pod. A workload (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob,
    JobSet) is judged by its pod template, as the webhook judges it at apply. A FILE may hold several
    objects (a pod is followed by the claims it references); a folder is read for its *.yaml, *.yml
    and *.json files; - reads stdin.
    """
    subjects = _read(files, with_workloads=True)
    policies = loading.load_dir(policy_dir)
    inventory, now = _inventory(inventory_file, policies)
    verdicts = [judgement.judge(s.file.subject, source=s.source, namespace=_namespace(s.file.subject, namespace),
                                policies=policies, inventory=inventory, now=now, claims=s.file.claims)
                 for s in subjects]
    if output == "json":
        click.echo(json.dumps([v.as_dict() for v in verdicts], indent=2))
    else:
        many = len(verdicts) > 1
        for verdict in verdicts:
            tag = f"{verdict.source}: " if many else ""
            for warning in verdict.warnings:
                click.echo(f"warning: {tag}{warning}", err=True)
            click.echo(tag + verdict.line())
    if any(not v.allowed for v in verdicts):
        raise click.exceptions.Exit(1)


@click.group(short_help="Check and test a folder of GPUPolicy files.")
def policy() -> None:
    """Check and test a folder of GPUPolicy files before committing it."""


def _output_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
                        help="Lines for a person, or one JSON document.")(function)


@policy.command(short_help="Check every policy in a folder (default: policies).")
@click.argument("policy_dir", type=click.Path(path_type=Path), default=DEFAULT_POLICIES)
@click.option("--allow-empty-policies", is_flag=True,
              help="Accept a folder with no GPUPolicy, as gpugate serve --allow-empty-policies does.")
@_output_option
def check(policy_dir: Path, allow_empty_policies: bool, output: str) -> None:
    """Exit 0 when POLICY_DIR (default: policies) is a set gpugate serve loads and its kustomization.yaml
    (if any) lists every policy file; else list every problem, exit 1."""
    problems: list[str] = []
    policies = None
    try:
        policies = loading.load_servable(policy_dir, allow_empty=allow_empty_policies)
    except PolicyLoadError as err:
        problems += err.problems
    if policy_dir.is_dir():
        problems += loading.unlisted_in_kustomization(policy_dir)
    if output == "json":
        click.echo(json.dumps({"folder": str(policy_dir), "valid": not problems, "problems": problems,
                               "revision": policies.revision if policies else None,
                               "policies": [p.name for p in policies.policies] if policies else []}, indent=2))
    elif problems:
        for problem in problems:
            click.echo(problem, err=True)
        click.echo(f"{len(problems)} problem(s) in {policy_dir}", err=True)
    elif policies is not None:
        count = len(policies.policies)
        noun = "policy" if count == 1 else "policies"
        click.echo(f"{policy_dir}: {count} {noun} valid, revision {policies.revision}")
    if problems:
        raise click.exceptions.Exit(1)


@policy.command("test", short_help="Run a folder's golden cases (default: policies).")
@click.argument("policy_dir", type=click.Path(path_type=Path), default=DEFAULT_POLICIES)
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the results as JUnit XML to this file (its folder must exist).")
@inventory_option
@_output_option
def test_command(policy_dir: Path, junit: Path | None, inventory_file: Path | None, output: str) -> None:
    """Run the golden cases under POLICY_DIR/tests/ (default: policies) and exit 1 on any failure."""
    if junit is not None and not junit.parent.is_dir():
        # Checked first: a report that cannot be written is an error before the cases run, not after.
        raise click.BadParameter(f"folder {junit.parent} does not exist", param_hint="--junit")
    try:
        inventory, now = _inventory(inventory_file, loading.load_dir(policy_dir))
    except PolicyLoadError:  # the runner reports the folder's problems itself
        inventory, now = _inventory(inventory_file, PolicySet.empty())
    results = cases.run_all(policy_dir, inventory=inventory, now=now)
    if not results:
        click.echo(f"no test cases under {policy_dir / 'tests'} (each case is a folder with case.yaml)", err=True)
        raise click.exceptions.Exit(1)
    failed = sum(not r.passed for r in results)
    if junit:
        junit.write_bytes(cases.junit_xml(results))
    if output == "json":
        click.echo(json.dumps({"folder": str(policy_dir), "passed": len(results) - failed, "failed": failed,
                               "cases": [{"name": r.name, "passed": r.passed, "detail": r.detail or None}
                                         for r in results]}, indent=2))
    else:
        for result in results:
            click.echo(f"{'PASS' if result.passed else 'FAIL'}  {result.name}")
            if not result.passed:
                click.echo("      " + result.detail.replace("\n", "\n      "))
        click.echo(f"{len(results) - failed} passed, {failed} failed")
    if failed:
        raise click.exceptions.Exit(1)
