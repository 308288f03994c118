"""Derive the valid Helm values keys of each gpu-operator chart release from its values.yaml.

The chart ships no ``values.schema.json``, so Helm silently ignores a mistyped key such as
``driver.maxParallelUpgrades`` (the real key is ``driver.upgradePolicy.maxParallelUpgrades``).
This script turns the chart's own ``values.yaml`` at each release into a key list kept in
``webhook/stack/data/chart-keys/<release>.txt``, which ``webhook.stack.chartvalues`` reads.

Run from the repository root (it reads the verbatim upstream copies in ../shared):

    python -m tools.chartkeys_gen [--upstream ../shared/upstream/gpu-operator] [--check]

Each output line is ``<dotted.path> <kind> <origin>``:
- kind ``key``: a key the chart defines; values below it are checked key by key;
- kind ``open``: a free-form map or list (default ``{}``/``[]``, a labels/annotations/
  nodeSelector-like map, or the vendored node-feature-discovery subchart whose own
  values.yaml is not in our copy): any sub-key is accepted;
- origin ``values`` (present in values.yaml) or ``comment`` (documented only as a commented
  example, e.g. ``hostPaths.kubeletRootDir``; a commented key the chart marks deprecated,
  such as ``driver.useOpenKernelModules``, is left out on purpose so it is reported).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_UPSTREAM = Path("../shared/upstream/gpu-operator")
# The generated data ships inside the package, which reads it at run time (webhook.stack.chartvalues).
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "webhook" / "stack" / "data" / "chart-keys"
CHART_REPO = "https://github.com/NVIDIA/gpu-operator"
CHART_PATH = "deployments/gpu-operator/values.yaml"

# Maps whose keys are user data (Kubernetes labels, selectors, resource quantities, file
# contents), whatever their default holds.
FREE_FORM_NAMES = frozenset({
    "labels", "annotations", "nodeSelector", "additionalLabels", "data", "featureGates",
    "resources", "affinity", "securityContext", "podSecurityContext",
})
# Vendored subcharts: their values live in the subchart's own values.yaml.
SUBCHARTS = frozenset({"node-feature-discovery"})

_REAL_KEY = re.compile(r"^(\s*)([A-Za-z0-9_][\w.\-/]*):(?:\s|$)(.*)$")
_COMMENTED_KEY = re.compile(r"^(\s*)([a-z][A-Za-z0-9_]*):(?:\s+(.*))?$")
_COMMENT = re.compile(r"^(\s*)#(.*)$")


@dataclass(frozen=True, order=True)
class KeyEntry:
    """One valid values path of a chart release."""

    path: str
    kind: str  # "key" | "open"
    origin: str  # "values" | "comment"


def _is_open(name: str, value: Any) -> bool:
    return (
        name in FREE_FORM_NAMES
        or name in SUBCHARTS
        or value == {}
        or isinstance(value, list)
    )


def _walk(tree: dict[str, Any], prefix: str, out: dict[str, KeyEntry]) -> None:
    for name, value in tree.items():
        path = f"{prefix}{name}"
        if _is_open(str(name), value):
            out[path] = KeyEntry(path, "open", "values")
            continue
        out[path] = KeyEntry(path, "key", "values")
        if isinstance(value, dict):
            _walk(value, f"{path}.", out)


def _commented_keys(text: str) -> list[tuple[str, str]]:
    """(path, value text) of keys that appear only as commented-out YAML, by indentation.

    Real and commented key lines share one indentation stack, so a commented key nested
    under a real one gets the real parent's path. Prose comments are skipped: a commented
    key must be a lowerCamel word directly followed by a colon.
    """
    stack: list[tuple[int, str]] = []
    found: list[tuple[str, str]] = []
    previous_comment = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        comment = _COMMENT.match(line)
        if comment is None:
            previous_comment = ""
            stripped = line.lstrip()
            if stripped.startswith("- "):
                continue
            real = _REAL_KEY.match(line)
            if real:
                indent = len(real.group(1))
                while stack and stack[-1][0] >= indent:
                    stack.pop()
                path = ".".join([p for _, p in stack] + [real.group(2)])
                stack.append((indent, real.group(2)))
                _ = path
            continue
        body = comment.group(2)
        if body.startswith(" "):
            body = body[1:]
        uncommented = comment.group(1) + body
        key = _COMMENTED_KEY.match(uncommented)
        if key is None or body.lstrip().startswith("#"):
            previous_comment = body
            continue
        indent = len(key.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([p for _, p in stack] + [key.group(2)])
        stack.append((indent, key.group(2)))
        value_text = (key.group(3) or "").strip()
        prose = len(value_text.split()) >= 3 and value_text[:1] not in "{[\"'|>"
        if "deprecated" not in previous_comment.lower() and not prose:
            found.append((path, value_text))
        previous_comment = body
    return found


def derive_keys(text: str) -> list[KeyEntry]:
    """All valid key paths of one values.yaml text, sorted by path."""
    tree = yaml.safe_load(text) or {}
    entries: dict[str, KeyEntry] = {}
    _walk(tree, "", entries)
    commented = _commented_keys(text)
    parents = {path.rsplit(".", 1)[0] for path, _ in commented if "." in path}
    for path, value_text in commented:
        if path in entries:
            continue
        parts = path.split(".")
        under_open = any(
            entries.get(".".join(parts[:i])) is not None and entries[".".join(parts[:i])].kind == "open"
            for i in range(1, len(parts))
        )
        parent = ".".join(parts[:-1])
        if under_open or (parent and parent not in entries):
            continue  # an example inside a free-form value, or under an unknown parent
        # an empty value with no commented children is a commented list (e.g. "#   - ^app$")
        open_value = (parts[-1] in FREE_FORM_NAMES or value_text in ("{}", "[]")
                      or (value_text == "" and path not in parents))
        entries[path] = KeyEntry(path, "open" if open_value else "key", "comment")
    return sorted(entries.values())


def _provenance(upstream: Path) -> dict[str, str]:
    """release tag -> upstream commit, from the table in the upstream folder's README."""
    readme = upstream / "README.md"
    commits: dict[str, str] = {}
    if readme.is_file():
        for match in re.finditer(r"\|\s*values-(v[\w.]+)\.yaml\s*\|\s*(v[\w.]+)\s*\|\s*([0-9a-f]{40})\s*\|",
                                 readme.read_text(encoding="utf-8")):
            commits[match.group(2)] = match.group(3)
    return commits


