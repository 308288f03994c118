"""Every GPU resource name, the DRA extended-resource names included (kube.units), and the claim
kube-scheduler makes for them recomputed from the pod (kube.claimowners).

Kubernetes 1.37 serves a pod's ``deviceclass.resource.kubernetes.io/<class>`` and a class's
``extendedResourceName`` through a claim of that class (k8s.io/api/resource/v1
``ResourceDeviceClassPrefix``; kube-scheduler's ``extendeddynamicresources.go``): each is a GPU ask
when the class can hold GPUs, and one of a class not known is judged as one, never let through.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.policy.kit import container, pod
from webhook.kube import claimowners, demand, units

MAPPED_MIG = {"metadata": {"name": "mig-1g.12gb", "creationTimestamp": "2026-09-01T00:00:00Z"},
              "spec": {"extendedResourceName": "example.com/small-gpu", "selectors": [{"cel": {"expression": (
                  "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && "
                  "device.attributes['gpu.nvidia.com'].profile == '1g.12gb'")}}]}}
NIC = {"metadata": {"name": "nic.example.com"},
       "spec": {"extendedResourceName": "example.com/nic", "selectors": [{"cel": {"expression": (
           "device.driver == 'nic.example.com'")}}]}}
EVERYTHING = {"metadata": {"name": "any"}, "spec": {"extendedResourceName": "example.com/any"}}
CLASSES = units.DeviceClasses.from_documents([MAPPED_MIG, NIC, EVERYTHING])
NAMES = units.gpu_names(CLASSES)


@pytest.mark.parametrize(("resource", "share", "device_class", "known"), [
    ("nvidia.com/gpu", 1, None, True),
    ("nvidia.com/gpu.shared", Fraction(1, 4), None, True),
    ("nvidia.com/mig-3g.40gb", Fraction(3, 7), None, True),
    ("deviceclass.resource.kubernetes.io/mig-1g.12gb", Fraction(1, 7), "mig-1g.12gb", True),
    ("example.com/small-gpu", Fraction(1, 7), "mig-1g.12gb", True),
    ("example.com/any", 1, "any", True),  # no selector: any device of any driver, GPUs included
    ("deviceclass.resource.kubernetes.io/unknown", 1, "unknown", False),
])
def test_a_gpu_name_is_counted_in_its_classs_gpu_units(resource: str, share: Fraction, device_class: str | None,
                                                       known: bool) -> None:
    name = NAMES.of(resource)
    assert name is not None
    assert (name.share, name.device_class, name.known) == (share, device_class, known)


@pytest.mark.parametrize("resource", ["cpu", "memory", "example.com/nic", "nvidia.com/cx7_sriov_rdma",
                                      "deviceclass.resource.kubernetes.io/nic.example.com", "hugepages-2Mi",
                                      "example.com/unmapped"])
def test_other_resources_are_no_gpu_ask(resource: str) -> None:
    assert NAMES.of(resource) is None


def test_before_the_cluster_is_read_the_nvidia_classes_are_assumed() -> None:
    assumed = units.gpu_names()
    assert not units.ASSUMED.learned and CLASSES.learned
    assert assumed.of("deviceclass.resource.kubernetes.io/gpu.nvidia.com") == units.GpuName(
        "deviceclass.resource.kubernetes.io/gpu.nvidia.com", Fraction(1), "gpu.nvidia.com")
    assert assumed.of("example.com/small-gpu") is None  # a class's own name needs the class
    assert assumed.of("deviceclass.resource.kubernetes.io/mig-1g.12gb").known is False  # type: ignore[union-attr]


def test_a_class_listed_by_a_policy_is_governed_whatever_its_selectors() -> None:
    listed = units.gpu_names(CLASSES, frozenset({"nic.example.com"}))
    assert listed.of("example.com/nic") is not None


def test_a_bad_device_class_is_refused_naming_the_field() -> None:
    with pytest.raises(units.DeviceClassError, match=r"spec.selectors\[0\].cel.expression"):
        units.DeviceClasses.from_documents([{"metadata": {"name": "x"}, "spec": {"selectors": [{"cel": {}}]}}])


def test_a_pods_gpu_units_follow_kubernetes_rule_for_init_containers_over_every_name() -> None:
    """The init container's peak is the peak of the sum over names, not per name."""
    init = container("setup", limits={"nvidia.com/mig-3g.40gb": "2", "example.com/small-gpu": "1"})
    p = pod(container("a", limits={"nvidia.com/gpu": "1"}),
            container("b", limits={"deviceclass.resource.kubernetes.io/mig-1g.12gb": "2"}), init=[init])
    assert demand.gpu_units(p, NAMES) == max(Fraction(1) + Fraction(2, 7), Fraction(6, 7) + Fraction(1, 7))
    sidecar = {**init, "restartPolicy": "Always"}
    p["spec"]["initContainers"] = [sidecar]
    assert demand.gpu_units(p, NAMES) == Fraction(1) + Fraction(2, 7) + Fraction(6, 7) + Fraction(1, 7)


# --- the claim kube-scheduler makes, recomputed ---------------------------------------------------

def scheduler_pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    p = pod(*containers, init=init, name="p")
    p["metadata"]["uid"] = "u"
    return p


def requests(found: tuple[claimowners.Expected, ...]) -> list[tuple[str, int]]:
    return [(r.name, r.count) for r in found]


def test_one_request_per_container_and_resource_named_by_index_and_sorted_key() -> None:
    """container-<i>-request-<j>: i counts init containers first; j is the resource's place among
    the container's request names sorted (cpu and memory too)."""
    p = scheduler_pod(container("a", requests={"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2"},
                                limits={"nvidia.com/gpu": "2"}),
                      container("b", limits={"nvidia.com/gpu": "1"}),
                      init=[container("i", limits={"nvidia.com/gpu": "1"})])
    assert requests(claimowners.scheduler_requests(p, frozenset({"nvidia.com/gpu"}))) == [
        ("container-1-request-2", 2), ("container-2-request-0", 1)]


def test_plain_init_containers_reuse_the_long_lived_requests_and_the_largest_remainder_counts() -> None:
    p = scheduler_pod(container("a", limits={"nvidia.com/gpu": "1"}),
                      init=[container("i0", limits={"nvidia.com/gpu": "4"}),
                            container("i1", limits={"nvidia.com/gpu": "2"})])
    assert requests(claimowners.scheduler_requests(p, frozenset({"nvidia.com/gpu"}))) == [
        ("container-0-request-0", 3), ("container-2-request-0", 1)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=3), st.lists(st.tuples(st.integers(0, 4), st.booleans()),
                                                                     max_size=3))
def test_the_schedulers_claim_never_holds_more_than_the_pod_asks(apps: list[int], inits: list[tuple[int, bool]]
                                                                 ) -> None:
    """What kube-scheduler's claim asks is at most the pod's effective request (which admission
    judged): a claim of that shape holding more is not the scheduler's."""
    p = scheduler_pod(*(container(f"c{i}", limits={"nvidia.com/gpu": str(n)} if n else None)
                        for i, n in enumerate(apps)),
                      init=[{**container(f"i{i}", limits={"nvidia.com/gpu": str(n)} if n else None),
                             **({"restartPolicy": "Always"} if always else {})} for i, (n, always) in enumerate(inits)])
    held = sum(r.count for r in claimowners.scheduler_requests(p, frozenset({"nvidia.com/gpu"})))
    assert held == demand.gpu_units(p)
