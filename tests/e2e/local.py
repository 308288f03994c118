"""The one rule for e2e tests whose server runs on this machine: only the local control plane can call it.

The API server (or the scheduler) must reach 127.0.0.1 of this machine, which only the control
plane the session started does; against an attached cluster (``GPUGATE_E2E_KUBECONFIG``) such a
test skips with the reason. The ``local`` fixture of tests/e2e/conftest.py calls this; a module
may name its own reason in ``LOCAL_ONLY_REASON``.
"""

from __future__ import annotations

import pytest

from tests.e2e.cluster import Cluster

LOCAL_ONLY = "the webhook runs on this machine's 127.0.0.1; an attached cluster cannot call it"


def require_local(cluster: Cluster, reason: str = LOCAL_ONLY) -> Cluster:
    """``cluster`` when it is the local control plane; otherwise the test skips with ``reason``."""
    if cluster.plane is None:
        pytest.skip(reason)
    return cluster
