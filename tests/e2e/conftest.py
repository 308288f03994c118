"""Fixtures for e2e tests: one real control plane per test session, fake GPU nodes on demand.

- ``cluster`` (session): a :class:`webhook.localcluster.cluster.Cluster`; ``.kubeconfig``, ``.api_client()``,
  ``.core()``, ``.add_gpu_node(...)``, ``.add_cpu_node(...)``, ``.start_scheduler(...)``,
  ``.logs_tail()``. Nodes it creates stay for the session: make names unique or use ``nodes``.
- ``nodes`` (function): ``nodes.gpu(...)``/``nodes.cpu(...)`` as above, removed after the test.
- ``namespace`` (function): a fresh namespace, deleted after the test.
- ``local`` (module): ``cluster`` when the API server can call a server on this machine's
  127.0.0.1 (the local control plane), else the module skips (``tests.e2e.local``; a module's
  ``LOCAL_ONLY_REASON`` says why in its own words).
- ``workdir`` (module): a fresh folder for the module (``<module>-e2e``).
- ``namespaces``, ``registration`` (function, on ``local``): namespaces made by the test, and the
  webhook configurations it registers; both removed after the test.

Without built binaries the e2e tests skip with the command that builds them; under ``CI`` they
fail instead, so a CI that forgot to build cannot pass green. ``GPUGATE_E2E_KUBECONFIG`` runs them
against an existing cluster instead (only the fake kubelet then runs here); ``GPUGATE_E2E_KEEP=1``
keeps the local control plane's folder (logs, certificates) after the session for a post-mortem.

Every test under tests/e2e gets the ``e2e`` marker: ``pytest -m "not e2e"`` leaves them out.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from kubernetes import client

from tests.e2e.local import KEEP_ENV, LOCAL_ONLY, control_plane_binaries, keep_workdir, require_local
from tests.e2e.webhook_fixture import Namespaces, Registration
from webhook.localcluster import controlplane
from webhook.localcluster.cluster import KUBECONFIG_ENV, Cluster, Nodes

HERE = Path(__file__).resolve().parent
T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: runs against a real Kubernetes control plane (tests/e2e)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            # pyproject's --dist loadfile keeps each module on one worker, in order; with `-n 2`
            # each worker that gets e2e modules starts its own control plane (on free loopback ports).
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    existing = os.environ.get(KUBECONFIG_ENV)
    if existing:
        started = Cluster.attach(Path(existing))
    else:
        started = Cluster.local(control_plane_binaries(), settings=controlplane.Settings(keep_workdir=keep_workdir()))
    try:
        yield started
    finally:
        started.stop()
        if started.plane is not None and started.plane.settings.keep_workdir:
            print(f"\n{KEEP_ENV}: control plane folder kept at {started.plane.workdir}", file=sys.stderr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed e2e test shows the tail of every component's log and the fake kubelet's errors."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    running: Cluster | None = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and running is not None:
        report.sections.append(("control plane logs", running.logs_tail()))


@pytest.fixture(scope="module")
def local(cluster: Cluster, request: pytest.FixtureRequest) -> Cluster:
    """The API server must reach 127.0.0.1 of this machine: only the local control plane does."""
    return require_local(cluster, getattr(request.module, "LOCAL_ONLY_REASON", LOCAL_ONLY))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A fresh folder for the module's servers, certificates and logs."""
    stem = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    return tmp_path_factory.mktemp(f"{stem}-e2e")


def _undone_after(made: T, undo: Callable[[T], object]) -> Iterator[T]:
    """Hand the test what it fills (namespaces, webhook configurations, nodes), then undo all of it:
    the cluster is shared by the whole session, so nothing one test makes may outlive it."""
    yield made
    undo(made)


@pytest.fixture
def namespaces(local: Cluster) -> Iterator[Namespaces]:
    """Namespaces the test makes (``make``), all deleted after it."""
    yield from _undone_after(Namespaces(local), Namespaces.delete_all)


@pytest.fixture
def registration(local: Cluster) -> Iterator[Registration]:
    """The webhook configurations the test registers, removed after it."""
    yield from _undone_after(Registration(local), Registration.remove)


@pytest.fixture
def nodes(cluster: Cluster) -> Iterator[Nodes]:
    """Fake nodes the test adds (``gpu``, ``cpu``), removed after it."""
    yield from _undone_after(Nodes(cluster), Nodes.remove_all)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace; its deletion is not awaited (the namespace controller finishes it)."""
    core = cluster.core()
    name = f"e2e-{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    _wait_for_default_service_account(core, name)
    yield name
    core.delete_namespace(name)


def _wait_for_default_service_account(core: client.CoreV1Api, namespace: str, timeout: float = 30.0) -> None:
    """Pods are refused until the controller manager made the namespace's ``default`` ServiceAccount."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", namespace)
            return
        except client.ApiException as error:
            if error.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.05)
