"""The replay model against the real kube-scheduler on a fixed slice of the openb trace.

The slice (tests/e2e/trace_slice.py): 32 nodes sampled from openb_node_list_gpu_node.csv with seed
42, and 288 whole-GPU or CPU-only pods, 12 from each of the trace's 24 pod lists (the first ones
of each list's replay arrival order for seed 42, interleaved), so that what is shown holds on
every pod list, not only the default one: CPU-heavy lists, GPU-model constraints (gpuspec),
multi-GPU mixes. Its GPU request is ~122% of the slice's GPUs, so placement decides what fits.
It goes three times through the real API server, the real webhook with the starter policies/,
the real balancer and the real kube-scheduler v1.36.3, one pod at a time, and through `gpugate
replay`'s model (20 seeds) on the same nodes and pods in the same order, with labels following
each placement (lag 1); both for the gpugate arm and the stock arm (no webhook).

What is proven:

1. decision by decision, kube-scheduler v1.36.3 chooses a node the model scores best. Before each
   pod the model is put in the real cluster's state; the real choice must be among the model's
   best-scoring nodes for at least 97% of the pods in each arm, and for all but at most one pod of
   every pod list in each run; those best nodes are on average at most 30% of the feasible ones
   (~16% measured), so agreeing is not what any choice would get. This is what found the model's
   one difference: it scored NodeResourcesBalancedAllocation as kube-scheduler did before v1.36
   (the balance with the pod) and made only 84% (gpugate) and 75% (stock) of the real decisions;
   since v1.36 the plugin scores the change in balance the pod brings
   (pkg/scheduler/framework/plugins/noderesources/balanced_allocation.go,
   ``balancedResourceScorer``), as webhook/replay/kubescheduler.py now does;
2. the GPU allocation the real cluster reaches (the mean of its three runs) is within 2 points of
   the model's median, in each arm.

``python benchmarks/replay_vs_scheduler.py`` prints the same figures for any slice.

Shares, in both sharing worlds: a second slice, 32 nodes and 10 pods of each pod
list *with* the trace's shares (~40% of the pods), goes through the real scheduler once per world,
as ``gpugate replay --sharing`` models it (``trace_slice.world_fidelity``): in ``timeslice`` the
nodes the replay time-slices advertise only ``nvidia.com/gpu.shared`` (4 slots a GPU) and a share
asks a slot; in ``dra`` every GPU node publishes a consumable-capacity ResourceSlice, whole-GPU pods
keep ``nvidia.com/gpu`` (mapped onto DRA by the chart's DeviceClass) and a share names its
``gpu-share-<milli>`` template. Stock arm: what is compared is how shares are counted and fitted.
Must: >= 99% of real decisions among the model's best, allocation within 0.5 point, and in dra the
GPUs each claim was allocated (read back from the API) the ones the model's device rule picks.
Measured, after two model fixes (docs/placement.md, "Shares, in both sharing worlds"): the
DynamicResources score (without it 357/480 decisions, 74%), and a dra share's device rule, which
had fallen through to ``distributed`` (50 of 362 GPU pods on other GPUs, +2.07 points). A third
difference is kube-scheduler's, not the model's: v1.36.3 without an extender does not break ties
at random (``WORLD_RUNS``). Under a scheduler with one filter thread the real runs are one fixed
draw, and the model with that tie rule (``ties="list"``) makes every real decision: 240/240 pods
per run in both worlds, 364/364 devices in dra; allocation against the replay's random-tie median
+0.00 point in timeslice (58.92%) and +0.35 in dra (78.17% against 77.82%).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.e2e.local import require_local
from tests.e2e.trace_slice import TRACE, Report, SliceSpec, WorldReport, every_pod_file, fidelity, world_fidelity
from tests.prerequisites import needed
from webhook.localcluster.cluster import Cluster

PODS_PER_LIST = 12
REAL_RUNS = 3
"""Real runs per arm. Ties fall differently from run to run (with 16 filter threads their order varies,
``WORLD_RUNS`` says why), so one run is one draw: on this slice one
run's allocation has a standard deviation of ~0.7 point (gpugate) and ~1.0 (stock), measured over
200 model seeds, so one run against the model's median would miss 2 points in 2-5% of CI runs. The
mean of three against the median of 20 seeds misses it about once in 800 runs (stock), never in
practice for gpugate."""
MODEL_SEEDS = 20
BOUND = 2.0
"""Allowed |real - model| GPU allocation, in points of the slice's GPU capacity."""
LOCKSTEP = 97.0
"""Share of real decisions the model must make too, in %."""
CHANCE = 30.0
"""Most the model's best nodes may be of the feasible ones, on average, in % (measured: ~16%)."""
PER_LIST_MISSES = 1
"""Real decisions of one pod list the model may miss in a run (a label the scheduler had not yet seen)."""


