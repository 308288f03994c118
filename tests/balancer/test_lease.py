"""Leader election rules, and backoff: pure parts as tables, the elector against the fake server."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.clock import Clock
from tests.kubefake import FakeKube
from webhook.balancer.backoff import Backoff
from webhook.balancer.settings import LeaseSettings
from webhook.kubeclient import api_client
from webhook.lease import LeaderElector, Observation, may_acquire

SEEN = Observation(record=("other", "t1", 0, "5"), seen_at=100.0)


@pytest.mark.parametrize(("spec", "now", "expected"), [
    ({}, 100.0, True),                                                           # nobody holds it
    ({"holderIdentity": "", "leaseDurationSeconds": 15}, 100.0, True),           # released
    ({"holderIdentity": "me", "leaseDurationSeconds": 15}, 100.0, True),         # ours: renew
    ({"holderIdentity": "other", "leaseDurationSeconds": 15}, 114.9, False),     # still valid
    ({"holderIdentity": "other", "leaseDurationSeconds": 15}, 115.0, True),      # expired on our clock
])
def test_a_held_lease_is_taken_only_after_its_duration_since_we_saw_it_change(spec, now, expected) -> None:
    assert may_acquire(spec, me="me", observed=SEEN, now=now) is expected


def test_expiry_is_judged_on_the_local_clock_not_the_holders_renew_time(fake_kube: FakeKube) -> None:
    settings = dict(name="l", namespace="ns", duration=10.0, renew_deadline=5.0, retry_period=1.0)
    clock_a, clock_b = Clock(1000.0), Clock(1000.0)
    a = LeaderElector(api_client(fake_kube.url), LeaseSettings(identity="a", **settings), clock=clock_a)
    b = LeaderElector(api_client(fake_kube.url), LeaseSettings(identity="b", **settings), clock=clock_b)
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew()        # b sees the record for the first time now
    clock_b.now += 9.9
    assert not b.try_acquire_or_renew()        # unchanged for 9.9 s < 10 s
    clock_a.now += 6.0
    assert not a.is_leader()                   # a missed its renew deadline: it stops writing first
    clock_b.now += 0.2
    assert b.try_acquire_or_renew() and b.is_leader()
    assert not a.try_acquire_or_renew()        # a sees b's record: it waits a full duration again
    lease = fake_kube.get("coordination.k8s.io/v1", "Lease", "l", "ns")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    assert lease["spec"]["leaseDurationSeconds"] == 10


def test_release_empties_the_holder_so_a_standby_need_not_wait(fake_kube: FakeKube) -> None:
    settings = dict(name="l", namespace="ns", duration=10.0, renew_deadline=5.0, retry_period=1.0)
    a = LeaderElector(api_client(fake_kube.url), LeaseSettings(identity="a", **settings), clock=Clock(1000.0))
    b = LeaderElector(api_client(fake_kube.url), LeaseSettings(identity="b", **settings), clock=Clock(1000.0))
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader()
    assert b.try_acquire_or_renew()            # same clock reading: no expiry needed


def test_backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() -> None:
    backoff = Backoff(0.5, 4.0, random.Random(7))
    delays = [backoff.next() for _ in range(6)]
    for delay, ceiling in zip(delays, (0.5, 1.0, 2.0, 4.0, 4.0, 4.0), strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(delays)) == 6               # jittered, not lockstep
    backoff.reset()
    assert backoff.next() <= 0.5


LEASE_PATH = r"^/apis/coordination.k8s.io/v1/namespaces/ns/leases/l$"
REAL = dict(name="l", namespace="ns", duration=1.0, renew_deadline=0.7, retry_period=0.15)


def test_the_renew_deadline_counts_from_the_renewal_sent_not_from_its_slow_answer(fake_kube: FakeKube) -> None:
    """Fencing: the API server stores the renewal long before a slow answer returns; a standby counts
    from then, so the leader must too, or both lead for as long as the answer took."""
    a = LeaderElector(api_client(fake_kube.url), LeaseSettings(identity="a", **REAL))
    assert a.try_acquire_or_renew()
    fake_kube.delay("PUT", LEASE_PATH, 0.5, count=1)
    started = time.monotonic()
    assert a.try_acquire_or_renew()
    answered = time.monotonic()
    assert answered - started >= 0.5
    # Sent at least 0.5 s before the answer: the 0.7 s deadline ends at most 0.2 s after it.
    time.sleep(max(0.0, answered + 0.45 - time.monotonic()))
    assert not a.is_leader(), "still leading 0.45 s after a renewal answered 0.5 s after it was sent (deadline 0.7 s)"


def test_release_waits_for_a_renewal_in_flight_which_then_cannot_take_the_lease_back(
        fake_kube: FakeKube) -> None:
    """Fencing: a renewal that read the lease slowly must not write it back after release."""
    a = LeaderElector(api_client(fake_kube.url), LeaseSettings(identity="a", **REAL))
    assert a.try_acquire_or_renew()
    fake_kube.delay("GET", LEASE_PATH, 0.5, count=1)  # the renewal's read is slow
    renewal = threading.Thread(target=a.try_acquire_or_renew)
    renewal.start()
    time.sleep(0.1)
    a.release()                                        # SIGTERM arrives while it is in flight
    renewal.join(5)
    lease = fake_kube.get("coordination.k8s.io/v1", "Lease", "l", "ns")
    assert not lease["spec"].get("holderIdentity"), "the lease was taken back after release"
    assert not a.is_leader()
    assert not a.try_acquire_or_renew()                # no round after release
