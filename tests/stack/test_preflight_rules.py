"""The preflight rules' building blocks, as tables (pure): what a recorded state is, which pools a change
reloads, how a served CRD is compared with the target's, what counts as a pod that pins the driver."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.stack.conftest import ROOT
from webhook.errors import GpugateError
from webhook.stack import manifests
from webhook.stack import matrix as matrix_data
from webhook.stack.change import Change, reloaded_pools
from webhook.stack.clusterstate import ClusterSnapshot
from webhook.stack.consumers import deleted_by_upgrade, reaches_gpu
from webhook.stack.crdstate import crd_shape, staleness
from webhook.stack.releases import OperatorVersion

SHIPPED = manifests.load_stack(ROOT)
M = matrix_data.load()


def change(final, current=SHIPPED) -> Change:
    return Change(action="sync", matrix=M, release=M.release(final.operator_version), current=current, final=final)


@pytest.mark.parametrize(("edit", "reloaded"), [
    (lambda s: s.with_pool("canary", driver="610.57.04"), ("canary",)),
    (lambda s: s.with_pool("canary", labels={"team": "ml"}), ()),          # restart-only: no module unload
    (lambda s: s.with_pool("canary", cr_name="canary-2"), ("canary",)),    # a new CR, a new DaemonSet
    (lambda s: s.with_pool("canary", upgrade_policy={"autoUpgrade": False}), ()),
    (lambda s: s, ()),
])
def test_a_change_reloads_the_pools_whose_driver_pods_it_remakes(edit, reloaded):
    assert reloaded_pools(change(edit(SHIPPED))) == reloaded


def test_moving_the_operator_reloads_every_pool():
    older = SHIPPED.replace(operator_version=OperatorVersion.parse("v26.3.3"))
    assert reloaded_pools(change(SHIPPED, current=older)) == ("default", "canary")


def test_a_recording_is_read_by_kind_lists_opened_and_a_foreign_kind_refused_naming_it():
    state = ClusterSnapshot.from_objects([{"kind": "NodeList", "items": [{"metadata": {"name": "n1"}}]},
                                       {"kind": "Pod", "metadata": {"name": "p"}}], source="f.yaml")
    assert [n["kind"] for n in state.nodes] == ["Node"] and len(state.pods) == 1 and state.crds is None
    with pytest.raises(GpugateError, match=r"f.yaml, object 1: kind Service is not one"):
        ClusterSnapshot.from_objects([{"kind": "Service"}], source="f.yaml")


def test_an_age_is_measured_to_when_the_state_was_read():
    state = ClusterSnapshot(observed_at=datetime(2026, 9, 1, 12, 0, tzinfo=UTC))
    assert state.age_seconds("2026-09-01T11:50:00Z") == 600
    assert state.age_seconds("not a time") is None and ClusterSnapshot().age_seconds("2026-09-01T11:50:00Z") is None


def crd(version: str, properties: dict, required: list[str] | None = None) -> dict:
    spec = {"type": "object", "properties": properties}
    if required:
        spec["required"] = required
    return {"kind": "CustomResourceDefinition", "metadata": {"name": "widgets.example.com"},
            "spec": {"versions": [{"name": version, "served": True,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "properties": {"spec": spec}}}}]}}


def test_a_served_crd_is_stale_by_the_fields_it_lacks_and_the_ones_it_still_requires():
    target = crd_shape(crd("v1", {"a": {"type": "string"}, "b": {"type": "object", "properties": {
        "c": {"type": "string"}}}}))
    served = crd("v1", {"a": {"type": "string"}, "old": {"type": "string"}}, required=["old"])
    problems = staleness(target, served)
    assert "lacks 2 field(s) the API server would prune: spec.b, spec.b.c" in problems[0]
    assert "still requires spec.old" in problems[1]
    assert staleness(target, None) == ["widgets.example.com is not served"]
    assert staleness(target, crd("v2", {})) == ["widgets.example.com does not serve v1"]


@given(st.dictionaries(st.sampled_from("abcdef"), st.just({"type": "string"}), max_size=6))
def test_a_crd_served_as_the_target_declares_it_is_never_stale(properties):
    assert staleness(crd_shape(crd("v1", properties)), crd("v1", properties)) == []


def pod(**spec) -> dict:
    return {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}], **spec}}


@pytest.mark.parametrize(("spec", "ignored", "ways"), [
    ({"volumes": [{"name": "d", "hostPath": {"path": "/dev/nvidia0"}}]}, True, 1),
    ({"containers": [{"name": "c", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}, False, 1),
    ({"containers": [{"name": "c", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}, True, 0),
    ({"containers": [{"name": "c", "securityContext": {"privileged": True},
                      "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}, True, 1),
    ({"containers": [{"name": "c", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]}]}, False, 0),
    ({"runtimeClassName": "nvidia"}, False, 1),
    ({"runtimeClassName": "nvidia"}, True, 0),
])
def test_how_a_pod_reaches_a_gpu_depends_on_the_hardening(spec, ignored, ways):
    assert len(reaches_gpu(pod(**spec), envvar_ignored=ignored)) == ways


def test_the_upgrade_deletes_pods_asking_nvidia_gpus_but_never_a_daemonsets():
    asks = pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}])
    assert deleted_by_upgrade(asks)
    asks["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "x", "controller": True}]
    assert not deleted_by_upgrade(asks)
    assert not deleted_by_upgrade(pod())
