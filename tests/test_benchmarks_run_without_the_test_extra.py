"""The benchmarks run on an install without the test extra (issue 20): a user who installed the
project with `pip install -e .` runs `python benchmarks/X.py --help` and gets the help, not an
ImportError for pytest or hypothesis, which only the test extra brings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Each script is run with the test-only libraries made unimportable, as on such an install.
BLOCK = "import sys, runpy; sys.modules.update(pytest=None, hypothesis=None, _pytest=None); " \
        "sys.argv = [{path!r}, '--help']; runpy.run_path({path!r}, run_name='__main__')"


@pytest.mark.parametrize("script", ["balancer_scale.py", "dra_counting.py"])
def test_a_benchmark_prints_its_help_without_pytest(script: str) -> None:
    path = str(REPO / "benchmarks" / script)
    done = subprocess.run([sys.executable, "-c", BLOCK.format(path=path)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
