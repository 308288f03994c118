"""The canary's Prometheus conditions against a real Prometheus.

Debian's ``prometheus`` (``tests/promserver.py``; .ci/run installs it) scrapes a page shaped like
dcgm-exporter's (``tests/dcgmexporter.py``, which cites NVIDIA/dcgm-exporter for
``DCGM_FI_DEV_XID_ERRORS``: a gauge holding the last XID code, with ``err_code``/``err_msg``
attributes) and evaluates every query; ``gpugate stack canary`` runs on a real git repository
against the fake API server (``tests.kubefake``) holding the canary nodes. Each test uses host names
of its own, so one Prometheus serves the module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.dcgmexporter import Device, Exporter, Reading
from tests.kubefake import fake_kube  # noqa: F401 - pytest fixture
from tests.promserver import Prometheus
from tests.server.harness import free_port
from tests.stack.conftest import commit_all, git, snapshot
from tests.stack.test_canary import DRIVER, OLD, canary_upgraded, labelled
from webhook.cli import main
from webhook.errors import GpugateError
from webhook.stack import canary, manifests
from webhook.stack.canary_watch import query

SCRAPE = "500ms"
NEW = "5s"
"""How far back "new" looks: an XID series now that did not exist this long ago is a new XID."""


@dataclass
class Scraped:
    prometheus: Prometheus
    exporter: Exporter

    def show(self, readings: list[Reading]) -> None:
        """Serve ``readings`` and wait until two scrapes of them landed in Prometheus."""
        self.exporter.show(readings)
        start = self.exporter.scrapes
        deadline = time.monotonic() + 20
        while self.exporter.scrapes < start + 2:
            assert time.monotonic() < deadline, f"no scrape in 20 s:\n{self.prometheus.process.tail()}"
            time.sleep(0.05)
        time.sleep(0.1)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    exporter = Exporter()
    prometheus = None
    try:
        prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"), {"nvidia-dcgm-exporter": [exporter.target]},
                                interval=SCRAPE)
        yield Scraped(prometheus, exporter)
    finally:
        if prometheus is not None:
            prometheus.stop()
        exporter.stop()


def gpus(host: str, *xids: int) -> list[Reading]:
    """A node's whole GPUs, the i-th with last XID code ``xids[i]`` (0: none)."""
    return [Reading(device=Device(host=host, gpu=i), active=0.4, xid=x) for i, x in enumerate(xids)]


def new_xid(hosts: str) -> str:
    """XID series on ``hosts`` (a regex) whose code is not 0 and that did not exist NEW ago."""
    return (f'count by (Hostname, gpu, err_code, err_msg) (DCGM_FI_DEV_XID_ERRORS{{Hostname=~"{hosts}",err_code!="0"}}'
            f' unless DCGM_FI_DEV_XID_ERRORS offset {NEW})')


def analysis_yaml(url: str, hosts: str, *, window: float) -> str:
    return f"""apiVersion: gpugate.io/v1alpha1
kind: CanaryAnalysis
pool: canary
windowSeconds: {window}
intervalSeconds: 0.5
timeoutSeconds: 60
prometheus: {{url: "{url}"}}
conditions:
  - name: no-new-xid
    query: '{new_xid(hosts)}'
    max: 0
    noData: pass
  - name: xid-exported
    query: 'count(DCGM_FI_DEV_XID_ERRORS{{Hostname=~"{hosts}"}})'
    min: 1
"""


def ready(repo: Path, fake_kube, url: str, prefix: str, *, window: float) -> str:
    """The canary upgrade committed (its sha returned), canary.yaml for ``prefix-c*`` hosts, both nodes done."""
    canary_upgraded(repo)
    upgrade = git(repo, "rev-parse", "HEAD").strip()
    (repo / canary.ANALYSIS_FILE).write_text(analysis_yaml(url, f"{prefix}-c.*", window=window))
    commit_all(repo, "canary conditions")
    for name in (f"{prefix}-c1", f"{prefix}-c2"):
        fake_kube.put(labelled(name, owner="canary", state="upgrade-done", driver=DRIVER))
    return upgrade


def canary_command(repo: Path, fake_kube, *args: str):
    return CliRunner().invoke(main, ["stack", "canary", "--commit", "--server", fake_kube.url, *args,
                                     "--repo", str(repo)], catch_exceptions=False)


# ---------------------------------------------------------------------------- the query path


