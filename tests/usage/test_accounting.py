"""What a pod holds, in physical GPUs, for every unit kind; and each node's physical GPUs.

The shares are webhook/kube/units.py's: these tests state the expected figure a person would
(three whole GPUs are 3, seven 1g slices are one GPU, a slot of four is a quarter), so a change
of the table that changes a bill fails here.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.usage.cluster import claim, dra_node, gpus_of, node, pod, slices, snapshot
from webhook.usage.workloads import Owner

DEPLOYMENT = ("ReplicaSet", "train-7c9f8d")


@pytest.mark.parametrize(("gpu_node", "resources", "holds", "physical"), [
    (node("n", gpus=8), {"nvidia.com/gpu": 3}, {("p", "whole"): 3.0}, 8),
    (node("n", mig={"1g.10gb": 56}), {"nvidia.com/mig-1g.10gb": 7}, {("p", "mig"): 1.0}, 8),
    (node("n", mig={"3g.40gb": 8}), {"nvidia.com/mig-3g.40gb": 2}, {("p", "mig"): round(6 / 7, 9)}, 4),
    (node("n", gpus=4, mig={"1g.10gb": 28}), {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/gpu": 1},
     {("p", "mig"): round(1 / 7, 9), ("p", "whole"): 1.0}, 8),
    (node("n", shared=16, replicas=4), {"nvidia.com/gpu.shared": 1}, {("p", "slot"): 0.25}, 4),
    (node("n", gpus=16, replicas=4), {"nvidia.com/gpu": 1}, {("p", "slot"): 0.25}, 4),
    (node("n", gpus=56, product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"), {"nvidia.com/gpu": 7}, {("p", "mig"): 1.0}, 8),
], ids=["whole", "mig-1g", "mig-3g-leaves-a-slice-unused", "mixed", "slot-renamed", "slot-not-renamed",
        "mig-single-strategy"])
def test_a_device_plugin_unit_is_its_share_of_a_physical_gpu(gpu_node: dict, resources: dict, holds: dict,
                                                             physical: int) -> None:
    snap = snapshot([gpu_node], [pod("p", "n", resources)])
    assert gpus_of(snap) == holds
    assert snap.physical == (("n", physical),)


def test_a_dra_device_counts_whole_a_mig_device_as_its_slice_and_a_share_as_its_consumed_memory() -> None:
    found = slices("d", 4) + slices("m", 1, mig=True) + slices("s", 2, shares=True)
    half = f"{81559 // 2}Mi"
    claims = [claim("whole", "d", ["gpu-0", "gpu-1"], pods=["trainer"]),
              claim("slice", "m", ["gpu-0-mig-1g10gb-19-3"], pods=["small"]),
              claim("half", "s", ["gpu-0"], pods=["infer"], memory=half),
              claim("pair", "s", ["gpu-1"], pods=["a", "b"], memory="81559Mi")]
    pods = [pod(name, n, claims=[c]) for name, n, c in
            (("trainer", "d", "whole"), ("small", "m", "slice"), ("infer", "s", "half"), ("a", "s", "pair"),
             ("b", "s", "pair"))]
    snap = snapshot([dra_node("d"), dra_node("m"), dra_node("s")], pods, found, claims)
    assert gpus_of(snap) == {("trainer", "whole"): 2.0, ("small", "mig"): round(1 / 7, 9),
                             ("infer", "share"): round((81559 // 2) / 81559, 9), ("a", "share"): 0.5,
                             ("b", "share"): 0.5}
    assert dict(snap.physical) == {"d": 4, "m": 1, "s": 2}


def test_a_claim_whose_pod_the_balancer_has_not_seen_is_billed_to_that_pod() -> None:
    snap = snapshot([dra_node("d")], [], slices("d", 1), [claim("c", "d", ["gpu-0"], pods=["ghost"])])
    [held] = snap.holdings
    assert (held.pod, held.owner, held.gpus) == ("ghost", Owner("Pod", "ghost"), 1.0)


def test_gpu_hours_go_to_the_top_controller() -> None:
    pods = [pod("train-7c9f8d-x2x", "n", {"nvidia.com/gpu": 2}, owner=DEPLOYMENT, template_hash="7c9f8d"),
            pod("notebook-0", "n", {"nvidia.com/gpu": 1}, owner=("StatefulSet", "notebook")),
            pod("debug", "n", {"nvidia.com/gpu": 1})]
    owners = {h.pod: h.owner for h in snapshot([node("n", gpus=8)], pods).holdings}
    assert owners == {"train-7c9f8d-x2x": Owner("Deployment", "train"), "notebook-0": Owner("StatefulSet", "notebook"),
                      "debug": Owner("Pod", "debug")}


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_holds_nothing(phase: str) -> None:
    assert snapshot([node("n", gpus=8)], [pod("p", "n", {"nvidia.com/gpu": 8}, phase=phase)]).holdings == ()


def test_unallocated_is_what_no_pod_holds_and_never_below_zero() -> None:
    snap = snapshot([node("a", gpus=8), node("b", mig={"1g.10gb": 7})],
                    [pod("p", "a", {"nvidia.com/gpu": 3}), pod("q", "b", {"nvidia.com/mig-1g.10gb": 7})])
    assert {n: round(g, 9) for n, g in snap.unallocated().items()} == {"a": 5.0, "b": 0.0}


def test_mig_slices_a_layout_leaves_unused_are_unallocated_capacity_of_the_physical_gpus() -> None:
    """Eight H100s in all-2g.20gb offer 24 slices of 2/7: full, they hold 48/7 GPUs of GFD's 8."""
    snap = snapshot([node("n", mig={"2g.20gb": 24}, count=8)],
                    [pod(f"p{i}", "n", {"nvidia.com/mig-2g.20gb": 1}) for i in range(24)])
    assert snap.physical == (("n", 8),)
    assert sum(h.gpus for h in snap.holdings) == pytest.approx(48 / 7)
    assert snap.unallocated()["n"] == pytest.approx(8 / 7)


