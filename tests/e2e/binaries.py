"""The e2e binaries: the control plane the product builds, plus the programs only tests and
benchmarks run, built by the same cached recipe (:mod:`webhook.localcluster.binaries`).

The test programs' Go modules live in ``tests/e2e/toolchain/`` so the wheel and the image carry
only what ``gpugate demo`` runs. A program's cache folder is named by a digest of its files taken
relative to its own folder, so where the folder sits does not change the build.

Usage::

    python -m tests.e2e.binaries build   # builds what is missing, prints paths and seconds
    python -m tests.e2e.binaries check   # exit 0 if everything is cached, 1 otherwise
    python -m tests.e2e.binaries paths   # prints the cached paths (exit 1 if any is missing)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from webhook.localcluster import binaries as recipe
from webhook.localcluster.binaries import Component, Program

TOOLCHAIN = Path(__file__).resolve().parent / "toolchain"

UPGRADE_CONTROLLER = Component(
    name="upgrade-controller",
    module="github.com/NVIDIA/k8s-operator-libs",
    # Our own main package (toolchain/upgrade-controller/main.go): NVIDIA's driver upgrade state
    # machine, reconciled the way the GPU Operator's upgrade controller does (argocd_upgrades.py).
    programs=(Program("gpu-upgrade-controller", "gpugate.local/e2e/toolchain/upgrade-controller"),),
    toolchain=TOOLCHAIN,
)
FLOOR_WEBHOOK = Component(
    name="floor-webhook",
    module="gpugate.io/e2e/floor-webhook",
    programs=(Program("floor-webhook", "."),),  # our own main.go, standard library only
    toolchain=TOOLCHAIN,
)
"""The minimal webhook benchmarks/create_latency.py measures gpugate against (seconds to build)."""
COMPONENTS = (*recipe.CONTROL_PLANE, UPGRADE_CONTROLLER)
"""What ``build`` builds and ``check`` asks for: the floor webhook is built on first use."""
OWN_PROGRAMS = (FLOOR_WEBHOOK,)


def upgrade_controller() -> Path | None:
    """The cached ``gpu-upgrade-controller`` (k8s-operator-libs' state machine), or None."""
    path = recipe.bin_dir(UPGRADE_CONTROLLER) / UPGRADE_CONTROLLER.programs[0].binary
    return path if path.is_file() else None


def floor_webhook() -> Path:
    """The cached floor webhook, built first if missing."""
    return recipe.own_program(FLOOR_WEBHOOK)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.binaries", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("build", "check", "paths"))
    args = parser.parse_args(argv)
    if args.command == "build":
        built = recipe.build(components=COMPONENTS)
        for name, path in recipe.vars_of(built).items():
            print(f"{name}: {path}")
        print(f"gpu_upgrade_controller: {upgrade_controller()}")
        for component in OWN_PROGRAMS:
            print(f"{component.name}: {recipe.own_program(component)}")
        return 0
    absent = recipe.missing(COMPONENTS)
    for component, program in absent:
        print(f"missing: {program.binary} ({component.module} {recipe.version(component)}) "
              f"in {recipe.bin_dir(component)}")
    if args.command == "paths" and not absent:
        for name, path in recipe.vars_of(recipe.paths()).items():  # type: ignore[arg-type]
            print(f"{name}: {path}")
    if args.command == "check" and not absent:
        print(f"every e2e binary is built ({len(COMPONENTS)} components, cached under {recipe.cache_root()})")
    return 1 if absent else 0


if __name__ == "__main__":
    sys.exit(main())
