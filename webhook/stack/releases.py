"""GPU Operator releases and driver versions as the compatibility matrix records them. Pure.

What a version is (``OperatorVersion``, a Kubernetes minor, a driver version and its branch) and
the matrix itself (``Matrix.from_dict``: every entry with its cited source). The rules applied to a
change live in ``webhook.stack.compat``; the data file is read by ``webhook.stack.matrix``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.errors import GpugateError

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")
_MINOR_RE = re.compile(r"^1\.(\d+)$")
_DRIVER_RE = re.compile(r"^(\d+)(?:\.(\d+)(?:\.(\d+))?)?$")


class MatrixError(GpugateError):
    """The matrix data is malformed (a packaging bug, named with the entry at fault)."""


@dataclass(frozen=True, order=True)
class OperatorVersion:
    """A GPU Operator release ``vYY.MM.PP``; the release line is ``YY.MM``."""

    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> OperatorVersion:
        match = _VERSION_RE.match(str(text).strip())
        if match is None:
            raise GpugateError(f"operator version {text!r} is not of the form vYY.MM.PP (e.g. v26.7.0)")
        return cls(int(match[1]), int(match[2]), int(match[3]))

    @property
    def line(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def line_name(self) -> str:
        return f"v{self.major}.{self.minor}"

    def __str__(self) -> str:
        return f"v{self.major}.{self.minor}.{self.patch}"


def parse_minor(text: str) -> int:
    """``"1.33"`` -> 33; anything else is a usage error naming the expected form."""
    match = _MINOR_RE.match(str(text).strip())
    if match is None:
        raise GpugateError(f"Kubernetes version {text!r} is not of the form 1.NN (e.g. 1.33)")
    return int(match[1])


def is_full_version(version: str) -> bool:
    match = _DRIVER_RE.match(str(version).strip())
    return bool(match and match[3] is not None)


def driver_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(version).split("."))


def driver_branch(version: str) -> str:
    """The branch of a driver version: ``"595.91.07"`` -> ``"595"``; a bare branch stays itself."""
    match = _DRIVER_RE.match(str(version).strip())
    if match is None:
        raise GpugateError(f"driver version {version!r} is not of the form NNN.NN.NN "
                           f"(or a branch NNN when precompiled)")
    return match[1]


@dataclass(frozen=True, kw_only=True)
class Release:
    """One GPU Operator release as the matrix records it."""

    version: OperatorVersion
    date: str
    defaults: Mapping[str, str]
    """Component versions the chart's values.yaml pins at this tag (driver, toolkit, ...)."""
    kubernetes_min: int
    kubernetes_max: int
    drivers: tuple[str, ...]
    """Driver versions the docs list as validated for this release."""
    branches: tuple[str, ...]
    """Driver branches of those versions: a driver outside them is unvalidated."""
    confidence: str
    sources: Mapping[str, str]
    """Field name (defaults, kubernetes, drivers) -> the source text it was read from."""

    @property
    def kubernetes_range(self) -> str:
        return f"1.{self.kubernetes_min}-1.{self.kubernetes_max}"


