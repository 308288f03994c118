"""The GPUInventory format has one home, ``webhook.kube.inventory``: what ``build`` writes (the
balancer's publisher, through ``placement.gpuinventory``), ``parse`` reads back unchanged (the
webhook's mounted file, the offline commands' ``--inventory``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.kube import inventory
from webhook.kube.inventory import DraOffer, Inventory, Offer
from webhook.placement import gpuinventory

counts = st.integers(min_value=0, max_value=10_000)
text = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-./", min_size=1, max_size=20)
offers = st.builds(Offer, resource=text, product=st.text(max_size=20), memory_mib=st.none() | counts,
                   allocatable=counts, free=counts, nodes=counts)
dra_offers = st.builds(DraOffer, device_class=text, product=st.text(max_size=20), memory_mib=st.none() | counts,
                       devices=counts, free=counts, nodes=counts)
stamps = st.none() | st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000, tzinfo=UTC))
inventories = st.builds(
    Inventory, default_priority_class=st.none() | text, generated_at=stamps,
    offers=st.lists(offers, max_size=4).map(tuple), dra_offers=st.lists(dra_offers, max_size=4).map(tuple),
    type_pressure=st.dictionaries(text, st.floats(min_value=0, max_value=100), max_size=3).map(
        lambda d: tuple(sorted(d.items()))))


@settings(max_examples=60, deadline=None)
@given(inventories)
def test_what_build_writes_parse_reads_back(found: Inventory) -> None:
    assert inventory.parse(inventory.serialize(inventory.build(found))) == found


def test_the_published_document_is_the_format_modules_and_reads_back() -> None:
    content = gpuinventory.Content(offers=(Offer(resource="nvidia.com/gpu", product="H100", memory_mib=81559,
                                                 allocatable=8, free=3, nodes=1),),
                                   default_priority_class="normal", type_pressure=(("H100", 0.5),))
    when = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)
    doc = gpuinventory.document(content, generated_at=when)
    assert doc == inventory.build(Inventory(default_priority_class="normal", generated_at=when,
                                            offers=content.offers, type_pressure=content.type_pressure))
    assert json.loads(gpuinventory.serialize(doc))["generatedAt"] == "2026-03-01T12:00:00.123Z"
    assert inventory.parse(gpuinventory.serialize(doc)).offers == content.offers
