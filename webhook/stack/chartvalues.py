"""Check Helm values against the keys a gpu-operator chart release really has.

The chart has no values schema, so Helm ignores unknown keys without a word: a values file
that sets ``driver.maxParallelUpgrades`` looks fine, renders fine and changes nothing. The
valid key paths of each release are data (``data/chart-keys/<release>.txt``, derived from the
chart's own values.yaml by ``tools.chartkeys_gen``, provenance in each file's header).
Pure apart from reading those packaged files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from webhook.errors import GpugateError

_DATA_PACKAGE = "webhook.stack"
_DATA_DIR = ("data", "chart-keys")
_RELEASE = re.compile(r"^v\d+\.\d+\.\d+$")


@dataclass(frozen=True)
class ChartKeys:
    """The valid values paths of one chart release."""

    release: str
    keys: frozenset[str]
    """Every known dotted path (including the open ones)."""
    open_paths: frozenset[str]
    """Paths below which any sub-key is accepted (free-form maps, lists, subcharts)."""


def _data_dir() -> Any:
    folder = resources.files(_DATA_PACKAGE)
    for part in _DATA_DIR:
        folder = folder / part
    return folder


def _version_tuple(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.lstrip("v").split("."))


@lru_cache(maxsize=1)
def known_releases() -> tuple[str, ...]:
    """Chart releases we hold key data for, oldest first (e.g. ``("v24.9.2", ..., "v26.7.0")``)."""
    names = [entry.name[: -len(".txt")] for entry in _data_dir().iterdir() if entry.name.endswith(".txt")]
    return tuple(sorted((n for n in names if _RELEASE.match(n)), key=_version_tuple))


def _normalise(release: str) -> str:
    release = release.strip()
    return release if release.startswith("v") else f"v{release}"


@cache
def chart_keys(release: str) -> ChartKeys:
    """Load the key data of ``release`` (``v26.7.0`` or ``26.7.0``).

    Raises GpugateError naming the releases we do know when there is no data for it.
    """
    wanted = _normalise(release)
    if wanted not in known_releases():
        raise GpugateError(
            f"no values key data for gpu-operator chart {release!r}; known releases: "
            f"{', '.join(known_releases())}. Add ../shared/upstream/gpu-operator/values-{wanted}.yaml "
            "and run `python -m tools.chartkeys_gen`"
        )
    text = (_data_dir() / f"{wanted}.txt").read_text(encoding="utf-8")
    keys: set[str] = set()
    open_paths: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 3 or fields[1] not in ("key", "open"):
            raise GpugateError(f"chart-keys/{wanted}.txt line {number}: expected '<path> <key|open> <origin>'")
        keys.add(fields[0])
        if fields[1] == "open":
            open_paths.add(fields[0])
    return ChartKeys(release=wanted, keys=frozenset(keys), open_paths=frozenset(open_paths))


def unknown_keys(values: dict[str, Any], release: str) -> list[str]:
    """Dotted paths in ``values`` that the chart's values.yaml at ``release`` does not define.

    Below an unknown key nothing more is reported (the first wrong segment is the news);
    below a free-form map, list or subchart every key is accepted. Sorted.
    """
    if not isinstance(values, dict):
        raise GpugateError(f"Helm values must be a mapping at the top level, got {type(values).__name__}")
    known = chart_keys(release)
    problems: list[str] = []

    def walk(tree: dict[str, Any], prefix: str) -> None:
        for name, value in tree.items():
            path = f"{prefix}{name}"
            if path not in known.keys:
                problems.append(path)
                continue
            if path in known.open_paths:
                continue
            if isinstance(value, dict):
                walk(value, f"{path}.")

    walk(values, "")
    return sorted(problems)


def suggest(path: str, release: str) -> str | None:
    """A known path ending in the same key name as ``path``, e.g. the real home of a misplaced key."""
    leaf = path.rsplit(".", 1)[-1]
    candidates = sorted(k for k in chart_keys(release).keys if k.rsplit(".", 1)[-1] == leaf and k != path)
    return candidates[0] if len(candidates) == 1 else None
