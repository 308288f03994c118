"""Read Pods, DRA claims and workloads from YAML or JSON files, folders or standard input; anything
else is refused (or, among many inputs, counted as left out) with a message that points."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.errors import InputError
from webhook.kube import claims, yamlload
from webhook.kube.pods import Pod


@dataclass(frozen=True, slots=True)
class AdmissionFile:
    """What ``gpugate mutate|validate`` and a golden case judge: the object, and the claims and
    templates written after a pod in the same file (what its ``spec.resourceClaims`` name)."""

    subject: dict[str, Any]
    claims: tuple[dict[str, Any], ...] = ()

    @property
    def is_claim(self) -> bool:
        return claims.is_claim_document(self.subject)


def read_admission_file(path: Path) -> AdmissionFile:
    """One Pod, one ResourceClaim or ResourceClaimTemplate, or a Pod followed by the claims and
    templates it references; errors name the file and the document."""
    documents = _read_all(path)
    first = documents[0]
    if claims.is_claim_document(first):
        if len(documents) > 1:
            raise InputError(f"{path}: a ResourceClaim or ResourceClaimTemplate file holds that one document, "
                             f"found {len(documents)}")
        _check_claim(path, first)
        return AdmissionFile(first)
    if first.get("kind") != "Pod" or first.get("apiVersion") != "v1":
        raise InputError(f"{path}: expected apiVersion v1 and kind Pod, or a ResourceClaim or ResourceClaimTemplate "
                         f"of resource.k8s.io, got {first.get('apiVersion')!r} {first.get('kind')!r}")
    _check_pod(path, first)
    for i, document in enumerate(documents[1:], start=2):
        if not claims.is_claim_document(document):
            raise InputError(f"{path}, document {i}: after the pod, only the ResourceClaims and "
                             f"ResourceClaimTemplates it references; got {document.get('kind')!r}")
        _check_claim(path, document)
    return AdmissionFile(first, tuple(documents[1:]))


def _check_claim(path: Path, document: dict[str, Any]) -> None:
    try:
        claims.parse(document)
    except claims.ClaimError as err:
        raise InputError(f"{path}: {document.get('kind')} '{claims.display_name(document)}': {err}") from err


def read_pod(path: Path) -> Pod:
    """One Pod document (apiVersion v1, kind Pod); errors name the file and the YAML position."""
    pod = read_one(path)
    if pod.get("kind") != "Pod" or pod.get("apiVersion") != "v1":
        raise InputError(f"{path}: expected apiVersion v1 and kind Pod, got "
                         f"{pod.get('apiVersion')!r} {pod.get('kind')!r}")
    _check_pod(path, pod)
    return pod


def read_one(path: Path) -> dict[str, Any]:
    """The one YAML or JSON mapping in ``path``; errors name the file and what is wrong with it."""
    documents = _read_all(path)
    if len(documents) != 1:
        raise InputError(f"{path}: expected exactly one document, found {len(documents)}")
    return documents[0]


def _read_all(path: Path) -> list[dict[str, Any]]:
    """The YAML or JSON mappings in ``path`` (at least one); errors name the file and what is wrong."""
    documents = parse_documents(_text(path), str(path))
    if not documents:
        raise InputError(f"{path}: expected exactly one document, found 0")
    return documents


def parse_documents(text: str, where: str) -> list[dict[str, Any]]:
    """The YAML or JSON mappings of ``text`` (empty documents dropped); errors name ``where``."""
    try:
        documents = [d for d in yamlload.load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise InputError(f"{where}{yamlload.describe_error(err)}") from err
    for document in documents:
        if not isinstance(document, dict):
            raise InputError(f"{where}: expected a mapping, got {type(document).__name__}")
    return documents


def subjects(documents: list[dict[str, Any]], where: str, *,
             workload: Callable[[dict[str, Any]], bool] = lambda _: False) -> tuple[list[AdmissionFile], int]:
    """What to judge in a stream of documents, and how many of other kinds were left out.

    Each Pod, ResourceClaim or template, and each object ``workload`` accepts, is one subject; the
    claims and templates right after a pod go with it (what its ``spec.resourceClaims`` name), as
    in a golden case. A ``kind: List`` (``kubectl get -o yaml``) is read as its items.
    """
    found: list[AdmissionFile] = []
    skipped = 0
    pod_open = False
    for index, document in enumerate(_items(documents), start=1):
        here = f"{where}, document {index}"
        if claims.is_claim_document(document):
            _check_claim(Path(here), document)
            if pod_open:
                found[-1] = AdmissionFile(found[-1].subject, (*found[-1].claims, document))
                continue
            found.append(AdmissionFile(document))
        elif document.get("kind") == "Pod" and document.get("apiVersion") == "v1":
            _check_pod(Path(here), document)
            found.append(AdmissionFile(document))
            pod_open = True
            continue
        elif workload(document):
            found.append(AdmissionFile(document))
        else:
            skipped += 1
        pod_open = False
    return found, skipped


def _items(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for document in documents:
        items = document.get("items")
        if str(document.get("kind", "")).endswith("List") and isinstance(items, list):
            out.extend(item for item in items if isinstance(item, dict))
        else:
            out.append(document)
    return out


def _check_pod(path: Path, pod: dict[str, Any]) -> None:
    problems = []
    if not isinstance(pod.get("metadata", {}), dict):
        problems.append("metadata: expected a mapping")
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        problems.append("spec: expected a mapping")
    elif not isinstance(spec.get("containers"), list) or not spec["containers"]:
        problems.append("spec.containers: expected a non-empty list")
    else:
        for i, container in enumerate(spec["containers"]):
            if not isinstance(container, dict):
                problems.append(f"spec.containers[{i}]: expected a mapping")
            elif not isinstance(container.get("resources", {}), dict):
                problems.append(f"spec.containers[{i}].resources: expected a mapping")
    if problems:
        raise InputError(f"{path}: " + "; ".join(problems))


INPUT_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class Subject:
    """One thing to judge, read from the command line's inputs: where it came from, and it."""

    source: str
    """The file (``-`` for standard input), with ``#N`` when the file holds several subjects."""
    file: AdmissionFile
    path: Path | None
    """The file it was read from, when it was the only subject there (``-o diff`` edits it)."""


def read_inputs(arguments: Sequence[str], stdin: Callable[[], str], *,
                workload: Callable[[dict[str, Any]], bool] = lambda _: False) -> tuple[list[Subject], int]:
    """Every subject of ``arguments`` (files, folders read recursively for ``*.yaml``, ``*.yml`` and
    ``*.json``, ``-`` for standard input), and how many documents of other kinds were left out.
    InputError when an argument does not exist, or when nothing in them is a subject."""
    found: list[Subject] = []
    skipped = 0
    for argument in arguments:
        for where, path, text in _texts(argument, stdin):
            read, left_out = subjects(parse_documents(text, where), where, workload=workload)
            skipped += left_out
            for index, file in enumerate(read, start=1):
                source = f"{where}#{index}" if len(read) > 1 else where
                found.append(Subject(source, file, path if len(read) == 1 else None))
    if not found:
        raise InputError(f"no Pod, ResourceClaim, ResourceClaimTemplate or workload in {', '.join(arguments)}"
                         + (f" ({skipped} document(s) of other kinds)" if skipped else ""))
    return found, skipped


def _texts(argument: str, stdin: Callable[[], str]) -> list[tuple[str, Path | None, str]]:
    if argument == "-":
        return [("-", None, stdin())]
    path = Path(argument)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in INPUT_SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        return [(str(file), file, _text(file)) for file in files]
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    return [(str(path), path, _text(path))]


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err
