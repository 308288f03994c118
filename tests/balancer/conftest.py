"""Fixtures for the balancer tests: the fake API server (tests/kubefake.py) and running balancers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.waiting import wait_until
from tests.kubefake import FakeKube, fake_kube  # noqa: F401 - re-exported fixture
from webhook.balancer.controller import Balancer
from webhook.balancer.settings import BalancerSettings, InventorySettings, LeaseSettings
from webhook.kubeclient import api_client


def fast_settings(**changes: Any) -> BalancerSettings:
    """Settings scaled down from seconds-to-minutes to tenths of a second, so tests stay fast; the
    inventory is off (tests/balancer/test_inventory.py turns it on)."""
    lease = changes.pop("lease", {})
    base = BalancerSettings(
        lease=LeaseSettings(**{"name": "gpugate-balancer", "namespace": "gpugate-system", "identity": "replica-a",
                               "duration": 1.0, "renew_deadline": 0.7, "retry_period": 0.15, **lease}),
        resync_interval=30.0, watch_timeout=5, backoff_initial=0.05, backoff_max=0.2, health_bind="127.0.0.1:0",
        write_interval=0.2,  # every change of marks but their first waits this long (10 s by default)
        # Off unless a test is about it: the fake serves no PriorityClasses until a test registers them.
        inventory=InventorySettings(enabled=False),
    )
    import dataclasses
    return dataclasses.replace(base, **changes)


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (the e2e tests' ``wait_until``, polled
    faster: the fake API server answers in milliseconds); fail the test with ``what`` otherwise."""
    try:
        return wait_until(predicate, timeout=timeout, interval=0.02, what=what)
    except AssertionError as err:
        pytest.fail(str(err))


class Running:
    """A balancer running in a thread; ``stop()`` joins it."""

    def __init__(self, balancer: Balancer) -> None:
        self.balancer = balancer
        self.thread = threading.Thread(target=balancer.run, name="balancer", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.balancer.stop()
        self.thread.join(10)
        assert not self.thread.is_alive(), "balancer did not stop"


@pytest.fixture
def start_balancer(fake_kube: FakeKube) -> Iterator[Callable[..., Running]]:
    """Start balancers against ``fake_kube``; all are stopped at the end of the test."""
    started: list[Running] = []

    def start(settings: BalancerSettings | None = None, *, serve_health: bool = False) -> Running:
        running = Running(Balancer(settings or fast_settings(), client_factory=lambda: api_client(fake_kube.url),
                                   serve_health=serve_health))
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.stop()
