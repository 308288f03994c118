"""Load the packaged compatibility matrix (``data/matrix.yaml``); the one file read of the stack core."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from webhook.kube.yamlload import fast_load
from webhook.stack.releases import Matrix


@lru_cache(maxsize=1)
def load() -> Matrix:
    """The matrix shipped with gpugate; cached because it is package data and never changes at run time."""
    text = resources.files("webhook.stack").joinpath("data/matrix.yaml").read_text(encoding="utf-8")
    return Matrix.from_dict(fast_load(text))
