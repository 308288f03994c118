"""The stand-in's rules, read against GPU Operator v26.7.0, without a cluster (pure functions).

Each is a correction of a deviation from NVIDIA's upgrade controller; the e2e tests (test_driver_upgrades.py,
test_argocd.py) show them against the API server.
"""

from __future__ import annotations

import pytest

from tests.e2e.argocd_standin import (
    DIGEST_ENV,
    OwnershipConflict,
    daemonset_ready,
    desired_owners,
    driver_daemonset,
)


def cr(name: str, *, default: bool = False, selector: dict[str, str] | None = None, **spec: object) -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"default": default, "nodeSelector": selector or {}, "version": "595.91.07", **spec}}


def test_owners_follow_selectors_then_the_default_and_an_unclaimed_node_has_none():
    """internal/nvidiadriver/nvidiadriver.go AssignOwners / desiredOwnerForNode."""
    nodes = {"a": {"pool": "canary"}, "b": {}, "c": {"pool": "gold"}}
    owners = desired_owners([cr("default", default=True), cr("canary", selector={"pool": "canary"})], nodes)
    assert owners == {"a": "canary", "b": "default", "c": "default"}
    assert desired_owners([cr("canary", selector={"pool": "canary"})], nodes) == {"a": "canary"}


@pytest.mark.parametrize(("drivers", "conflicted"), [
    ([cr("one", selector={"pool": "canary"}), cr("two", selector={"pool": "canary"})], {"one", "two"}),
    ([cr("d1", default=True), cr("d2", default=True)], {"d1", "d2"}),
])
def test_any_conflict_fails_the_whole_assignment(drivers, conflicted):
    """The operator changes no owner label at all then (fail closed), not the unconflicted ones."""
    with pytest.raises(OwnershipConflict) as caught:
        desired_owners(drivers, {"a": {"pool": "canary"}, "b": {}})
    assert set(caught.value.by_driver) == conflicted


def _digest(ds: dict) -> set[str]:
    spec = ds["spec"]["template"]["spec"]
    containers = spec["initContainers"] + spec["containers"]
    return {e["value"] for c in containers for e in c["env"] if e["name"] == DIGEST_ENV}


def test_the_driver_config_digest_changes_with_the_driver_and_not_with_a_label():
    """controllers/object_controls.go: the digest hashes what installs the driver, so a label-only
    change takes k8s-operator-libs' restart-only path (internal/predicates/restart_only.go)."""
    base = driver_daemonset(cr("canary"), ("ubuntu", "24.04"), "gpu-operator")
    labelled = driver_daemonset(cr("canary", labels={"team": "ml"}), ("ubuntu", "24.04"), "gpu-operator")
    newer = driver_daemonset(cr("canary", version="610.57.04"), ("ubuntu", "24.04"), "gpu-operator")
    assert len(_digest(base)) == 1 and _digest(base) == _digest(labelled) != _digest(newer)
    assert base["spec"]["template"] != labelled["spec"]["template"]
    assert base["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert base["metadata"]["name"].startswith("nvidia-gpu-driver-ubuntu24.04-")
    image = base["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "nvcr.io/nvidia/driver:595.91.07-ubuntu24.04"
    selector = base["spec"]["template"]["spec"]["nodeSelector"]
    assert selector["nvidia.com/gpu-operator.driver.owner"] == "canary" and selector["nvidia.com/gpu.present"] == "true"


@pytest.mark.parametrize(("status", "generation", "ready"), [
    ({"observedGeneration": 2, "desiredNumberScheduled": 2, "numberAvailable": 2, "updatedNumberScheduled": 2}, 2,
     True),
    ({"observedGeneration": 2, "desiredNumberScheduled": 2, "numberAvailable": 2, "updatedNumberScheduled": 1}, 2,
     False),
    ({"observedGeneration": 2, "desiredNumberScheduled": 2, "numberAvailable": 1, "updatedNumberScheduled": 2}, 2,
     False),
    ({"observedGeneration": 3, "desiredNumberScheduled": 0}, 3, True),
    ({"observedGeneration": 1, "desiredNumberScheduled": 0}, 2, False),
])
def test_a_driver_daemonset_is_ready_as_the_operator_reads_it(status, generation, ready):
    """internal/state/state_skel.go isDaemonSetReady."""
    assert daemonset_ready({"metadata": {"generation": generation}, "status": status}) is ready
