"""Fixtures for the admission tests that drive a real server: the server tests' own (``tests/server``)."""

from tests.server.conftest import module_tmp, server

__all__ = ["module_tmp", "server"]
