"""Build-if-missing and look up the GitOps binaries the e2e tests run: argocd, helm, kustomize.

Each binary is built from Go modules with ``go build -trimpath`` in its own build module under
``tests/e2e/toolchain/<name>/`` (the ``go.mod`` there pins the version and is the only source of it)
and kept in a cache outside the repository, keyed by version:

    ${GPUGATE_E2E_CACHE:-~/.cache/gpugate/e2e}/<name>-<version>/bin/<name>

``argocd`` is Argo CD's multi-call binary: it becomes ``argocd-application-controller``,
``argocd-repo-server``, ... through ``argv[0]`` or the ``ARGOCD_BINARY_NAME`` environment variable.

Command line: ``python -m tests.e2e.gitops_binaries build|check``.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TOOLCHAIN = Path(__file__).resolve().parent / "toolchain"


@dataclass(frozen=True)
class Tool:
    name: str  # binary name and build-module folder under toolchain/
    module: str  # the Go module whose version keys the cache
    package: str  # the main package to build

    @property
    def build_dir(self) -> Path:
        return TOOLCHAIN / self.name

    def go_mod(self) -> str:
        return (self.build_dir / "go.mod").read_text()

    def version(self) -> str:
        return required_version(self.go_mod(), self.module)

    def ldflags(self) -> str:
        v = self.version()
        if self.name == "argocd":
            pkg = "github.com/argoproj/argo-cd/v3/common"
            return (
                f"-s -w -X {pkg}.version={v.lstrip('v')} -X {pkg}.gitTag={v} "
                f"-X {pkg}.gitTreeState=clean -X {pkg}.buildDate=1970-01-01T00:00:00Z"
            )
        if self.name == "helm":
            # As helm's Makefile does: the version string, and the default Kubernetes version
            # `helm template` assumes, taken from the k8s.io/client-go it is built with.
            minor = required_version(self.go_mod(), "k8s.io/client-go").split(".")[1]
            return (
                f"-s -w -X helm.sh/helm/v3/internal/version.version={v} "
                "-X helm.sh/helm/v3/internal/version.gitTreeState=clean "
                f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 "
                f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={minor} "
                f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 "
                f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={minor}"
            )
        # kustomize reads its own version from the build info of its module.
        return "-s -w"


TOOLS = (
    Tool("argocd", "github.com/argoproj/argo-cd/v3", "github.com/argoproj/argo-cd/v3/cmd"),
    Tool("helm", "helm.sh/helm/v3", "helm.sh/helm/v3/cmd/helm"),
    Tool("kustomize", "sigs.k8s.io/kustomize/kustomize/v5", "sigs.k8s.io/kustomize/kustomize/v5"),
)


def required_version(go_mod: str, module: str) -> str:
    """The version a go.mod requires for `module` (first match, require lines only)."""
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.MULTILINE)
    if not m:
        raise ValueError(f"go.mod does not require {module}")
    return m.group(1)


def cache_root() -> Path:
    return Path(os.environ.get("GPUGATE_E2E_CACHE") or Path.home() / ".cache" / "gpugate" / "e2e")


def binary_path(tool: Tool) -> Path:
    return cache_root() / f"{tool.name}-{tool.version()}" / "bin" / tool.name


def _ready(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def paths() -> dict[str, Path] | None:
    """{name: binary} when every binary is already in the cache, else None (nothing is built)."""
    found = {t.name: binary_path(t) for t in TOOLS}
    return found if all(_ready(p) for p in found.values()) else None


def _build_one(tool: Tool) -> Path:
    target = binary_path(tool)
    target.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time per binary (pytest-xdist workers may race here).
    with open(target.parent.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _ready(target):
            print(f"{tool.name} {tool.version()}: cached at {target}", flush=True)
            return target
        go = shutil.which("go")
        if go is None:
            raise RuntimeError("the `go` command is not on PATH; it is needed to build " + tool.name)
        tmp = target.with_name(f".{tool.name}.tmp{os.getpid()}")
        env = dict(os.environ, CGO_ENABLED="0")
        cmd = [go, "build", "-trimpath", "-ldflags", tool.ldflags(), "-o", str(tmp), tool.package]
        print(f"{tool.name} {tool.version()}: building ({' '.join(cmd[:3])} ... {tool.package})", flush=True)
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=tool.build_dir, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(
                f"building {tool.name} {tool.version()} failed (exit {proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}"
            )
        os.replace(tmp, target)
        print(f"{tool.name} {tool.version()}: built in {time.monotonic() - started:.1f} s -> {target}", flush=True)
        return target


def build() -> dict[str, Path]:
    """Build whatever is missing from the cache; return {name: binary}."""
    started = time.monotonic()
    result = {t.name: _build_one(t) for t in TOOLS}
    print(f"gitops binaries ready in {time.monotonic() - started:.1f} s", flush=True)
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("build", "check"):
        print("usage: python -m tests.e2e.gitops_binaries build|check", file=sys.stderr)
        return 2
    if argv[0] == "build":
        found = build()
    else:
        found = paths()
        if found is None:
            for t in TOOLS:
                state = "ok" if _ready(binary_path(t)) else "MISSING"
                print(f"{t.name:10} {t.version():10} {state:8} {binary_path(t)}")
            return 1
    for name, path in found.items():
        print(f"{name:10} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
