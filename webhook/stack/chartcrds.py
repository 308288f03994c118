"""The CRDs each known gpu-operator chart release ships, read from the package's data once.

``data/chart-crds/<release>.yaml`` (written by ``python -m tools.chartcrds_gen`` from NVIDIA's chart
packages, provenance in each header) holds every CRD's schema as path sets; ``crdstate`` compares
them with what a cluster serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib import resources

from webhook.kube.yamlload import fast_load
from webhook.stack.crdstate import CRDShape, VersionShape


@cache
def known() -> Mapping[str, Mapping[str, CRDShape]]:
    """Release (``v26.7.0``) -> CRD name -> its shape."""
    folder = resources.files("webhook.stack").joinpath("data", "chart-crds")
    out: dict[str, dict[str, CRDShape]] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".yaml"):
            continue
        data = fast_load(entry.read_text(encoding="utf-8"))
        out[str(data["release"])] = {
            name: CRDShape(name=name, versions={
                version: VersionShape(frozenset(shape.get("paths") or ()), frozenset(shape.get("required") or ()))
                for version, shape in (crd.get("versions") or {}).items()})
            for name, crd in (data.get("crds") or {}).items()}
    return out
