"""The one table of GPU units: every consumer reads a unit's share of a GPU from it.

The balancer's allocation share (``marks.gpu_weight``), the replay's accounting of physical GPU
thousandths (``migcluster.physical_milli``) and the policy parser's default compute of a MIG rung
used to compute these each on their own; the replay disagreed with the balancer on time-sliced MIG
slices. Now they agree on every resource, because they read ``webhook.kube.units``.
"""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook import names
from webhook.kube import units
from webhook.kube.gpunode import NodeInfo
from webhook.kube.resources import mig_profile
from webhook.kube.units import is_gpu_resource
from webhook.placement import marks
from webhook.policy import parsing
from webhook.replay import migcluster

MIG = [f"nvidia.com/mig-{g}g.{m}gb" for g, m in ((1, 10), (2, 20), (3, 40), (4, 40), (7, 80), (1, 5))]
RESOURCES = [names.GPU_RESOURCE, names.SHARED_GPU_RESOURCE, *MIG, *(r + ".shared" for r in MIG)]


def node(resource: str, replicas: int, mig_replicas: int) -> NodeInfo:
    base = units.mig_base(resource)
    return NodeInfo(name="n", resource_version="", allocatable=((resource, 8),), owned_labels=(), taints=(),
                    replicas=replicas, hostnames=("n",),
                    mig_replicas=((base, mig_replicas),) if resource.startswith(names.MIG_RESOURCE_PREFIX) else ())


@pytest.mark.parametrize(("resource", "share"), [
    ("nvidia.com/gpu", 1.0), ("nvidia.com/gpu.shared", 0.25),
    ("nvidia.com/mig-1g.10gb", 1 / 7), ("nvidia.com/mig-3g.40gb", 3 / 7), ("nvidia.com/mig-7g.80gb", 1.0),
    ("nvidia.com/cx7_sriov_rdma", 0.0), ("cpu", 0.0),
])
def test_a_unit_is_its_share_of_one_gpu(resource: str, share: float) -> None:
    assert units.gpu_share(resource, replicas=4) == pytest.approx(share)


def test_a_time_sliced_mig_slice_is_a_slot_of_its_slice() -> None:
    """The MIG-replica rule: g/7 divided by the profile's own replicas, renamed (.shared) or not."""
    assert units.gpu_share("nvidia.com/mig-1g.10gb", mig_replicas=2) == pytest.approx(1 / 14)
    assert units.gpu_share("nvidia.com/mig-1g.10gb.shared", mig_replicas=2) == pytest.approx(1 / 14)


@given(st.sampled_from(RESOURCES), st.integers(1, 16), st.integers(1, 8))
def test_the_balancer_and_the_replay_agree_on_every_units_share(resource: str, replicas: int,
                                                                mig_replicas: int) -> None:
    info = node(resource, replicas, mig_replicas)
    sliced = marks.time_sliced(info)  # nvidia.com/gpu with replicas and no renamed .shared resource
    weight = marks.gpu_weight(info, resource)
    assert weight == pytest.approx(units.gpu_share(resource, replicas=replicas, mig_replicas=mig_replicas,
                                                   gpu_time_sliced=sliced))
    milli = migcluster.physical_milli(resource, 1, replicas, mig_replicas=mig_replicas, gpu_time_sliced=sliced)
    assert milli == round(units.MILLI * weight)


@pytest.mark.parametrize("profile", ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"])
def test_a_mig_rung_gets_its_compute_and_memory_from_the_table(profile: str) -> None:
    policy = parsing.parse([("p.yaml", f"""
apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {{name: p}}
spec:
  rightsizing: {{ladder: [{{mig: {profile}}}]}}
""")]).policies[0]
    rung = policy.rightsizing.ladder[0] if policy.rightsizing else None
    unit = units.unit_of(f"nvidia.com/mig-{profile}")
    assert rung is not None and unit is not None and unit.mig is not None
    assert rung.compute == pytest.approx(unit.compute)
    assert rung.memory_bytes == units.mig_memory_bytes(unit.mig)


def test_the_policy_schema_names_exactly_the_gpu_resources_the_code_knows() -> None:
    """One regular expression: the schema's ``resource`` pattern is the code's, character for character."""
    schema = json.loads(resources.files("webhook.policy").joinpath("schema.json").read_text())
    assert schema["$defs"]["resource"]["pattern"] == units.gpu_resource_pattern()
    pattern = re.compile(units.gpu_resource_pattern())
    for name in [*RESOURCES, "nvidia.com/gpu.x", "nvidia.com/mig-0g.10gb", "nvidia.com/cx7_sriov_rdma",
                 "nvidia.com/mig-1g.10gb.me", "example.com/gpu"]:
        assert (pattern.match(name) is not None) == is_gpu_resource(name), name
    assert mig_profile("nvidia.com/mig-2g.20gb.shared") is not None
