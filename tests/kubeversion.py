"""The Kubernetes version of the cluster gpugate targets, read from its one home.

That home is ``cluster.kubernetesVersion`` in manifests/gpu-operator/stack.yaml (changed with
``gpugate stack upgrade --operator <current> --kubernetes 1.NN``). Every test that means "our
cluster" takes the version from here: strict schema validation of the rendered manifests and of
mutated pods, the fake API server's ``/version``, the second scheduler's image. The e2e control
plane (webhook/localcluster/toolchain/kubernetes/go.mod) and the pinned GPU Operator's supported range are
held to it by tests/stack/test_kubernetes_version.py.

Reading a file at import is fine here (tests only); the webhook's pure core never does.
"""

from __future__ import annotations

from pathlib import Path

from webhook.stack import manifests

REPO = Path(__file__).resolve().parents[1]

KUBERNETES_MINOR: int = manifests.load_stack(REPO).kubernetes_minor
"""The cluster's Kubernetes minor (36 for ``kubernetesVersion: '1.36'``)."""

KUBERNETES_VERSION: str = f"1.{KUBERNETES_MINOR}"
"""``"1.NN"``, the form kubernetes-validate and ``stack.yaml`` use."""
