"""ServiceAccounts and RBAC as the project ships them, applied to the e2e cluster for a test, and their tokens.

Why a module: the balancer (test_balancer, test_inventory), the webhook's claim lookup
(test_dra_admission) and the balancer's certificate Job (test_extender) each run as the
ServiceAccount manifests/ renders, with exactly its RBAC and a TokenRequest token (what a pod's
mounted token gives it), so a missing grant shows as a 403 here and not first in a cluster.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.e2e.namespaces import shared_namespace
from webhook.localcluster.cluster import Cluster

Obj = dict[str, Any]


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> str:
    """``kubectl --kubeconfig <cluster> ARGS`` with ``stdin``; fails the test on a non-zero exit."""
    done = subprocess.run(["kubectl", "--kubeconfig", str(cluster.kubeconfig), *args], input=stdin, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@contextmanager
def applied(cluster: Cluster, documents: Sequence[Obj], namespace: str) -> Iterator[str]:
    """``documents`` applied with kubectl (in ``namespace``, made if absent and shared with other
    modules) for the block and deleted on the way out; yields their YAML."""
    text = yaml.safe_dump_all(list(documents))
    with shared_namespace(cluster.core(), namespace):
        kubectl(cluster, "apply", "-f", "-", stdin=text)
        try:
            yield text
        finally:
            kubectl(cluster, "delete", "--ignore-not-found", "-f", "-", stdin=text)


def token(cluster: Cluster, account: str, namespace: str, *, seconds: int = 3600) -> str:
    """A TokenRequest token of the ServiceAccount, valid ``seconds``."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds))
    return str(cluster.core().create_namespaced_service_account_token(account, namespace, request).status.token)


def kubeconfig_as(cluster: Cluster, account: str, namespace: str, path: Path, *, seconds: int = 3600) -> Path:
    """A kubeconfig at ``path`` that reaches the cluster's API server (its URL and CA as the admin's)
    as the ServiceAccount, with a token of ``seconds``."""
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": account,
        "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": account, "user": {"token": token(cluster, account, namespace, seconds=seconds)}}],
        "contexts": [{"name": account, "context": {"cluster": "local", "user": account}}]}))
    return path