@dataclass(frozen=True, kw_only=True)
class Matrix:
    """Every known release, oldest first, and the rule data that goes with them."""

    releases: tuple[Release, ...]
    known_bad_drivers: tuple[str, ...]
    known_bad_reason: str
    known_bad_source: str
    release_path_source: str
    migration_supported_from: OperatorVersion
    migration_source: str
    published_drivers: Mapping[str, str]
    """Driver versions NVIDIA published as images -> the cited source that names each."""
    precompiled: Mapping[OperatorVersion, tuple[tuple[str, ...], str]]
    """Release -> (branches with precompiled images, cited source)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Matrix:
        """Build the matrix from its YAML form; refuse an entry without a source."""
        try:
            sources = dict(data["sources"])
            rules = data["rules"]

            def cite(key: str, where: str) -> str:
                if key not in sources:
                    raise MatrixError(f"matrix {where}: source {key!r} is not listed under sources")
                return f"{key}: {sources[key]}"

            releases = []
            for index, entry in enumerate(data["releases"]):
                where = f"releases[{index}] ({entry.get('version')})"
                source = entry.get("source") or {}
                missing = {"defaults", "kubernetes", "drivers"} - set(source)
                if missing:
                    raise MatrixError(f"matrix {where}: no source for {', '.join(sorted(missing))}")
                branches = tuple(str(b) for b in entry["branches"])
                drivers = tuple(str(d) for d in entry["drivers"])
                stray = [d for d in drivers if driver_branch(d) not in branches]
                if stray:
                    raise MatrixError(f"matrix {where}: drivers {stray} are outside the listed branches")
                releases.append(Release(
                    version=OperatorVersion.parse(entry["version"]),
                    date=str(entry["date"]),
                    defaults={str(k): str(v) for k, v in entry["defaults"].items()},
                    kubernetes_min=parse_minor(entry["kubernetes"]["min"]),
                    kubernetes_max=parse_minor(entry["kubernetes"]["max"]),
                    drivers=drivers,
                    branches=branches,
                    confidence=str(entry.get("confidence", "unknown")),
                    sources={k: cite(v, where) for k, v in source.items()},
                ))
            releases.sort(key=lambda r: r.version)
            bad = rules["knownBadDrivers"]
            migration = rules["nvidiaDriverMigration"]
            published = {str(v): cite(str(k), f"publishedDrivers[{v}]") for v, k in data["publishedDrivers"].items()}
            for release in releases:
                unknown = [d for d in (*release.drivers, release.defaults["driver"]) if d not in published]
                if unknown:
                    raise MatrixError(f"matrix releases ({release.version}): drivers {unknown} are not under "
                                      f"publishedDrivers")
            precompiled = {OperatorVersion.parse(e["release"]): (tuple(str(b) for b in e["branches"]),
                                                                 cite(e["source"], f"precompiled[{e['release']}]"))
                           for e in data.get("precompiled") or []}
            return cls(
                releases=tuple(releases),
                known_bad_drivers=tuple(str(v) for v in bad["versions"]),
                known_bad_reason=str(bad["reason"]),
                known_bad_source=cite(bad["source"], "rules.knownBadDrivers"),
                release_path_source=cite(rules["releasePath"]["source"], "rules.releasePath"),
                migration_supported_from=OperatorVersion.parse(migration["supportedFrom"]),
                migration_source=cite(migration["source"], "rules.nvidiaDriverMigration"),
                published_drivers=published,
                precompiled=precompiled,
            )
        except (KeyError, TypeError, AttributeError) as err:
            raise MatrixError(f"matrix data is malformed: {err!r}") from err

    def release(self, version: OperatorVersion | str) -> Release:
        wanted = OperatorVersion.parse(version) if isinstance(version, str) else version
        for release in self.releases:
            if release.version == wanted:
                return release
        known = ", ".join(str(r.version) for r in self.releases)
        raise GpugateError(f"gpu-operator {wanted} is not in the compatibility matrix (known: {known})")

    def lines(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted({r.version.line for r in self.releases}))

    @property
    def newest(self) -> Release:
        return self.releases[-1]

    def newer_patches(self, version: OperatorVersion) -> tuple[Release, ...]:
        """Releases of ``version``'s line newer than it: what a patch upgrade could move to."""
        return tuple(r for r in self.releases if r.version.line == version.line and r.version > version)

    def newer_drivers(self, driver: str) -> tuple[str, ...]:
        """Published drivers of ``driver``'s branch newer than it, oldest first."""
        if not is_full_version(driver):
            return ()
        mine = driver_key(driver)
        return tuple(sorted((v for v in self.published_drivers
                             if driver_branch(v) == driver_branch(driver) and driver_key(v) > mine),
                            key=driver_key))
