"""The helm binary the chart tests render with, found once for every test that needs it.

On a user's machine without helm the tests skip and say how to build one; under ``CI`` they fail,
since ``.ci/run`` builds helm (``python -m tests.e2e.gitops_binaries build``) and a CI that
forgot to must not pass green.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.prerequisites import missing

BUILD = "`python -m tests.e2e.gitops_binaries build` builds one from helm.sh/helm/v3 (or put helm on PATH)"


def helm_binary() -> Path:
    """The cached helm (built from its Go module), else helm on PATH; skip (fail in CI) without one."""
    try:
        from tests.e2e import gitops_binaries

        found = gitops_binaries.binary_path(next(t for t in gitops_binaries.TOOLS if t.name == "helm"))
        cached = found if found.is_file() and os.access(found, os.X_OK) else None
    except Exception:
        cached = None
    path = cached or (Path(p) if (p := shutil.which("helm")) else None)
    if path is None:
        missing(f"no helm: {BUILD}")
    return Path(path)