def test_gfds_count_never_makes_a_node_smaller_than_what_it_offers() -> None:
    assert snapshot([node("n", gpus=8, count=4)], []).physical == (("n", 8),)


NODE_KINDS = st.sampled_from([
    ("nvidia.com/gpu", {"gpus": 8}, 8, True), ("nvidia.com/mig-1g.10gb", {"mig": {"1g.10gb": 56}}, 56, True),
    ("nvidia.com/mig-2g.20gb", {"mig": {"2g.20gb": 24}, "count": 8}, 24, False),
    ("nvidia.com/gpu.shared", {"shared": 32, "replicas": 4}, 32, True),
    ("nvidia.com/gpu", {"gpus": 24, "replicas": 3}, 24, True)])


@settings(max_examples=60, deadline=None)
@given(kind=NODE_KINDS, asks=st.lists(st.integers(min_value=1, max_value=8), max_size=12))
def test_no_node_is_ever_billed_more_than_its_physical_gpus_and_a_full_node_exactly_them(
        kind: tuple[str, dict, int, bool], asks: list[int]) -> None:
    """Pods take units until the node is full (the scheduler's fit); the holdings never pass the
    physical GPUs, and a node whose every unit is taken is billed its physical GPUs to 1e-9 when its
    units cover its GPUs."""
    resource, shape, units_offered, covers = kind
    taken, pods = 0, []
    for i, ask in enumerate(asks):
        ask = 1 if resource == "nvidia.com/gpu.shared" or "replicas" in shape else ask
        if taken + ask <= units_offered:
            pods.append(pod(f"p{i}", "n", {resource: ask}))
            taken += ask
    snap = snapshot([node("n", **shape)], pods)
    [(_, physical)] = snap.physical
    assert sum(h.gpus for h in snap.holdings) <= physical + 1e-9
    full = snapshot([node("n", **shape)], [pod(f"f{i}", "n", {resource: 1}) for i in range(units_offered)])
    held = sum(h.gpus for h in full.holdings)
    assert held == pytest.approx(physical, abs=1e-9) if covers else held < physical
