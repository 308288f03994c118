"""DRA asks as typed values: a ResourceClaim's requests parse into DeviceAsks and render back."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.kube import claims

CLASSES = ["gpu.nvidia.com", "mig.nvidia.com", "example.com-fpga"]
names_ = st.text(alphabet="abcdefghij", min_size=1, max_size=6)


@st.composite
def asks(draw: st.DrawFn, name: str, sub: bool) -> claims.DeviceAsk:
    mode = draw(st.sampled_from([claims.EXACT_COUNT, claims.ALL]))
    return claims.DeviceAsk(
        name=name, device_class=draw(st.sampled_from(CLASSES)), allocation_mode=mode,
        count=draw(st.integers(1, 8)) if mode == claims.EXACT_COUNT else 0,
        selectors=tuple(draw(st.lists(st.sampled_from(['device.attributes["gpu.nvidia.com"].type == "gpu"',
                                                        claims.memory_selector(40000)]), max_size=2, unique=True))),
        capacity=tuple(sorted(draw(st.dictionaries(st.sampled_from(["memory", "cores"]),
                                                   st.sampled_from(["10Gi", "1"]), max_size=2)).items())),
        admin_access=False if sub else draw(st.booleans()), sub_request=sub)


@st.composite
def requests(draw: st.DrawFn) -> claims.ClaimRequest:
    name = draw(names_)
    if draw(st.booleans()):
        return claims.ClaimRequest(name=name, exactly=draw(asks(name, sub=False)))
    subs = draw(st.lists(names_, min_size=1, max_size=3, unique=True))
    return claims.ClaimRequest(name=name, first_available=tuple(draw(asks(f"{name}/{s}", sub=True)) for s in subs))


def claim(*entries: dict[str, Any], kind: str = "ResourceClaim") -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": list(entries)}}
    if kind == claims.TEMPLATE_KIND:
        spec = {"spec": spec}
    return {"apiVersion": claims.API_VERSION, "kind": kind, "metadata": {"name": "c"}, "spec": spec}


@given(st.lists(requests(), max_size=3), st.sampled_from([claims.CLAIM_KIND, claims.TEMPLATE_KIND]))
def test_parse_and_render_round_trip(parsed: list[claims.ClaimRequest], kind: str) -> None:
    document = claim(*(claims.render_request(r) for r in parsed), kind=kind)
    assert claims.parse(document).requests == tuple(parsed)


def test_defaults_are_read_as_the_api_server_writes_them() -> None:
    ask = claims.parse(claim({"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}))
    assert ask.requests[0].exactly == claims.DeviceAsk(name="gpu", device_class="gpu.nvidia.com")
    assert ask.most_devices(frozenset(claims.NVIDIA_DEVICE_CLASSES)) == 1


def test_a_claim_holds_the_most_devices_any_alternative_takes_summed_over_its_requests() -> None:
    ask = claims.parse(claim(
        {"name": "a", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4},
                                         {"name": "small", "deviceClassName": "mig.nvidia.com", "count": 2}]},
        {"name": "b", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3}},
        {"name": "c", "exactly": {"deviceClassName": "example.com-fpga", "count": 9}}))
    assert ask.most_devices(frozenset(claims.NVIDIA_DEVICE_CLASSES)) == 7
    assert [a.name for a in ask.asks()] == ["a/big", "a/small", "b", "c"]


@pytest.mark.parametrize(("entry", "problem"), [
    ({"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": "two"}}, "count"),
    ({"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "Some"}}, "allocationMode"),
    ({"name": "a", "firstAvailable": {"name": "x"}}, "firstAvailable is not a list"),
    ({"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": "x"}]}}, "cel"),
])
def test_a_malformed_request_names_the_field(entry: dict[str, Any], problem: str) -> None:
    with pytest.raises(claims.ClaimError, match=problem):
        claims.parse(claim(entry))


def test_a_pods_claims_and_the_containers_that_use_them() -> None:
    pod = {"spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight"},
                                       {"name": "shared", "resourceClaimName": "team-gpu"}],
                    "containers": [{"name": "a", "resources": {"claims": [{"name": "gpus"}]}},
                                   {"name": "b", "resources": {"claims": [{"name": "gpus"}, {"name": "shared"}]}}]}}
    refs = claims.pod_claim_refs(pod)
    assert [(r.name, r.key, r.containers) for r in refs] == [
        ("gpus", ("ResourceClaimTemplate", "eight"), ("a", "b")),
        ("shared", ("ResourceClaim", "team-gpu"), ("b",))]