def test_increase_misses_a_new_xid_and_the_new_series_query_sees_it(scraped):
    """DCGM_FI_DEV_XID_ERRORS is a gauge whose err_code label changes with each XID: a new XID is a
    new series, so ``increase()`` (one sample of the new series, a vanished old one) answers 0."""
    scraped.show(gpus("q1-c1", 0, 0))
    scraped.prometheus.wait_for(f'DCGM_FI_DEV_XID_ERRORS{{Hostname="q1-c1"}} offset {NEW}')
    scraped.show(gpus("q1-c1", 0, 79))
    increase = 'sum(increase(DCGM_FI_DEV_XID_ERRORS{Hostname=~"q1-c.*"}[10m])) or vector(0)'
    assert [s.value for s in query(scraped.prometheus.url, increase)] == [0.0]
    found = query(scraped.prometheus.url, new_xid("q1-c.*"))
    assert [s.value for s in found] == [1.0]
    assert 'Hostname="q1-c1"' in found[0].series and 'gpu="1"' in found[0].series
    assert 'err_code="79"' in found[0].series and 'err_msg="GPU has fallen off the bus"' in found[0].series
    violation = canary.Condition(name="no-new-xid", query="", max=0).violation(found)
    assert violation is not None and violation.startswith("no-new-xid: 1 on {") and 'gpu="1"' in violation


def test_an_old_xid_is_not_new_once_the_look_back_has_passed(scraped):
    scraped.show(gpus("q2-c1", 43))
    assert [s.value for s in query(scraped.prometheus.url, new_xid("q2-c.*"))] == [1.0]
    scraped.prometheus.wait_for(f'DCGM_FI_DEV_XID_ERRORS{{Hostname="q2-c1"}} offset {NEW}')
    assert query(scraped.prometheus.url, new_xid("q2-c.*")) == ()


def test_a_bad_query_is_prometheus_refusing_with_its_reason_not_an_unanswered_call(scraped):
    with pytest.raises(GpugateError) as caught:
        query(scraped.prometheus.url, "sum(DCGM_FI_DEV_XID_ERRORS")
    assert "Prometheus refused" in str(caught.value) and "parse error" in str(caught.value)


# ---------------------------------------------------------------------------- gpugate stack canary


def test_canary_promotes_after_a_window_without_a_new_xid(stack_repo, fake_kube, scraped):
    # p1-c2 had XID 43 long before the canary: an old error is not a new one.
    scraped.show([*gpus("p1-c1", 0, 0), *gpus("p1-c2", 43)])
    scraped.prometheus.wait_for(f'DCGM_FI_DEV_XID_ERRORS{{Hostname="p1-c2"}} offset {NEW}')
    ready(stack_repo, fake_kube, scraped.prometheus.url, "p1", window=2)
    result = canary_command(stack_repo, fake_kube)
    assert result.exit_code == 0, result.output
    assert "no-new-xid held" in result.output and "xid-exported held" in result.output
    assert "promote" in git(stack_repo, "log", "-n1", "--format=%s")
    assert {p.name: p.driver for p in manifests.load_stack(stack_repo).pools} == {"default": DRIVER, "canary": DRIVER}


def test_canary_rolls_back_on_an_xid_that_appears_inside_the_window(stack_repo, fake_kube, scraped):
    scraped.show([*gpus("p2-c1", 0, 0), *gpus("p2-c2", 0)])
    scraped.prometheus.wait_for(f'DCGM_FI_DEV_XID_ERRORS{{Hostname="p2-c1"}} offset {NEW}')
    upgraded = ready(stack_repo, fake_kube, scraped.prometheus.url, "p2", window=30)
    timer = threading.Timer(2.0, scraped.exporter.show, args=([*gpus("p2-c1", 0, 79), *gpus("p2-c2", 0)],))
    timer.start()
    try:
        result = canary_command(stack_repo, fake_kube)
    finally:
        timer.cancel()
    assert result.exit_code == 1, result.output
    assert "wait" in result.output, "the XID came inside the window, after looks that held"
    line = next(x for x in result.output.splitlines() if ": rollback: " in x)
    assert "no-new-xid: 1 on {" in line and 'Hostname="p2-c1"' in line and 'gpu="1"' in line and 'err_code="79"' in line
    assert f"Gpugate-Reverts: {upgraded}" in git(stack_repo, "log", "-n1", "--format=%B")
    assert manifests.load_stack(stack_repo).pools[1].driver == OLD


@pytest.mark.parametrize("problem", ["unreachable", "bad-query"])
def test_canary_without_an_answer_from_prometheus_commits_nothing(stack_repo, fake_kube, scraped, problem):
    url = f"http://127.0.0.1:{free_port()}" if problem == "unreachable" else scraped.prometheus.url
    ready(stack_repo, fake_kube, url, "p3", window=0)
    if problem == "bad-query":
        text = (stack_repo / canary.ANALYSIS_FILE).read_text().replace("count(DCGM", "count(DCGM(")
        (stack_repo / canary.ANALYSIS_FILE).write_text(text)
        commit_all(stack_repo, "a query Prometheus cannot parse")
    before = snapshot(stack_repo)
    result = canary_command(stack_repo, fake_kube)
    assert result.exit_code == 3, result.output
    expected = "did not answer" if problem == "unreachable" else "Prometheus refused"
    assert expected in result.output and "undecided: nothing committed" in result.output
    assert snapshot(stack_repo) == before
