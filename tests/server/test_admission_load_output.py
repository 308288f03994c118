"""benchmarks/admission_load.py in its shortest mode: its figures read, and a long run is not silent.

It printed ``max req/s ratio by round0.97`` (label and figure run together) and nothing at all for
the first 30 s of a default run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_admission_load_prints_progress_and_separated_figures() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "admission_load.py"), "--seconds", "0.3",
                           "--rounds", "2", "--rate", "50", "--drivers", "1", "--connections", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = re.findall(r"^admission_load \[(\d+)/(\d+)\] (null|gpugate): ", done.stderr, flags=re.M)
    assert [(int(a), int(b)) for a, b, _ in steps] == [(i, 6) for i in range(1, 7)], done.stderr[-3000:]
    ratios = re.search(r"^max req/s ratio by round(.*)$", done.stdout, flags=re.M)
    assert ratios is not None, done.stdout
    # A round that got no answer in its 0.3 s on a loaded machine prints n/a, not a ZeroDivisionError.
    assert re.fullmatch(r"\s{2,}(\d+\.\d\d|n/a)  (\d+\.\d\d|n/a)", ratios.group(1)), ratios.group(0)
