"""The rebalancer's decision: the fewest movable pods, whole units, replacements elsewhere, the budget."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.kube.demand import PodDemand
from webhook.placement import freeing, moves
from webhook.placement.inputs import NodeView

GB = 2**30
EIGHT = PodDemand(cpu=8000, memory_bytes=64 * GB, gpus=8)
ONE = PodDemand(cpu=1000, memory_bytes=4 * GB, gpus=1)
SETTINGS = moves.Settings(threshold=60.0)


def node(name: str, pods: list[tuple[str, PodDemand]], *, gpus: int = 8, cpu: int = 64_000,
         product: str = "H100") -> NodeView:
    view = NodeView.empty(name, cpu=cpu, memory=512 * GB, product=product, gpus=gpus)
    for key, demand in pods:
        view = view.bind(key, demand)
    return view


def spread(count: int, per_node: int, *, prefix: str = "ns/be") -> list[NodeView]:
    """``count`` 8-GPU nodes, each with ``per_node`` single-GPU pods: GPUs free everywhere, 8 nowhere."""
    return [node(f"n{i}", [(f"{prefix}-{i}-{j}", ONE) for j in range(per_node)]) for i in range(count)]


def movable(views: list[NodeView], *, unit=lambda key: key, namespace: str = "ns", ok=lambda key: True):
    return [moves.Candidate(key=b.key, namespace=namespace, unit=unit(b.key), movable=ok(b.key))
            for v in views for b in v.pods]


def wanting(demand: PodDemand = EIGHT, since: float = 0.0) -> moves.Waiting:
    return moves.Waiting(key="ml/big", demand=demand, since=since)


class TestPlan:
    def test_the_fewest_pods_are_evicted_and_their_replacements_fit_elsewhere(self) -> None:
        views = spread(4, 2) + [node("n4", [("ns/be-4-0", ONE)])]
        found = moves.plan(views, movable(views), [wanting()], now=100.0, settings=SETTINGS,
                           budget=moves.Budget(cluster=10))
        assert len(found.moves) == 1
        move = found.moves[0]
        assert move.evict == ("ns/be-4-0",) and move.node == "n4"
        assert move.left == ("n4",)
        assert all(home != "n4" for _, home in move.replacements)

    def test_nothing_moves_for_a_pod_that_has_not_waited_the_threshold(self) -> None:
        views = spread(4, 1)
        found = moves.plan(views, movable(views), [wanting(since=50.0)], now=100.0, settings=SETTINGS,
                           budget=moves.Budget(cluster=10))
        assert not found.moves and found.skipped[0].reason == moves.WAITING

    def test_a_pod_that_fits_already_moves_nothing(self) -> None:
        views = spread(3, 1) + [node("free", [])]
        found = moves.plan(views, movable(views), [wanting()], now=100.0, settings=SETTINGS,
                           budget=moves.Budget(cluster=10))
        assert not found.moves and found.skipped[0].reason == moves.FITS

    def test_unmarked_pods_are_never_evicted(self) -> None:
        views = spread(4, 1)
        found = moves.plan(views, movable(views, ok=lambda key: False), [wanting()], now=100.0, settings=SETTINGS,
                           budget=moves.Budget(cluster=10))
        assert not found.moves and found.skipped[0].reason == moves.NO_ROOM

    def test_a_group_moves_whole_or_not_at_all(self) -> None:
        # n0 holds one member of a two-pod group whose other member is on n1: freeing n0 evicts both.
        views = [node("n0", [("ns/g-a", ONE)]), node("n1", [("ns/g-b", ONE), ("ns/solo", ONE)]), node("n2", [])]
        views[2] = node("n2", [(f"ns/fill-{i}", ONE) for i in range(4)])
        group = {"ns/g-a": "g", "ns/g-b": "g"}
        candidates = movable(views, unit=lambda key: group.get(key, key),
                             ok=lambda key: not key.startswith("ns/fill"))
        found = moves.plan(views, candidates, [wanting()], now=100.0, settings=SETTINGS,
                           budget=moves.Budget(cluster=10))
        assert found.moves[0].evict == ("ns/g-a", "ns/g-b")
        assert set(found.moves[0].left) == {"n0", "n1"}
        assert all(home == "n2" for _, home in found.moves[0].replacements)

    def test_a_group_with_one_unmovable_member_never_moves(self) -> None:
        views = [node("n0", [("ns/g-a", ONE)]), node("n1", [("ns/g-b", ONE)]), node("n2", [("ns/x", ONE)] * 1)]
        group = {"ns/g-a": "g", "ns/g-b": "g"}
        candidates = movable(views, unit=lambda key: group.get(key, key), ok=lambda key: key != "ns/g-b")
        found = moves.plan(views[:2], candidates[:2], [wanting()], now=100.0, settings=SETTINGS,
                           budget=moves.Budget(cluster=10))
        assert not found.moves

    def test_the_budget_caps_the_evictions_of_a_round(self) -> None:
        views = spread(4, 2)
        found = moves.plan(views, movable(views), [wanting(), moves.Waiting("ml/big2", EIGHT, 0.0)], now=100.0,
                           settings=SETTINGS, budget=moves.Budget(cluster=3))
        assert sum(len(m.evict) for m in found.moves) <= 3
        assert [s.reason for s in found.skipped] == [moves.BUDGET]

    def test_a_namespace_budget_of_zero_protects_its_pods(self) -> None:
        views = spread(4, 1)
        found = moves.plan(views, movable(views), [wanting()], now=100.0, settings=SETTINGS,
                           budget=moves.Budget(cluster=10, namespaces=(("ns", 0),)))
        assert not found.moves

    def test_a_disruption_budget_caps_how_many_of_its_pods_one_plan_evicts(self) -> None:
        # Freeing any node evicts two pods a budget guards; it allows one, then none.
        views = spread(3, 2)
        guarded = [moves.Candidate(key=b.key, namespace="ns", unit=b.key, movable=True, disruption_budgets=("ns/pdb",))
                   for v in views for b in v.pods]
        for allowed, moved in ((1, 0), (2, 2)):
            found = moves.plan(views, guarded, [wanting()], now=100.0, settings=SETTINGS,
                               budget=moves.Budget(cluster=10, disruptions=(("ns/pdb", allowed),)))
            assert sum(len(m.evict) for m in found.moves) == moved

    def test_no_move_when_the_replacements_fit_nowhere_but_where_they_were(self) -> None:
        # Two nodes, one pod each: freeing either leaves the evicted pod only the node it left.
        views = [node("n0", [(f"ns/f-{i}", ONE) for i in range(7)] + [("ns/a", ONE)]), node("n1", [("ns/b", ONE)])]
        candidates = movable(views, ok=lambda key: key == "ns/b")
        found = moves.plan(views, candidates, [wanting()], now=100.0, settings=SETTINGS,
                           budget=moves.Budget(cluster=10))
        assert not found.moves and found.skipped[0].reason == moves.NO_REPLACEMENT

    def test_two_waiting_pods_never_plan_for_the_same_room(self) -> None:
        views = spread(2, 1) + [node("spare", [(f"ns/x-{i}", ONE) for i in range(6)])]
        candidates = movable(views, ok=lambda key: not key.startswith("ns/x"))
        found = moves.plan(views, candidates, [wanting(), moves.Waiting("ml/big2", EIGHT, 1.0)], now=100.0,
                           settings=SETTINGS, budget=moves.Budget(cluster=10))
        assert len(found.moves) == 2
        assert found.moves[0].node != found.moves[1].node
        homes = [home for m in found.moves for _, home in m.replacements]
        assert homes == ["spare", "spare"]

    def test_a_share_needs_room_on_one_gpu(self) -> None:
        quarter = PodDemand(cpu=500, memory_bytes=GB, share_milli=250)
        half = PodDemand(cpu=500, memory_bytes=GB, share_milli=500)
        views = [node("n0", [("ns/q1", quarter), ("ns/q2", quarter), ("ns/q3", quarter), ("ns/q4", quarter)],
                      gpus=1),
                 node("n1", [("ns/h", half), ("ns/q5", quarter)], gpus=1),
                 node("n2", [("ns/h2", half)], gpus=1)]
        want = moves.Waiting("ml/share", PodDemand(cpu=500, memory_bytes=GB, share_milli=750), 0.0)
        candidates = movable(views, ok=lambda key: key != "ns/h2")
        found = moves.plan(views, candidates, [want], now=100.0, settings=SETTINGS, budget=moves.Budget(cluster=10))
        assert found.moves[0].evict in (("ns/q5",), ("ns/h",))
        assert found.moves[0].node == "n1"


# --- the fewest pods: against every subset, on nodes whose pods each hold one GPU ----------------
pod_sizes = st.sampled_from([250, 500, 1000])


@st.composite
def one_node(draw):
    gpus = draw(st.integers(1, 4))
    pods = []
    for gpu in range(gpus):
        taken = 0
        for size in draw(st.lists(pod_sizes, max_size=3)):
            if taken + size <= 1000:
                pods.append((f"ns/p{gpu}-{len(pods)}", size, draw(st.booleans())))
                taken += size
    want = draw(st.sampled_from([PodDemand(gpus=1), PodDemand(gpus=2), PodDemand(share_milli=500),
                                 PodDemand(share_milli=750)]))
    return gpus, pods, want


def _view(gpus: int, pods: list[tuple[str, int, bool]]) -> NodeView:
    view = NodeView.empty("n", cpu=10**6, memory=10**12, gpus=gpus)
    for key, size, _ in pods:
        view = view.bind(key, PodDemand(gpus=1) if size == 1000 else PodDemand(share_milli=size), "packed")
    return view


@settings(max_examples=300, deadline=None)
@given(one_node())
def test_cheapest_evicts_the_fewest_pods_any_subset_would(case) -> None:
    gpus, pods, want = case
    view = _view(gpus, pods)
    may_go = {key: key for key, _, ok in pods if ok}
    found = freeing.cheapest(view, want, may_go, dict.fromkeys(may_go, 1), "packed")
    best = None
    for size in range(len(may_go) + 1):
        for subset in itertools.combinations(sorted(may_go), size):
            after = view
            for key in subset:
                after = after.release(key)
            if freeing.fits(after, want, "packed"):
                best = size
                break
        if best is not None:
            break
    if best is None:
        assert found is None
    else:
        assert found is not None and len(found) == best
        after = view
        for key in found:
            after = after.release(key)
        assert freeing.fits(after, want, "packed")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.integers(0, 2)), min_size=1, max_size=14),
       st.integers(0, 6))
def test_a_plan_never_breaks_its_rules(pods, budget) -> None:
    """Whatever the cluster: only movable pods, whole units, within budget, the waiting pod fits where
    the evictions make room, and every replacement fits a node no evicted pod left."""
    views = [node(f"n{i}", [], gpus=4) for i in range(4)]
    flags, units = {}, {}
    for number, (where, ok, unit) in enumerate(pods):
        key = f"ns/p{number}"
        if freeing.fits(views[where], ONE):
            views[where] = views[where].bind(key, ONE)
            flags[key], units[key] = ok, f"u{unit}" if unit else key
    candidates = [moves.Candidate(key=k, namespace="ns", unit=units[k], movable=flags[k]) for k in flags]
    want = moves.Waiting("ml/w", PodDemand(gpus=4), 0.0)
    found = moves.plan(views, candidates, [want], now=100.0, settings=SETTINGS, budget=moves.Budget(cluster=budget))
    evicted = [key for m in found.moves for key in m.evict]
    assert len(evicted) <= budget
    assert all(flags[key] for key in evicted)
    for unit in {units[key] for key in evicted}:
        assert {k for k in units if units[k] == unit} <= set(evicted)
    for move in found.moves:
        after = {v.name: v for v in views}
        where = {b.key: v.name for v in views for b in v.pods}
        for key in move.evict:
            after[where[key]] = after[where[key]].release(key)
        assert freeing.fits(after[move.node], want.demand)
        assert all(home not in move.left for _, home in move.replacements)
