"""Running a renderer (``helm template``, ``kubectl kustomize``) and reading the YAML it prints.

Why a module: both renderers must be stopped after a timeout, must fail with a message naming the
command and what it said (its stderr, else its stdout), and must never hand on YAML that does not
parse; :mod:`webhook.stack.chartrender` and :mod:`webhook.stack.manifestcheck` share this one copy.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from webhook.errors import GpugateError
from webhook.kube import yamlload


def rendered_documents(args: Sequence[str], *, what: str, timeout: float,
                       env: Mapping[str, str] | None = None) -> list[Any]:
    """The YAML documents ``args`` prints, in order (``None`` for an empty one).

    ``what`` names the command in messages (``helm template <chart>``). A command that cannot be
    started, times out, exits non-zero or prints YAML that does not parse raises GpugateError.
    """
    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, env=None if env is None else dict(env),
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        raise GpugateError(f"{what} did not finish in {timeout}s") from err
    except OSError as err:
        raise GpugateError(f"cannot run {args[0]}: {err}") from err
    if proc.returncode != 0:
        raise GpugateError(f"{what} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    try:
        return list(yaml.safe_load_all(proc.stdout))
    except yaml.YAMLError as err:
        raise GpugateError(f"{what} printed YAML that does not parse{yamlload.describe_error(err)}") from err
