"""The wheel ships the product and not its test rig: the control plane's Go modules that
``gpugate demo`` builds, and no program only tests or benchmarks run.

Built for real (``pip wheel --no-deps``, as a release is), then its file list is read: a
package-data glob that grows to take ``tests/`` programs, or drops what the demo needs, fails here.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.e2e import binaries as e2e_binaries
from webhook.localcluster import binaries

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout[-2000:]}\n{built.stderr[-2000:]}"
    (wheel,) = out.glob("gpugate-*.whl")
    return zipfile.ZipFile(wheel).namelist()


@pytest.mark.slow
def test_the_wheel_carries_no_test_only_program(wheel_files: list[str]) -> None:
    test_only = [c.name for c in (e2e_binaries.UPGRADE_CONTROLLER, e2e_binaries.FLOOR_WEBHOOK)]
    shipped = [f for f in wheel_files if any(f"/{name}/" in f for name in test_only) or f.endswith(".go")
               or f.startswith(("tests/", "benchmarks/"))]
    assert not shipped, f"the wheel carries test-only files: {shipped}"


@pytest.mark.slow
def test_the_wheel_carries_the_control_plane_the_demo_builds(wheel_files: list[str]) -> None:
    needed = {f"webhook/localcluster/toolchain/{c.name}/{name}"
              for c in binaries.CONTROL_PLANE for name in ("go.mod", "go.sum")}
    assert needed <= set(wheel_files), f"missing from the wheel: {sorted(needed - set(wheel_files))}"
    assert "webhook/server/probe.py" in wheel_files and "webhook/offline/cases.py" in wheel_files


def test_the_test_programs_sit_under_tests_and_the_product_recipe_does_not_name_them() -> None:
    for component in (e2e_binaries.UPGRADE_CONTROLLER, e2e_binaries.FLOOR_WEBHOOK):
        assert component.folder.is_relative_to(ROOT / "tests") and (component.folder / "go.mod").is_file()
    assert all(c.folder.is_relative_to(ROOT / "webhook") for c in binaries.CONTROL_PLANE)
    assert not any(hasattr(binaries, name) for name in ("UPGRADE_CONTROLLER", "FLOOR_WEBHOOK"))
