"""The replay model against the real kube-scheduler on a fixed slice of the openb trace (issue 11, item 6).

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
   ``balancedResourceScorer``), as webhook/replay/model.py now does;
2. the GPU allocation the real cluster reaches (the mean of its three runs) is within 2 points of
   the model's median, in each arm.

``python benchmarks/replay_vs_scheduler.py`` prints the same figures for any slice.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.local import require_local
from tests.e2e.trace_slice import TRACE, Report, SliceSpec, every_pod_file, fidelity
from tests.prerequisites import needed

PODS_PER_LIST = 12
REAL_RUNS = 3
"""Real runs per arm. kube-scheduler breaks ties at random, so one run is one draw: on this slice one
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