def render(release: str, text: str, commit: str | None) -> str:
    """The data file for one release: a provenance header, then one entry per line."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    lines = [
        f"# Valid Helm values keys of the NVIDIA gpu-operator chart {release}.",
        f"# Source: {CHART_REPO} {CHART_PATH} at tag {release}"
        + (f" (commit {commit})" if commit else "") + ", Apache-2.0.",
        f"# Derived from the verbatim copy ../shared/upstream/gpu-operator/values-{release}.yaml (sha256 {digest})",
        "# by `python -m tools.chartkeys_gen`. Do not edit by hand; regenerate.",
        "# Columns: <dotted.path> <key|open> <values|comment>; open = any sub-key accepted.",
    ]
    lines += [f"{e.path} {e.kind} {e.origin}" for e in derive_keys(text)]
    return "\n".join(lines) + "\n"


def generate(upstream: Path) -> dict[str, str]:
    """file name -> content for every values-<release>.yaml in ``upstream``."""
    files = sorted(upstream.glob("values-v*.yaml"))
    if not files:
        raise SystemExit(f"{upstream}: no values-v*.yaml files (is ../shared present?)")
    commits = _provenance(upstream)
    out: dict[str, str] = {}
    for path in files:
        release = path.stem.removeprefix("values-")
        out[f"{release}.txt"] = render(release, path.read_text(encoding="utf-8"), commits.get(release))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", type=Path, default=DEFAULT_UPSTREAM)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the data files differ")
    args = parser.parse_args(argv)
    wanted = generate(args.upstream)
    stale = [name for name, text in wanted.items()
             if not (args.out / name).is_file() or (args.out / name).read_text(encoding="utf-8") != text]
    if args.check:
        for name in stale:
            print(f"{args.out / name} is out of date; run python -m tools.chartkeys_gen", file=sys.stderr)
        if not stale:
            print(f"{args.out}: {len(wanted)} chart-key file(s) up to date with {args.upstream}")
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in wanted.items():
        (args.out / name).write_text(text, encoding="utf-8")
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
