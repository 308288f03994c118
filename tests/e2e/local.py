"""The one rule for e2e tests whose server runs on this machine: only the local control plane can call it.

The API server (or the scheduler) must reach 127.0.0.1 of this machine, which only the control
plane the session started does; against an attached cluster (``GPUGATE_E2E_KUBECONFIG``) such a
test skips with the reason. The ``local`` fixture of tests/e2e/conftest.py calls this; a module
may name its own reason in ``LOCAL_ONLY_REASON``. A module that needs a control plane of its own
(its own settings, or no GPU nodes) starts it with :func:`own_control_plane`, which skips the same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.prerequisites import missing
from webhook.localcluster import binaries, controlplane
from webhook.localcluster.cluster import KUBECONFIG_ENV, Cluster

LOCAL_ONLY = "the webhook runs on this machine's 127.0.0.1; an attached cluster cannot call it"
BUILD_COMMAND = "python -m tests.e2e.binaries build"
KEEP_ENV = "GPUGATE_E2E_KEEP"
"""Set (to anything) to keep the control plane's folder (certificates, etcd data, logs) afterwards."""


def require_local(cluster: Cluster, reason: str = LOCAL_ONLY) -> Cluster:
    """``cluster`` when it is the local control plane; otherwise the test skips with ``reason``."""
    if cluster.plane is None:
        pytest.skip(reason)
    return cluster


def control_plane_binaries() -> binaries.Binaries:
    """The built etcd, kube-apiserver, controller manager and scheduler; :func:`missing` naming the
    absent ones and the command that builds them."""
    found = binaries.paths()
    if found is not None:
        return found
    absent = ", ".join(program.binary for _, program in binaries.missing())
    missing(f"e2e control-plane binaries are not built ({absent} missing from {binaries.cache_root()}); "
            f"run `{BUILD_COMMAND}` (needs Go; a cold build takes ~20-40 min), "
            f"or set {KUBECONFIG_ENV} to an existing cluster's kubeconfig")


def keep_workdir() -> bool:
    """Whether ``GPUGATE_E2E_KEEP`` asks to keep the control plane's folder."""
    return bool(os.environ.get(KEEP_ENV))


@contextmanager
def own_control_plane(needs: str, **settings: Any) -> Iterator[Cluster]:
    """A control plane of the module's own (``settings`` as :class:`controlplane.Settings` takes them),
    stopped on the way out. Against an attached cluster the module skips: it ``needs`` its own."""
    if os.environ.get(KUBECONFIG_ENV):
        pytest.skip(f"{KUBECONFIG_ENV}: {needs}")
    started = Cluster.local(control_plane_binaries(),
                            settings=controlplane.Settings(keep_workdir=keep_workdir(), **settings))
    try:
        yield started
    finally:
        started.stop()
