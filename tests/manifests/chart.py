"""Render manifests/chart/gpugate with the real helm, as `helm template` (and Argo CD) do.

Each documented values combination is a file in the chart's ``ci/`` folder (the chart-testing
convention); the tests render every one of them. Renders are cached per (values files, --set
pairs) for the session: treat the objects as read-only.
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests import helmtool
from tests.manifests.helpers import KUBERNETES_VERSION, MANIFESTS, NAMESPACE

CHART = MANIFESTS / "chart" / "gpugate"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "gpugate"

Obj = dict[str, Any]


def values_file(name: str) -> Path:
    """``ci/<name>-values.yaml``."""
    path = CHART / "ci" / f"{name}-values.yaml"
    assert path.is_file(), f"{path} does not exist"
    return path


def helm(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real helm (the cached build, else PATH; skip without one, fail in CI)."""
    return subprocess.run([str(helmtool.helm_binary()), *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def template_args(values: tuple[Path, ...] = (), sets: tuple[str, ...] = (), *,
                  namespace: str = NAMESPACE) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, "--kube-version", KUBERNETES_VERSION]
    for path in values:
        args += ["--values", str(path)]
    for pair in sets:
        args += ["--set", pair]
    return args


@cache
def render_text(values: tuple[Path, ...] = (), sets: tuple[str, ...] = (), namespace: str = NAMESPACE) -> str:
    """`helm template` output; a failed render fails with helm's own message."""
    result = helm(*template_args(values, sets, namespace=namespace))
    assert result.returncode == 0, f"helm {' '.join(template_args(values, sets))} failed:\n{result.stderr}"
    return result.stdout


@cache
def render(values: tuple[Path, ...] = (), sets: tuple[str, ...] = (), namespace: str = NAMESPACE) -> tuple[Obj, ...]:
    return tuple(doc for doc in yaml.safe_load_all(render_text(values, sets, namespace)) if doc)


def is_test_hook(obj: Obj) -> bool:
    """A `helm test` hook: created by `helm test` only, never by install, upgrade or Argo CD sync."""
    return "test" in (obj["metadata"].get("annotations") or {}).get("helm.sh/hook", "").split(",")


def installed(objects: tuple[Obj, ...]) -> list[Obj]:
    """What `helm install` creates: the render without the test hooks."""
    return [o for o in objects if not is_test_hook(o)]
