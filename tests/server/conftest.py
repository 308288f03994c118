"""Fixtures for the server tests; the server harness itself is in ``harness`` (pytest-free)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.harness import Server, copy_policies


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture(scope="module")
def server(module_tmp: Path) -> Iterator[Server]:
    """One server per test module: self-signed certs, the repository's policies, 2 workers."""
    srv = Server(module_tmp, policies=copy_policies(module_tmp / "policies")).start()
    try:
        yield srv
    finally:
        srv.stop()
