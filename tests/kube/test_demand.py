"""What a pod demands, one value for every product: read, render, and every consumer's share.

The admission core, the balancer, the extender and the replay used to read a pod each into a shape
of its own (PodDemand, Demand/PodView, PodUsage, Ask). They read ``kube.demand.PodDemand`` now;
these properties hold the reading and the consumers to it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook import names
from webhook.balancer import state
from webhook.kube import claims, demand, gpunode, units
from webhook.kube.claims import PodClaimRef
from webhook.kube.demand import PodDemand
from webhook.placement import marks
from webhook.placement.inputs import NodeView
from webhook.replay import demand as replay_demand
from webhook.replay import sizing
from webhook.replay.cluster import ClusterState, best_fit_gpu
from webhook.replay.records import NodeRecord
from webhook.replay.workload import GPU_MILLI_ANNOTATION

MIG_RESOURCES = ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-7g.80gb",
                 "nvidia.com/mig-2g.20gb.shared")
DNS = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)


@st.composite
def refs(draw: st.DrawFn) -> tuple[PodClaimRef, ...]:
    names_ = draw(st.lists(DNS, unique=True, max_size=3))
    out = []
    for name in names_:
        target = draw(DNS)
        template = draw(st.booleans())
        out.append(PodClaimRef(name=name, claim_name=None if template else target,
                               template_name=target if template else None, containers=("main",)))
    return tuple(out)


@st.composite
def demands(draw: st.DrawFn, *, slot_milli: int = demand.DEFAULT_SLOT_MILLI) -> PodDemand:
    """A demand as a pod author can write it (the scoring fields and the share follow from the rest)."""
    cpu = draw(st.integers(0, 64_000))
    memory = draw(st.integers(0, 2**40))
    slots = draw(st.integers(0, 4))
    extended = draw(st.dictionaries(st.sampled_from(MIG_RESOURCES), st.integers(1, 7), max_size=2))
    size = draw(st.none() | st.builds(demand.Size, st.none() | st.integers(1, 2**37),
                                      st.none() | st.sampled_from([0.1, 0.25, 0.5, 1.0])))
    if size is not None and size.memory_bytes is None and size.fraction is None:
        size = None
    backed = draw(st.sets(st.sampled_from([names.GPU_RESOURCE, names.SHARED_GPU_RESOURCE]), max_size=1))
    return PodDemand(cpu=cpu, memory_bytes=memory, cpu_score=cpu or demand.DEFAULT_CPU_MILLI,
                     memory_score_bytes=memory or demand.DEFAULT_MEMORY_BYTES, gpus=draw(st.integers(0, 8)),
                     slots=slots, share_milli=min(units.MILLI, slots * slot_milli),
                     extended=tuple(sorted(extended.items())),
                     products=frozenset(draw(st.sets(st.sampled_from(["NVIDIA-A100-SXM4-80GB", "Tesla-T4"]),
                                                     max_size=2))),
                     claims=draw(refs()), dra_backed=frozenset(backed), size=size)


@settings(max_examples=200, deadline=None)
@given(demands())
def test_render_then_read_gives_the_demand_back(found: PodDemand) -> None:
    assert demand.of_pod(demand.render(found)) == found


@settings(max_examples=100, deadline=None)
@given(demands())
def test_the_partial_readers_agree_with_the_whole_reading(found: PodDemand) -> None:
    pod = demand.render(found)
    assert tuple(sorted(demand.gpu_requests(pod).items())) == found.gpu_counts()
    assert demand.claim_refs(pod) == found.claims
    assert demand.size_of(pod) == found.size


@settings(max_examples=100, deadline=None)
@given(demands())
def test_a_device_plugin_holds_what_no_claim_serves(found: PodDemand) -> None:
    held = dict(found.device_plugin_counts())
    assert not held.keys() & found.dra_backed
    assert held.keys() | (dict(found.gpu_counts()).keys() & found.dra_backed) == dict(found.gpu_counts()).keys()
    plain = found.without_dra_backed()
    assert plain.gpu_counts() == found.device_plugin_counts() or (plain.slots == 0 and not plain.share_milli)


def test_the_trace_form_reads_as_whole_gpus_or_one_share() -> None:
    assert PodDemand.of_gpus(2, 1000).gpus == 2
    share = PodDemand.of_gpus(1, 460)
    assert (share.num_gpu, share.milli_per_gpu, share.gpu_request_milli, share.shares_gpu) == (1, 460, 460, True)
    assert PodDemand.of_gpus(0, 0).num_gpu == 0
    with pytest.raises(ValueError, match="only one GPU can be shared"):
        PodDemand.of_gpus(2, 500)


def test_a_bad_quantity_is_named_and_a_bad_size_label_is_left_to_size_of() -> None:
    pod = demand.render(PodDemand(gpus=1))
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1.5"
    with pytest.raises(demand.QuantityError, match="nvidia.com/gpu"):
        demand.of_pod(pod)
    labelled = demand.render(PodDemand(gpus=1))
    labelled["metadata"]["labels"] = {names.GPU_MEMORY_LABEL: "lots"}
    assert demand.of_pod(labelled).size is None
    with pytest.raises(demand.SizeError, match="not a quantity"):
        demand.size_of(labelled)


def test_claim_asks_pair_the_references_with_what_was_read() -> None:
    found = PodDemand(claims=(PodClaimRef(name="a", template_name="t"), PodClaimRef(name="b", claim_name="c"),
                              PodClaimRef(name="x", claim_name="unread")))
    gpu = claims.parse({"apiVersion": claims.API_VERSION, "kind": claims.TEMPLATE_KIND, "metadata": {"name": "t"},
                        "spec": {"spec": {"devices": {"requests": [
                            {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}})
    nic = claims.parse({"apiVersion": claims.API_VERSION, "kind": claims.CLAIM_KIND, "metadata": {"name": "c"},
                        "spec": {"devices": {"requests": [
                            {"name": "n", "exactly": {"deviceClassName": "nic.example.com"}}]}}})
    resolved = {(claims.TEMPLATE_KIND, "t"): gpu, (claims.CLAIM_KIND, "c"): nic}
    classes = frozenset(claims.NVIDIA_DEVICE_CLASSES)
    assert [ref.name for ref, _ in found.claim_asks(resolved, classes)] == ["a"]
    assert found.claim_devices(resolved, classes) == 2


# --- every consumer agrees on a unit's share ------------------------------------------------------

def _balancer_milli(pod: dict[str, Any], replicas: int, gpus: int) -> int:
    """The balancer's share of the pod, in thousandths: its device-plugin counts weighed per unit."""
    node = {"metadata": {"name": "n", "labels": {names.NVIDIA_REPLICAS_LABEL: str(replicas)}},
            "status": {"allocatable": {names.GPU_RESOURCE: str(gpus),
                                       names.SHARED_GPU_RESOURCE: str(gpus * replicas),
                                       **{r: "7" for r in MIG_RESOURCES}}}}
    info = gpunode.node_info(node)
    usage = state.pod_usage({**pod, "spec": {**pod["spec"], "nodeName": "n"}, "status": {"phase": "Running"}})
    assert usage is not None
    return sum(round(units.MILLI * marks.gpu_weight(info, resource)) * count for resource, count in usage.requests)


