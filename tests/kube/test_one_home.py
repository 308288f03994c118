"""One rule for a pod's GPU request, read the same way by every part that needs it.

Validation (the webhook's per-pod limit), the balancer (what a bound pod holds on its node) and
the replay (what the scheduler model places) must agree on every pod, including the cases where
the copies used to disagree: sidecar init containers (``restartPolicy: Always``), which run
beside the app containers, and plain init containers, which run alone beside the sidecars
declared before them (``k8s.io/component-helpers/resource`` ``PodRequests``).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.policy.kit import container, load, pod, policy
from webhook.admission import validation
from webhook.balancer import state
from webhook.kube import pods
from webhook.replay import demand

GPU = "nvidia.com/gpu"


def bound(p: dict[str, Any]) -> dict[str, Any]:
    return {**p, "spec": {**p["spec"], "nodeName": "gpu-1"}, "status": {"phase": "Running"}}


def sidecar(name: str, gpus: int) -> dict[str, Any]:
    return {**container(name, gpus=gpus), "restartPolicy": "Always"}


def balancer_count(p: dict[str, Any]) -> int:
    usage = state.pod_usage(bound(p))
    return dict(usage.requests).get(GPU, 0) if usage else 0


def replay_count(p: dict[str, Any]) -> int:
    return demand.view(p).demand.num_gpu


def validation_denies(p: dict[str, Any], limit: int) -> bool:
    """Under a policy whose only rule is ``max: limit``: a pod is denied exactly when it holds more."""
    verdict = validation.validate(p, namespace="ml", policies=load(policy("p", f"gpu: {{max: {limit}}}")))
    return not verdict.allowed


@pytest.mark.parametrize(("case", "expected"), [
    (pod(container("a", gpus=2), container("b", gpus=1)), 3),
    # A sidecar holds its GPU for the pod's life: it adds to the app containers.
    (pod(container("a", gpus=2), init=[sidecar("s", 1)]), 3),
    # A plain init container runs before the app containers: the larger of the two counts.
    (pod(container("a", gpus=1), init=[container("i", gpus=3)]), 3),
    # An init container after a sidecar runs beside it: 1 + 3 = 4 beats the app's 1 + 1.
    (pod(container("a", gpus=1), init=[sidecar("s", 1), container("i", gpus=3)]), 4),
    # ... but an init container before the sidecar runs alone: max(3, 1 + 1) = 3.
    (pod(container("a", gpus=1), init=[container("i", gpus=3), sidecar("s", 1)]), 3),
], ids=["two-apps", "sidecar-adds", "init-alone", "init-after-sidecar", "init-before-sidecar"])
def test_every_part_counts_the_same_gpus(case: dict[str, Any], expected: int) -> None:
    assert pods.gpu_requests(case)[GPU] == expected
    assert balancer_count(case) == expected
    assert replay_count(case) == expected
    assert validation_denies(case, expected - 1) and not validation_denies(case, expected)


counts = st.integers(min_value=0, max_value=4)


@st.composite
def gpu_pods(draw: st.DrawFn) -> dict[str, Any]:
    apps = [container(f"c{i}", gpus=n or None) for i, n in enumerate(draw(st.lists(counts, min_size=1, max_size=3)))]
    inits = []
    for i, (count, is_sidecar) in enumerate(draw(st.lists(st.tuples(counts, st.booleans()), max_size=3))):
        inits.append(sidecar(f"s{i}", count) if is_sidecar else container(f"i{i}", gpus=count or None))
    return pod(*apps, init=inits)


@settings(max_examples=300, deadline=None)
@given(gpu_pods())
def test_validation_the_balancer_and_the_replay_agree_on_any_pod(p: dict[str, Any]) -> None:
    total = pods.gpu_requests(p).get(GPU, 0)
    assert balancer_count(p) == total
    assert replay_count(p) == total
    if total >= 2:  # a policy's max is at least 1
        assert validation_denies(p, total - 1)
    assert not validation_denies(p, max(total, 1))
