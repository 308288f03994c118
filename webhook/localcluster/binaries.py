"""Where the control-plane binaries live, and how they are built: the one home for both.

The control plane ``gpugate demo`` runs (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) is built from the Go modules in ``toolchain/`` and cached outside the repository,
in ``${GPUGATE_E2E_CACHE:-~/.cache/gpugate/e2e}/<component>-<version>-<digest>/bin/``. The
version is read from the module's go.mod and the digest covers every file of the module (named
relative to its folder, so moving the folder keeps the build) plus the build flags, so editing
go.mod/go.sum (or this recipe) builds into a new folder instead of reusing a stale one. GOMODCACHE
and GOCACHE stay at their defaults so every build on a machine shares them.

The programs only tests and benchmarks run live under ``tests/`` and are built by this same
recipe into the same cache: a :class:`Component` names the folder its module sits in
(``tests/e2e/binaries.py`` registers them and is the command line, ``python -m tests.e2e.binaries``).
A cold build of Kubernetes takes tens of minutes on two cores; tests never build, they skip (or
fail under ``CI``) when :func:`paths` returns None.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

TOOLCHAIN = Path(__file__).resolve().parent / "toolchain"
CACHE_ENV = "GPUGATE_E2E_CACHE"
DEFAULT_CACHE = Path("~/.cache/gpugate/e2e")

# Stripping the DWARF tables (-s -w) makes linking kube-apiserver a third faster and the binary a
# third smaller; nobody steps through these binaries in a debugger.
COMMON_FLAGS = ("-trimpath", "-ldflags=-s -w {extra}")


@dataclass(frozen=True, slots=True)
class Program:
    """One binary: its file name and the Go package (a ``tool`` of the component's module)."""

    binary: str
    package: str


@dataclass(frozen=True, slots=True)
class Component:
    """A Go module under ``<toolchain>/<name>`` and the programs built from it."""

    name: str
    module: str
    """The required module whose version names the build (``k8s.io/kubernetes`` -> v1.37.2)."""
    programs: tuple[Program, ...]
    toolchain: Path = TOOLCHAIN
    """The folder of Go modules it sits in: the product's here, a test program's under ``tests/``."""

    @property
    def folder(self) -> Path:
        return self.toolchain / self.name


KUBERNETES = Component(
    name="kubernetes",
    module="k8s.io/kubernetes",
    programs=(
        Program("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
        Program("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
        Program("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
    ),
)
ETCD = Component(
    name="etcd",
    module="go.etcd.io/etcd/server/v3",
    programs=(Program("etcd", "go.etcd.io/etcd/server/v3"),),  # the module's root is etcd's main
)
CONTROL_PLANE = (ETCD, KUBERNETES)


@dataclass(frozen=True, slots=True)
class Binaries:
    """Absolute paths of the four control-plane programs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path


def cache_root() -> Path:
    """The cache folder; ``GPUGATE_E2E_CACHE`` moves it (CI caches it between runs)."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def version(component: Component) -> str:
    """The version of ``component.module`` that its go.mod requires (the single source of truth)."""
    text = (component.folder / "go.mod").read_text()
    own = re.search(r"^module\s+(\S+)", text, re.MULTILINE)
    if own and own.group(1) == component.module:
        return "v0"  # a program of ours: the digest of its files names the build
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(component.module)}\s+(v\S+)", text, re.MULTILINE)
    if not found:
        raise RuntimeError(f"{component.folder / 'go.mod'} does not require {component.module}")
    return found.group(1)


def ldflags(component: Component) -> str:
    """Version stamps, so /version answers v1.37.2 and not v0.0.0-master.

    Helm charts (the GPU Operator's among them) check ``kubeVersion`` against the server's
    version, so an unstamped API server would make Argo CD refuse to render them.
    """
    if component is not KUBERNETES:
        return ""
    full = version(component)
    major, minor = full.lstrip("v").split(".")[:2]
    stamps = {"gitVersion": full, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    return " ".join(f"-X {package}.{key}={value}"
                    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
                    for key, value in stamps.items())


def build_flags(component: Component) -> list[str]:
    return [flag.format(extra=ldflags(component)).strip() for flag in COMMON_FLAGS]


def digest(component: Component) -> str:
    """A hash of the module's files and the build flags: any change gets a fresh folder."""
    h = hashlib.sha256()
    for path in sorted(p for p in component.folder.rglob("*") if p.is_file()):
        h.update(path.relative_to(component.folder).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    h.update("\0".join(build_flags(component)).encode())
    return h.hexdigest()[:12]


def bin_dir(component: Component) -> Path:
    return cache_root() / f"{component.name}-{version(component)}-{digest(component)}" / "bin"


def missing(components: tuple[Component, ...] = CONTROL_PLANE) -> list[tuple[Component, Program]]:
    """The programs not yet in the cache."""
    return [(c, p) for c in components for p in c.programs if not (bin_dir(c) / p.binary).is_file()]


def paths() -> Binaries | None:
    """The cached binaries, or None if any is missing (tests then skip, or fail under CI)."""
    if missing(CONTROL_PLANE):
        return None
    return Binaries(
        etcd=bin_dir(ETCD) / "etcd",
        kube_apiserver=bin_dir(KUBERNETES) / "kube-apiserver",
        kube_controller_manager=bin_dir(KUBERNETES) / "kube-controller-manager",
        kube_scheduler=bin_dir(KUBERNETES) / "kube-scheduler",
    )


def build(*, log: Callable[[str], None] = print, components: tuple[Component, ...] = CONTROL_PLANE) -> Binaries:
    """Build whatever of ``components`` is missing with ``go build -trimpath``; returns the
    control plane's paths. ``gpugate demo`` asks for the control plane alone; the e2e suite
    (``python -m tests.e2e.binaries build``) for its test programs too.

    Holds a lock on the cache so two builds started at once (two CI jobs on one runner, a
    developer and a test run) do not both spend twenty minutes on the same binaries.
    """
    go = _go()
    with _locked(cache_root() / ".lock"):
        started = time.monotonic()
        for component, program in missing(components):
            _build_one(go, component, program, log=log)
        built = paths()
        assert built is not None and not missing(components), "go build succeeded but a binary is missing"
        log(f"all binaries ready in {time.monotonic() - started:.1f}s")
        return built


def own_program(component: Component) -> Path:
    """The cached binary of one of our own small programs, built first if missing: they take
    seconds, so a benchmark builds on demand, under the same cache lock as ``build``."""
    program = component.programs[0]
    target = bin_dir(component) / program.binary
    if not target.is_file():
        go = _go()
        with _locked(cache_root() / ".lock"):
            if not target.is_file():
                _build_one(go, component, program, log=print)
    return target


def _build_one(go: str, component: Component, program: Program, *, log: Callable[[str], None]) -> None:
    target = bin_dir(component) / program.binary
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    command = [go, "build", *build_flags(component), "-o", str(partial), program.package]
    log(f"building {program.binary} ({component.module} {version(component)}) ...")
    started = time.monotonic()
    result = subprocess.run(command, cwd=component.folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, check=False)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` in {component.folder} failed after {seconds:.0f}s:\n"
                           f"{result.stdout[-4000:]}")
    os.replace(partial, target)  # a half-written binary never looks cached
    _record(target.parent.parent, program, seconds, go)
    log(f"built {target} in {seconds:.1f}s")


def _record(folder: Path, program: Program, seconds: float, go: str) -> None:
    """Keep how each binary was built beside it, for whoever wonders later."""
    info_path = folder / "build.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    go_version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout.strip()
    info[program.binary] = {"package": program.package, "seconds": round(seconds, 1), "go": go_version,
                            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    info_path.write_text(json.dumps(info, indent=2) + "\n")


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise RuntimeError("`go` is not on PATH: install Go >= 1.26 (https://go.dev/dl/) to build the "
                           "e2e control plane, or point GPUGATE_E2E_KUBECONFIG at a cluster")
    return go


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def vars_of(binaries: Binaries) -> dict[str, Path]:
    return {f.name: getattr(binaries, f.name) for f in dataclasses.fields(binaries)}
