"""Derive the CRDs each gpu-operator chart release ships, as schema path sets, from NVIDIA's chart packages.

``gpugate stack plan --kube`` compares the CRDs a cluster serves with those of the target release
(``webhook.stack.crdstate``). The package carries them as data, one file per release in
``webhook/stack/data/chart-crds/<release>.yaml``, read by ``webhook.stack.chartcrds``; this script
writes those files from the chart packages beside the checkout (each chart's ``crds/`` folder):

    python -m tools.chartcrds_gen [--charts ../shared/upstream/charts] [--check]

Each file maps a CRD name to its group, kind and served versions; a version lists every property
path of its schema (``spec.driver.upgradePolicy.drain.enable``, ``[]`` for list items, ``.*`` for
map values) and the paths it requires.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import sys
import tarfile
from pathlib import Path

import yaml

from webhook.stack.crdstate import crd_shape

DEFAULT_CHARTS = Path("../shared/upstream/charts")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "webhook" / "stack" / "data" / "chart-crds"
_PACKAGE = re.compile(r"^gpu-operator-(v\d+\.\d+\.\d+)\.tgz$")


def release_crds(package: Path) -> list[dict]:
    """The CRD objects under ``<chart>/crds/`` of a chart package."""
    found = []
    with tarfile.open(package) as archive:
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            parts = member.name.split("/")
            if member.isfile() and len(parts) == 3 and parts[1] == "crds" and parts[2].endswith((".yaml", ".yml")):
                handle = archive.extractfile(member)
                assert handle is not None
                found += [d for d in yaml.safe_load_all(io.TextIOWrapper(handle, encoding="utf-8"))
                          if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"]
    return found


def render(package: Path, release: str) -> str:
    crds = {}
    for crd in release_crds(package):
        shape = crd_shape(crd)
        names = crd["spec"]["names"]
        crds[shape.name] = {"group": crd["spec"]["group"], "kind": names["kind"],
                            "versions": {v: {"paths": sorted(s.paths), "required": sorted(s.required)}
                                         for v, s in shape.versions.items()}}
    digest = hashlib.sha256(package.read_bytes()).hexdigest()
    header = (f"# The CRDs NVIDIA's gpu-operator chart {release} ships (its crds/ folder), as schema paths.\n"
              f"# Derived from {package.name} (sha256 {digest}) by `python -m tools.chartcrds_gen`.\n"
              f"# Do not edit by hand; regenerate.\n")
    return header + yaml.safe_dump({"release": release, "crds": crds}, sort_keys=True, width=200)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--charts", DEFAULT_CHARTS), ("--out", DEFAULT_OUT)):
        parser.add_argument(flag, type=Path, default=default)
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs from what would be written")
    args = parser.parse_args(argv)
    packages = {m.group(1): p for p in sorted(args.charts.glob("*.tgz")) if (m := _PACKAGE.match(p.name))}
    if not packages:
        print(f"no gpu-operator-v*.tgz under {args.charts}", file=sys.stderr)
        return 1
    stale = []
    args.out.mkdir(parents=True, exist_ok=True)
    for release, package in packages.items():
        target = args.out / f"{release}.yaml"
        text = render(package, release)
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(str(target))
        else:
            target.write_text(text, encoding="utf-8")
    if stale:
        print("out of date (run python -m tools.chartcrds_gen): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
