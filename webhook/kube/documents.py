"""Read a Pod from a YAML or JSON file, refusing anything else with a message that points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from webhook.errors import InputError
from webhook.kube import yamlload
from webhook.kube.pods import Pod


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
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err
    try:
        documents = [d for d in yamlload.load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(f"{path}{where}: invalid YAML: {getattr(err, 'problem', None) or err}") from err
    if len(documents) != 1:
        raise InputError(f"{path}: expected exactly one document, found {len(documents)}")
    document = documents[0]
    if not isinstance(document, dict):
        raise InputError(f"{path}: expected a mapping, got {type(document).__name__}")
    return document


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