@pytest.fixture(scope="module")
def report(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Report:
    require_local(cluster)
    needed(TRACE, "../shared beside the clone holds the trace")
    pod_files = every_pod_file()
    spec = SliceSpec(nodes=32, pods=PODS_PER_LIST * len(pod_files), seed=42, pod_files=pod_files,
                     model_seeds=MODEL_SEEDS)
    workdir = tmp_path_factory.mktemp("fidelity")
    found = fidelity(cluster, workdir, spec, repeats=REAL_RUNS, log=print)
    Path(workdir / "report.txt").write_text(found.text(examples=20))
    print(found.text())
    return found


def test_the_slice_covers_every_pod_list_and_asks_more_than_fits(report: Report) -> None:
    assert len(report.spec.pod_files) >= 20 and "openb_pod_list_default.csv" in report.spec.pod_files
    assert set(report.slice.sources) == set(report.spec.pod_files)
    assert report.slice.arrived_percent > 100, "the slice must ask for more GPUs than it has"
    for arm in report.arms.values():
        assert min(arm.real_failed) > 0, f"[{arm.arm}] nothing failed: placement decided nothing\n{report.text()}"


def test_every_real_decision_is_one_the_model_makes(report: Report) -> None:
    assert set(report.arms) == {"gpugate", "stock"}
    for arm in report.arms.values():
        steps = arm.lockstep
        assert steps.percent >= LOCKSTEP, (arm.arm, steps.percent, steps.disagreements[:10])
        assert steps.chance <= CHANCE, (arm.arm, steps.chance)  # agreement is not what any choice would get
        assert set(steps.by_source) == set(report.spec.pod_files)
        for source, (agreed, decisions) in steps.by_source.items():
            assert decisions - agreed <= PER_LIST_MISSES * REAL_RUNS, (arm.arm, source, agreed, decisions,
                                                                       steps.disagreements[:10])


def test_real_allocation_is_within_two_points_of_the_model(report: Report) -> None:
    for arm in report.arms.values():
        model = statistics.median(arm.model_allocs)
        assert abs(arm.real_alloc - model) <= BOUND, (arm.arm, arm.real_alloc, model, report.text())


WORLD_PODS_PER_LIST = 10
WORLD_RUNS = 2
"""Real runs per world: two, to show a run is one fixed draw. The slices go to their own kube-scheduler
with one filter thread (``trace_slice.FIDELITY_SCHEDULER``), because v1.36.3 without an extender does
not break ties at random: it sets no Randomizer and takes the heap's top of the filtered list
(tests/e2e/scheduler_ties.py; with its scores logged, 353 of 353 ties on the dra slice fell that
way, two-way ones 104:49 to the node earlier in the list). With the default 16 threads that list is
in the order they finish, so runs were different draws among the model's best nodes and separate runs
differed more than seeds (dra runs 77.09-78.17 over five runs; one CI run's two missed the
0.5-point bound at -0.64 with every decision agreeing). With one thread and the nodes created in the
slice's order, every run makes the same decisions, and the model with the heap's rule
(``ties="list"``) makes them too. Before a dra run the previous run's claims must be gone: they
outlive their pods by ~25 s and kube-scheduler counts their GPUs as taken (``clear_claims``; one CI
run without it put pods on other GPUs and ended 1.2 points low)."""
WORLD_LOCKSTEP = 99.0
WORLD_BOUND = 0.5


@pytest.fixture(scope="module", params=["timeslice", "dra"])
def world_report(request: pytest.FixtureRequest, cluster: Cluster) -> WorldReport:
    require_local(cluster, "the slice's nodes are fake nodes this process serves; an attached cluster has its own")
    needed(TRACE, "../shared beside the clone holds the trace")
    pod_files = every_pod_file()
    spec = SliceSpec(nodes=32, pods=WORLD_PODS_PER_LIST * len(pod_files), seed=42, pod_files=pod_files,
                     model_seeds=MODEL_SEEDS, sharing=request.param)
    found = world_fidelity(cluster, spec, repeats=WORLD_RUNS, log=print)
    print(found.text(examples=20))
    return found


def test_a_world_slice_holds_shares_and_fails_some_pods(world_report: WorldReport) -> None:
    shares = sum(1 for p in world_report.slice.pods if p.shares_gpu)
    assert shares >= len(world_report.slice.pods) // 4, shares
    assert min(world_report.real_failed) > 0, world_report.text()


def test_in_each_world_the_real_decisions_are_the_models(world_report: WorldReport) -> None:
    steps = world_report.lockstep
    assert steps.percent >= WORLD_LOCKSTEP, world_report.text(examples=20)
    assert steps.chance <= CHANCE, (steps.chance, world_report.text())


def test_in_the_dra_world_the_model_picks_the_devices_kube_scheduler_allocated(world_report: WorldReport) -> None:
    """The GPUs each claim got, read back from the API, against the model's device rule (first fit):
    this found that a dra share fell through to the device plugin's ``distributed`` rule."""
    steps = world_report.lockstep
    if world_report.world != "dra":
        assert steps.device_decisions == 0  # slots name no device to the scheduler
        return
    assert steps.device_decisions >= 100, world_report.text()
    agreed = steps.device_decisions - len(steps.device_differences)
    assert 100.0 * agreed / steps.device_decisions >= WORLD_LOCKSTEP, world_report.text(examples=20)


def test_in_each_world_allocation_is_within_half_a_point(world_report: WorldReport) -> None:
    """Against the median of the model as the replay runs it (ties at random, 20 seeds)."""
    assert abs(world_report.difference) <= WORLD_BOUND, world_report.text()


def test_with_v1_36_3s_tie_rule_the_model_makes_every_real_decision(world_report: WorldReport) -> None:
    """Node for node, in every run: the model with ``ties="list"`` against the real scheduler with one
    filter thread, so the real runs agree with each other and with the model's allocation."""
    pods = len(world_report.slice.pods)
    assert world_report.heap_matches == [pods] * WORLD_RUNS, world_report.text(examples=20)
    assert max(abs(real - world_report.heap_alloc) for real in world_report.real_allocs) < 0.01, world_report.text()
