"""Fixtures for the balancer tests: the fake API server lives in tests/kubefake.py."""

from tests.kubefake import fake_kube  # noqa: F401 - re-exported fixture
