"""ResourceSlices and ResourceClaims as the offers side reads them (webhook/kube/slices.py, claims.py).

The slices are the ones tests/e2e/dra_slices.py publishes on the real control plane, built the way
kubernetes-sigs/dra-driver-nvidia-gpu builds them (cmd/gpu-kubelet-plugin/deviceinfo.go, mig.go,
partitions.go, driver.go), so a shape the API server accepts there is a shape parsed here.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.e2e import dra_slices
from webhook.kube import allocations, inventory, slices

NODE = "gpu-1"


def test_a_full_gpu_reads_as_the_driver_publishes_it() -> None:
    found = [slices.parse(s) for s in dra_slices.node_slices(NODE, dra_slices.gpus(2, node=NODE))]
    assert [(s.driver, s.pool, s.node, s.slice_count) for s in found] == [("gpu.nvidia.com", NODE, NODE, 2)] * 2
    device = found[0].devices[0]
    assert device.name == "gpu-0"
    assert (device.type, device.product, device.memory_bytes) == ("gpu", "NVIDIA H100 80GB HBM3", 81559 << 20)
    assert device.attribute("driverVersion") == "580.95.5"
    assert device.uuid.startswith("GPU-")
    assert slices.device_class(device, found[0].driver) == "gpu.nvidia.com"


def test_a_mig_capable_gpu_has_a_counter_slice_and_partitions_that_draw_on_it() -> None:
    raw = dra_slices.node_slices(NODE, dra_slices.gpus(1, node=NODE, mig=True))
    counters, devices = (slices.parse(s) for s in raw)
    assert not counters.devices and [c.name for c in counters.shared_counters] == ["gpu-0-counter-set"]
    assert dict(counters.shared_counters[0].counters)["memory-slice-7"] == "1"
    names = [d.name for d in devices.devices]
    assert names[0] == "gpu-0" and "gpu-0-mig-1g10gb-19-6" in names and "gpu-0-mig-3g40gb-9-4" in names
    mig = next(d for d in devices.devices if d.name == "gpu-0-mig-2g20gb-14-2")
    assert (mig.type, mig.profile, mig.parent_uuid) == ("mig", "2g.20gb", devices.devices[0].uuid)
    assert slices.device_class(mig, devices.driver) == "mig.nvidia.com"
    use = dict(mig.consumes[0].counters)
    assert mig.consumes[0].counter_set == "gpu-0-counter-set"
    assert {k for k in use if k.startswith("memory-slice-")} == {"memory-slice-2", "memory-slice-3"}


def test_attributes_read_bare_or_qualified_by_the_driver_domain() -> None:
    raw = dra_slices.node_slices(NODE, dra_slices.gpus(1, node=NODE))[0]
    attributes = raw["spec"]["devices"][0]["attributes"]
    attributes["gpu.nvidia.com/productName"] = attributes.pop("productName")
    assert slices.parse(raw).devices[0].product == "NVIDIA H100 80GB HBM3"


def test_another_driver_s_device_is_no_nvidia_class() -> None:
    raw = dra_slices.node_slices(NODE, dra_slices.gpus(1, node=NODE))[0]
    raw["spec"]["driver"] = "gpu.example.com"
    found = slices.parse(raw)
    assert slices.device_class(found.devices[0], found.driver) is None


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s["spec"].pop("driver"), "spec.driver: expected a non-empty string"),
    (lambda s: s["spec"]["pool"].update(generation="1"), "spec.pool.generation: expected a whole number"),
    (lambda s: s["spec"]["devices"][0]["capacity"]["memory"].update(value="lots"),
     "spec.devices[0].capacity[memory].value: 'lots' is not a quantity"),
    (lambda s: s["spec"]["devices"][0]["attributes"]["uuid"].update(int=3),
     "spec.devices[0].attributes[uuid]: expected exactly one of"),
    (lambda s: s["spec"]["devices"][0]["attributes"].update(brand={"int": "x"}),
     "spec.devices[0].attributes[brand].int: expected a int"),
], ids=["no-driver", "generation-text", "bad-quantity", "two-kinds", "wrong-kind"])
def test_a_slice_that_cannot_be_read_is_refused_naming_the_field(edit: Any, message: str) -> None:
    raw = copy.deepcopy(dra_slices.node_slices(NODE, dra_slices.gpus(1, node=NODE))[0])
    edit(raw)
    with pytest.raises(slices.SliceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        slices.parse(raw)


# ---- round trips -------------------------------------------------------------------------------
NAME = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
QUANTITY = st.one_of(st.integers(0, 10**12).map(str), st.integers(1, 4096).map(lambda n: f"{n}Mi"),
                     st.integers(1, 128).map(lambda n: f"{n}Gi"))
ATTRIBUTE = st.one_of(
    st.builds(slices.Attribute, kind=st.just("string"), value=st.text(max_size=20)),
    st.builds(slices.Attribute, kind=st.just("version"), value=st.from_regex(r"[0-9]{1,3}\.[0-9]{1,2}\.[0-9]",
                                                                               fullmatch=True)),
    st.builds(slices.Attribute, kind=st.just("int"), value=st.integers(-(2**40), 2**40)),
    st.builds(slices.Attribute, kind=st.just("bool"), value=st.booleans()),
)


def amounts() -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    return st.dictionaries(NAME, QUANTITY, max_size=4).map(lambda d: tuple(sorted(d.items())))


DEVICE = st.builds(
    slices.Device, name=NAME,
    attributes=st.dictionaries(st.one_of(NAME, NAME.map(lambda n: f"gpu.nvidia.com/{n}")), ATTRIBUTE,
                               max_size=5).map(lambda d: tuple(sorted(d.items()))),
    capacity=amounts(),
    consumes=st.lists(st.builds(slices.CounterUse, counter_set=NAME, counters=amounts()), max_size=2).map(tuple),
    multiple_allocations=st.booleans())
SLICE = st.builds(
    slices.Slice, name=NAME, driver=st.sampled_from(["gpu.nvidia.com", "gpu.example.com"]), pool=NAME,
    generation=st.integers(0, 10**6), slice_count=st.integers(1, 9), node=st.one_of(st.just(""), NAME),
    devices=st.lists(DEVICE, max_size=4).map(tuple),
    shared_counters=st.lists(st.builds(slices.CounterSet, name=NAME, counters=amounts()), max_size=2).map(tuple))


@settings(max_examples=100, deadline=None)
@given(SLICE)
def test_a_slice_renders_to_what_parses_back_to_it(found: slices.Slice) -> None:
    assert slices.parse(slices.render(found)) == found


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.booleans(), st.integers(1, 5))
def test_the_driver_s_slices_render_back_to_their_own_json(count: int, mig: bool, generation: int) -> None:
    """parse -> render is the identity on what the driver publishes (every key it writes is modelled)."""
    for raw in dra_slices.node_slices(NODE, dra_slices.gpus(count, node=NODE, mig=mig), generation=generation):
        assert slices.render(slices.parse(raw)) == raw


RESULT = st.builds(allocations.Allocated, request=NAME,
                   key=st.builds(allocations.DeviceKey, driver=st.just("gpu.nvidia.com"), pool=NAME, device=NAME),
                   admin_access=st.booleans(), share_id=st.one_of(st.just(""), st.uuids().map(str)),
                   consumed=st.dictionaries(NAME, QUANTITY, max_size=2).map(lambda d: tuple(sorted(d.items()))))
CLAIM = st.builds(allocations.Claim, namespace=NAME, name=NAME, uid=st.uuids().map(str),
                  results=st.lists(RESULT, max_size=3).map(tuple), allocated=st.booleans(),
                  reserved_for=st.lists(st.builds(allocations.Consumer, resource=st.just("pods"), name=NAME,
                                                  uid=st.uuids().map(str)), max_size=2).map(tuple))


@settings(max_examples=100, deadline=None)
@given(CLAIM)
def test_a_claim_renders_to_what_parses_back_to_it(claim: allocations.Claim) -> None:
    if not claim.allocated:  # no allocation, no results: that is what the API server stores
        claim = allocations.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid,
                             reserved_for=claim.reserved_for)
    assert allocations.parse(allocations.render(claim)) == claim


@settings(max_examples=100, deadline=None)
@given(CLAIM)
def test_a_claim_holds_devices_only_while_allocated_and_reserved(claim: allocations.Claim) -> None:
    held = claim.held()
    if not claim.allocated or not claim.reserved_for:
        assert held == ()
    else:
        assert held == tuple(r for r in claim.results if not r.admin_access)


def test_a_pod_whose_gpu_request_a_claim_serves_says_so() -> None:
    pod = {"status": {"extendedResourceClaimStatus": {
        "resourceClaimName": "p-extended-resources-abcde",
        "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu",
                             "requestName": "container-0-request-0"}]}}}
    assert allocations.dra_backed_resources(pod) == {"nvidia.com/gpu"}
    assert allocations.dra_backed_resources({"status": {"phase": "Running"}}) == frozenset()


# ---- the GPUInventory's draOffers ---------------------------------------------------------------
DRA_OFFER = st.builds(inventory.DraOffer, device_class=st.sampled_from(["gpu.nvidia.com", "mig.nvidia.com"]),
                      product=st.text(max_size=20), memory_mib=st.one_of(st.none(), st.integers(0, 10**6)),
                      devices=st.integers(0, 10**4), free=st.integers(0, 10**4), nodes=st.integers(0, 10**3))


@settings(max_examples=100, deadline=None)
@given(st.lists(DRA_OFFER, max_size=4))
def test_dra_offers_survive_the_inventory_document(found: list[inventory.DraOffer]) -> None:
    from datetime import UTC, datetime

    from webhook.placement import gpuinventory as published

    content = published.Content(offers=(), default_priority_class=None, dra_offers=tuple(found))
    text = published.serialize(published.document(content, generated_at=datetime(2026, 12, 3, tzinfo=UTC)))
    assert inventory.parse(text).dra_offers == tuple(found)


def test_a_bad_dra_offer_is_refused_naming_it() -> None:
    doc = {"apiVersion": inventory.API_VERSION, "kind": inventory.KIND,
           "draOffers": [{"deviceClass": "gpu.nvidia.com", "free": -1}]}
    with pytest.raises(inventory.InventoryError, match=r"draOffers\[0\]\.free: expected a whole number >= 0"):
        inventory.parse(json.dumps(doc))
