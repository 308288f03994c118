"""One Kubernetes version for "the cluster we target": stack.yaml, the e2e control plane, the operator's range.

``cluster.kubernetesVersion`` in manifests/gpu-operator/stack.yaml is the home of that version
(tests/kubeversion.py reads it for every other test). The e2e control plane is built from
``k8s.io/kubernetes`` at the version webhook/localcluster/toolchain/kubernetes/go.mod requires, and the
pinned GPU Operator supports a range of minors (webhook/stack/data/matrix.yaml). These tests need
no binaries: they read the two files and run the stack tool's own range check.
"""

from __future__ import annotations

from tests.kubeversion import REPO
from webhook.localcluster import binaries
from webhook.stack import compat, manifests
from webhook.stack import matrix as matrix_data


def _go_mod_minor() -> tuple[str, int]:
    full = binaries.version(binaries.KUBERNETES)  # "v1.37.2", from go.mod's require line
    major, minor = full.removeprefix("v").split(".")[:2]
    assert major == "1", full
    return full, int(minor)


def test_stack_yaml_names_the_minor_the_e2e_control_plane_is_built_at():
    full, minor = _go_mod_minor()
    declared = manifests.load_stack(REPO).kubernetes_minor
    assert declared == minor, (
        f"{manifests.STACK_FILE} says cluster.kubernetesVersion 1.{declared}, but the e2e control plane is "
        f"k8s.io/kubernetes {full} (webhook/localcluster/toolchain/kubernetes/go.mod); move one to the other "
        f"(`gpugate stack upgrade --operator <current> --kubernetes 1.{minor}`)")


def test_stack_yaml_kubernetes_is_accepted_by_the_pinned_operators_range_check():
    """Inside NVIDIA's listed range, or newer with the warning `gpugate stack` prints (never older)."""
    stack = manifests.load_stack(REPO)
    release = matrix_data.load().release(stack.operator_version)
    check = compat.check_kubernetes(release, stack.kubernetes_minor)  # the check `gpugate stack` runs
    assert check.ok, check.reason
    assert stack.kubernetes_minor >= release.kubernetes_min
    assert bool(check.warning) is (stack.kubernetes_minor > release.kubernetes_max), check.reason


def test_the_e2e_control_plane_is_inside_the_pinned_operators_supported_range():
    full, minor = _go_mod_minor()
    release = matrix_data.load().release(manifests.load_stack(REPO).operator_version)
    check = compat.check_kubernetes(release, minor)
    assert check.ok, f"k8s.io/kubernetes {full}: {check.reason}"
