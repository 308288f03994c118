"""The extender's 0..10 scores: bounded, deterministic, monotone in FGD's order, and packing on ties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.kube.demand import PodDemand
from webhook.placement import scoring
from webhook.placement.fragment import NO_FIT, Fragmenter
from webhook.placement.inputs import NodeView
from webhook.placement.shapes import Shape, ShapeMix

# Half the pods take a 0.5 share, a quarter one whole GPU, a quarter are CPU-only.
MIX = ShapeMix((Shape(2000, 500, 1), Shape(4000, 1000, 1), Shape(1000)), (0.5, 0.25, 0.25))


def node(name: str, left: tuple[int, ...], cpu_left: int = 32_000, cpu: int = 64_000) -> NodeView:
    return NodeView(name=name, cpu=cpu, memory=2**40, product="X", gpus=len(left), cpu_requested=cpu - cpu_left,
                    left=left)


def test_a_node_where_the_share_fills_a_fragment_scores_above_one_where_it_creates_one() -> None:
    share = PodDemand(cpu=2000, share_milli=500)
    fills = node("fills", (500, 0, 0, 0))      # its half GPU is useless to whole-GPU pods now
    creates = node("creates", (1000, 1000, 1000, 1000))
    scores = scoring.prioritize(share, [fills, creates], Fragmenter(MIX))
    assert scores[0] > scores[1]


def test_a_whole_gpu_pod_keeps_an_empty_node_whole_when_a_started_one_fits() -> None:
    """The 8-GPU shape keeps its node; the tie between started nodes goes to the fuller one (best fit)."""
    mix = ShapeMix((Shape(4000, 1000, 1), Shape(8000, 1000, 8)), (0.9, 0.1))
    pod = PodDemand(cpu=4000, gpus=1)
    empty = node("empty", (1000,) * 8)
    started = node("started", (1000,) * 4 + (0,) * 4)
    fuller = node("fuller", (1000,) * 2 + (0,) * 6)
    scores = scoring.prioritize(pod, [empty, started, fuller], Fragmenter(mix))
    assert scores[2] > scores[1] > scores[0]
    assert scores[2] == scoring.MAX_EXTENDER_PRIORITY


nodes_strategy = st.lists(
    st.tuples(st.lists(st.sampled_from([0, 250, 500, 750, 1000]), min_size=1, max_size=8),
              st.integers(0, 64_000)), min_size=1, max_size=30)
pods_strategy = st.sampled_from([PodDemand(cpu=2000, share_milli=500), PodDemand(cpu=4000, gpus=1), PodDemand(cpu=1000),
                                 PodDemand(cpu=16_000, gpus=2), PodDemand(cpu=500, share_milli=250)])


@settings(max_examples=60)
@given(nodes_strategy, pods_strategy)
def test_scores_are_bounded_deterministic_and_monotone_in_the_key(raw, pod) -> None:
    views = [node(f"n{i}", tuple(left), cpu_left) for i, (left, cpu_left) in enumerate(raw)]
    fragmenter = Fragmenter(MIX)
    scores = scoring.prioritize(pod, views, fragmenter)
    assert all(0 <= s <= scoring.MAX_EXTENDER_PRIORITY for s in scores)
    assert scores == scoring.prioritize(pod, views, Fragmenter(MIX))          # same inputs, same scores
    keys = scoring.node_keys(fragmenter, pod, views)
    for a, b in zip(keys, scores, strict=True):
        for c, d in zip(keys, scores, strict=True):
            if a > c:
                assert b >= d                                                # monotone in the key
            if a == c:
                assert b == d
    fitting = [k for k in keys if k != NO_FIT]
    if fitting:                                                              # the best fitting node gets 10
        assert scores[keys.index(max(fitting))] == scoring.MAX_EXTENDER_PRIORITY
    assert all(s == 0 for k, s in zip(keys, scores, strict=True) if k == NO_FIT)


def test_the_rank_keeps_the_argmax_where_a_linear_rescaling_lumps_it() -> None:
    keys = [5_000_000, 4_999_999, 10, 0]
    assert scoring.levels(keys) == [10, 9, 8, 7]
    assert scoring.levels(keys, "linear") == [10, 10, 0, 0]
    assert scoring.levels([NO_FIT, 3, 3]) == [0, 10, 10]
    assert scoring.levels(list(range(20)))[:9] == [0] * 9 and scoring.levels(list(range(20)))[-1] == 10


def test_a_weight_of_25_lets_one_level_outweigh_the_default_resource_scorers() -> None:
    """kube-scheduler adds score x weight x 100/10: one level is 250 points, more than the 200 that
    NodeResourcesFit (LeastAllocated) and BalancedAllocation can add together, less than a 300-point taint."""
    step = scoring.RECOMMENDED_WEIGHT * scoring.MAX_NODE_SCORE // scoring.MAX_EXTENDER_PRIORITY
    assert 200 < step < 300


def test_mig_pods_pack_on_slices_and_never_go_where_they_do_not_fit() -> None:
    mig = (("nvidia.com/mig-1g.10gb", 7),)
    full = NodeView(name="a", cpu=8000, mig=mig, mig_requested=(("nvidia.com/mig-1g.10gb", 7),))
    busy = NodeView(name="b", cpu=8000, mig=mig, mig_requested=(("nvidia.com/mig-1g.10gb", 5),))
    idle = NodeView(name="c", cpu=8000, mig=mig)
    pod = PodDemand(cpu=1000, extended=(("nvidia.com/mig-1g.10gb", 1),))
    assert scoring.prioritize(pod, [full, busy, idle], Fragmenter(MIX)) == [0, 10, 9]


def test_a_gpu_pod_leaves_the_product_that_constrained_pods_need_even_when_fgd_prefers_it() -> None:
    """Type pressure comes before FGD's score for GPU pods: FGD counts a node few shapes may use as
    fragment already, so it would fill the scarce product first (docs/placement.md, gpuspec lists)."""
    mix = ShapeMix((Shape(4000, 1000, 1), Shape(4000, 1000, 1, ("G2",)), Shape(4000, 1000, 1, ("G3",))),
                   (0.5, 0.3, 0.2))
    scarce = NodeView.empty("g3", cpu=64_000, memory=2**40, product="G3", gpus=2)
    plenty = [NodeView.empty(f"g2-{i}", cpu=64_000, memory=2**40, product="G2", gpus=8) for i in range(4)]
    fragmenter = Fragmenter(mix)
    pod = PodDemand(cpu=4000, gpus=1)
    where = scoring.context([scarce, *plenty], mix)
    assert where.pressure["G3"] > where.pressure["G2"]
    fgd = [fragmenter.points(n.product, n.signature, n.cpu_left, pod.cpu, pod.gpus, 0) for n in (scarce, plenty[0])]
    assert fgd[0] > fgd[1]                                     # FGD alone would take the G3
    assert scoring.prioritize(pod, [scarce, plenty[0]], fragmenter, where=where) == [9, 10]
    # Without constrained shapes there is no pressure and FGD's order stands.
    plain = ShapeMix((Shape(4000, 1000, 1),), (1.0,))
    assert scoring.context([scarce, *plenty], plain).pressure == {}


def test_a_cpu_pod_takes_the_cpu_of_the_product_gpu_pods_are_steered_away_from() -> None:
    """Among equal FGD scores a CPU pod prefers the product with the most type pressure: GPU pods
    leave it to the constrained pods, which take few of its cores; without constraints, best fit."""
    mix = ShapeMix((Shape(4000, 1000, 1), Shape(4000, 1000, 1, ("T4",)), Shape(4000)), (0.4, 0.3, 0.3))
    t4 = NodeView.empty("t4", cpu=104_000, memory=2**40, product="T4", gpus=2)
    g2 = NodeView.empty("g2", cpu=96_000, memory=2**40, product="G2", gpus=8)
    g2_fuller = NodeView(name="g2-fuller", cpu=96_000, memory=2**40, product="G2", gpus=8, cpu_requested=8000,
                         left=(1000,) + (0,) * 7)
    nodes = [t4, g2, g2_fuller]
    fragmenter = Fragmenter(mix)
    pod = PodDemand(cpu=4000)
    where = scoring.context(nodes, mix)
    assert where.pressure["T4"] > where.pressure.get("G2", 0)
    assert len({fragmenter.points(n.product, n.signature, n.cpu_left, pod.cpu, 0, 0) for n in nodes}) == 1
    assert scoring.prioritize(pod, nodes, fragmenter, where=where) == [10, 8, 9]
    plain = ShapeMix((Shape(4000, 1000, 1), Shape(4000)), (0.7, 0.3))
    assert scoring.prioritize(pod, nodes, Fragmenter(plain), where=scoring.context(nodes, plain)) == [9, 8, 10]


def sliced(name: str, cpu: int, product: str = "X", serves: str = "shares", cpu_left: int | None = None) -> NodeView:
    """A time-sliced node: two GPUs of four slots, taking shares only (``serves``)."""
    left = cpu if cpu_left is None else cpu_left
    return NodeView(name=name, cpu=cpu, memory=2**40, product=product, gpus=2, cpu_requested=cpu - left,
                    left=(1000, 1000), serves=serves)  # type: ignore[arg-type]


def test_on_share_only_nodes_a_share_goes_where_its_cpu_matches_what_the_node_has_per_slot() -> None:
    """Shares of 3 and 11 cores (7 on average) on two time-sliced nodes, one with 3 cores per slot,
    one with 13 (openb's G2 and T4 nodes). Best fit alone sends both to the poorer node, where the
    large one leaves slots no cpu can serve; counting those sends it to the richer node, and the
    small one still to the poorer, so neither node's slots nor its cpu are left over. On nodes that
    take either kind (DRA devices), best fit decides as before."""
    mix = ShapeMix((Shape(3000, 250, 1), Shape(11_000, 250, 1)), (0.5, 0.5))
    small, large = PodDemand(cpu=3000, share_milli=250), PodDemand(cpu=11_000, share_milli=250)
    for serves, large_goes in (("shares", "rich"), ("any", "poor")):
        nodes = [sliced("poor", 24_000, serves=serves), sliced("rich", 104_000, serves=serves)]
        fragmenter = Fragmenter(mix, "packed")
        best = {pod.cpu: nodes[max((0, 1), key=scoring.prioritize(pod, nodes, fragmenter).__getitem__)].name
                for pod in (small, large)}
        assert best == {3000: "poor", 11_000: large_goes}, serves


def test_a_share_only_node_carries_no_type_pressure() -> None:
    """Type pressure keeps unconstrained GPU pods off the product pinned whole-GPU pods need; a
    time-sliced node takes none of those, has slots to spare and runs out of cpu first. So an
    unpinned share is scored there by FGD and best fit alone (here the fuller T4 node), where on
    nodes that take either kind the pressure still sends it to the other product."""
    mix = ShapeMix((Shape(4000, 250, 1), Shape(4000, 1000, 1, ("T4",)), Shape(4000, 1000, 1)), (0.4, 0.4, 0.2))
    share = PodDemand(cpu=4000, share_milli=250)
    for serves, goes in (("shares", "t4"), ("any", "g2")):
        nodes = [sliced("t4", 64_000, "T4", serves, cpu_left=40_000), sliced("g2", 64_000, "G2", serves)]
        where = scoring.context(nodes, mix)
        assert where.pressure["T4"] > where.pressure.get("G2", 0)
        scores = scoring.prioritize(share, nodes, Fragmenter(mix, "packed"), where=where)
        assert nodes[scores.index(max(scores))].name == goes, serves
