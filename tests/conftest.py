"""Suite-wide settings: the repository root, and where ../shared (schemas, trace) is if present."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import settings

from tests.prerequisites import in_ci, needed

# CI explores the same examples every run, so a red CI is reproducible and never a coin toss;
# a developer's run explores new ones each time and is where new counterexamples turn up.
# No per-example deadline: it is a timed assert, and on a loaded 2-core machine a slow example is a
# scheduling accident, not a counterexample (speed is measured by benchmarks/).
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("dev", derandomize=False, deadline=None)
settings.load_profile("ci" if in_ci() else "dev")

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the clone; tests that need it skip with the reason on a fresh clone (fail in CI)."""
    return needed(SHARED, "a fresh clone has no schemas or trace beside it")



KUBECTL = shutil.which("kubectl")
NO_KUBECTL = "kubectl is not on PATH"  # the start of webhook.stack.manifestcheck's message


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """On a machine without kubectl, a test that needed it is skipped and says why.

    Only outside CI: ``.ci/run`` checks kubectl is installed first, so there a missing kubectl
    can never hide a manifest test. The skip is decided by the error the real render raised,
    so a test that does not render anything still runs.
    """
    outcome = yield
    report = outcome.get_result()
    if KUBECTL is None and not in_ci() and call.excinfo is not None \
            and NO_KUBECTL in str(call.excinfo.value) and report.failed:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           "Skipped: kubectl is not installed; this test renders manifests with the real "
                           "`kubectl kustomize` (CI installs and checks it)")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    """The same for a test module that renders manifests while it is collected."""
    outcome = yield
    report = outcome.get_result()
    if KUBECTL is None and not in_ci() and report.failed and NO_KUBECTL in str(report.longrepr):
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, "Skipped: kubectl is not installed; this module renders "
                           "manifests with the real `kubectl kustomize` (CI installs and checks it)")
