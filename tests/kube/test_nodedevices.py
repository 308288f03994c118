"""What a node's DRA devices leave free once claims hold some (webhook/kube/nodedevices.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.e2e import dra_slices
from webhook.kube import allocations, nodedevices, slices
from webhook.kube.allocations import DeviceKey

NODE = "gpu-1"


def node(count: int = 2, *, mig: bool = False, generation: int = 1) -> list[slices.Slice]:
    return [slices.parse(s) for s in dra_slices.node_slices(NODE, dra_slices.gpus(count, node=NODE, mig=mig),
                                                           generation=generation)]


def key(device: str) -> DeviceKey:
    return DeviceKey("gpu.nvidia.com", NODE, device)


def claim(*devices: str, reserved: bool = True, admin: bool = False) -> allocations.Claim:
    results = tuple(allocations.Allocated(request="gpus", key=key(d), admin_access=admin) for d in devices)
    return allocations.Claim(namespace="ml", name="c", allocated=True, results=results,
                        reserved_for=(allocations.Consumer(resource="pods", name="p", uid="u"),) if reserved else ())


def devices_of(found: list[slices.Slice], *held: allocations.Claim) -> nodedevices.NodeDevices:
    return nodedevices.by_node(found, nodedevices.held_keys(held))[NODE]


def free(devs: nodedevices.NodeDevices) -> set[str]:
    return {d.key.device for d in devs.devices if d.free}


def test_a_held_gpu_is_not_free_and_counts_as_one_gpu_unit() -> None:
    devs = devices_of(node(2), claim("gpu-0"))
    assert (devs.gpus, devs.whole_free, devs.held_units) == (2, 1, (("nvidia.com/gpu", 1),))
    assert devs.product == "NVIDIA H100 80GB HBM3"


def test_a_claim_no_pod_reserves_or_an_admin_access_result_holds_nothing() -> None:
    assert devices_of(node(2), claim("gpu-0", reserved=False)).whole_free == 2
    assert devices_of(node(2), claim("gpu-0", admin=True)).whole_free == 2


def test_one_mig_partition_takes_its_gpu_out_of_the_whole_ones_and_its_memory_slice_from_the_rest() -> None:
    devs = devices_of(node(1, mig=True), claim("gpu-0-mig-1g10gb-19-0"))
    assert (devs.gpus, devs.whole_free) == (1, 0)
    assert devs.held_units == (("nvidia.com/mig-1g.10gb", 1),)
    left = free(devs)
    assert "gpu-0" not in left and "gpu-0-mig-7g80gb-0-0" not in left
    assert "gpu-0-mig-2g20gb-14-0" not in left  # memory slices 0-1: slice 0 is taken
    assert {"gpu-0-mig-2g20gb-14-2", "gpu-0-mig-3g40gb-9-4", "gpu-0-mig-1g10gb-19-1"} <= left


def test_a_whole_partitionable_gpu_held_leaves_none_of_its_partitions() -> None:
    devs = devices_of(node(1, mig=True), claim("gpu-0"))
    assert free(devs) == set()


def test_seven_1g_partitions_leave_no_room_for_any_other_partition() -> None:
    """Seven 1g.10gb (16 SMs each, slices 0-6) leave 20 SMs and memory slice 7: no other partition fits."""
    held = claim(*(f"gpu-0-mig-1g10gb-19-{i}" for i in range(7)))
    devs = devices_of(node(1, mig=True), held)
    assert free(devs) == set()
    assert devs.held_units == (("nvidia.com/mig-1g.10gb", 7),)


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    stale = node(4, generation=1)
    fresh = node(2, generation=2)  # the driver republished with 2 GPUs; the 4-GPU slices linger
    devs = nodedevices.by_node(stale + fresh, frozenset())[NODE]
    assert devs.gpus == 2


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 3)), st.booleans())
def test_whole_free_plus_gpus_claims_touch_is_every_gpu(held: set[int], mig: bool) -> None:
    devs = devices_of(node(4, mig=mig), claim(*(f"gpu-{i}" for i in sorted(held))))
    assert devs.whole_free == 4 - len(held)
    assert dict(devs.held_units).get("nvidia.com/gpu", 0) == len(held)