def _replay_milli(pod: dict[str, Any], gpus: int, slot: int) -> int:
    """The replay's thousandths: the model binds the pod on an empty node and counts what it took."""
    annotated = {**pod, "metadata": {**pod["metadata"], "annotations": {GPU_MILLI_ANNOTATION: str(slot)}}}
    view = replay_demand.view(annotated)
    cluster = ClusterState((NodeRecord(name="n", cpu_milli=10**6, memory_mib=10**7, gpus=gpus, model="A100"),),
                           extended={r: [100] for r in MIG_RESOURCES})
    d = view.demand
    chosen = (best_fit_gpu(cluster, 0, d.milli_per_gpu),) if d.shares_gpu else cluster.first_free(0, d.num_gpu)
    cluster.bind(0, d, chosen if d.num_gpu else ())
    mig = sum(units.share_milli(r, n) for r, n in d.extended)
    return cluster.used_milli + mig


def _placement_milli(found: PodDemand, gpus: int) -> int:
    node = NodeView.empty("n", cpu=10**6, gpus=gpus)
    return node.gpu_free - node.bind("p", found).gpu_free + sum(units.share_milli(r, n) for r, n in found.extended)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.data())
def test_every_consumer_agrees_on_a_units_share(replicas: int, data: st.DataObject) -> None:
    """One pod, four readers: the vocabulary, the balancer's weights, the extender's device model and
    the replay's cluster all count the same thousandths of physical GPUs for it (node: 8 GPUs,
    ``replicas`` slots each, MIG slices of every profile)."""
    slot = units.slot_milli(replicas)
    found = data.draw(demands(slot_milli=slot))
    found = replace(found, dra_backed=frozenset(), claims=())
    if found.gpus and found.slots:
        found = replace(found, slots=0, share_milli=0)  # one kind per pod, as the device model places
    found = replace(found, slots=min(found.slots, replicas), share_milli=min(found.slots, replicas) * slot)
    pod = demand.render(found)
    read = demand.of_pod(pod, slot_milli=slot)
    expected = read.gpu_request_milli + sum(units.share_milli(r, n) for r, n in read.extended)
    assert expected == sum(units.share_milli(r, n, replicas=replicas) for r, n in read.gpu_counts())
    if read.gpus or read.slots or read.extended:
        assert _balancer_milli(pod, replicas, 8) == expected
    assert _placement_milli(read, 8) == expected
    assert _replay_milli(pod, 8, slot) == expected
    assert sizing.taken_milli(read, replicas) + (read.share_milli if read.shares_gpu else 0) == expected
