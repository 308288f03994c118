"""The real kube-scheduler (v1.36.3, default profile) honours gpugate's placement policies.

The real ``gpugate serve`` shapes pods with the starter ``policies/`` (plus one test policy that
routes profile ``batch`` to the second scheduler), registered as manifests/webhook renders it
(tests/e2e/placement_env.py, built on tests/e2e/webhook_fixture.py). The balancer's labels
``gpugate.io/gpu-free`` and ``gpugate.io/gpu-load`` are written here by hand, deterministically,
with the values the balancer derives from the GPUs requested on each node
(webhook/placement/marks.py; the balancer's own writing is tested in tests/e2e/test_balancer.py),
so each test judges only the scheduler and the webhook's affinity. Before a pod is scored, the
scheduler is shown to have seen the labels (``settle``).

Every claim is shown against a counterfactual that fails it: each test builds two identical
pools of fake nodes (same capacities, same pre-existing pods, same labels). Shaped pods go to
one pool; their twins, identical but for ``gpugate.io/skip: "true"`` (the webhook leaves them
as written: same GPU request, no affinity), go to the other. The pools are built so that what the
default profile does without gpugate (NodeResourcesFit LeastAllocated on cpu and memory,
framework/plugins/noderesources/least_allocated.go) picks a different node than the policy
promises, and the test asserts both: the twin lands where LeastAllocated sends it, the shaped
pod where the policy says. Pods select their pool with a nodeSelector, so nodes other tests
left in the session cannot interfere.

1. pack (training): a 2-GPU pod goes to the node with exactly 2 free GPUs, a 1-GPU pod to the node
   with 1, while the twins go to the emptiest nodes;
2. spread (inference): pods go to idle nodes although LeastAllocated prefers busy ones (the idle
   ones carry CPU-heavy pods);
3. avoidCongested: required (inference): never a congested node, even when it is every other
   score's favourite, and Pending when only congested nodes are left (the twin binds);
4. topology (training, one job): the job's pods fill the clique of its first pod although its
   nodes are LeastAllocated's last choice; a pod of the job outside that clique pulls the next one
   into its own clique;
5. the second scheduler: manifests/scheduler rendered with ``kubectl kustomize``, its
   KubeSchedulerConfiguration taken from the ConfigMap (an extender's URL and CA file switched to
   loopback ones, see ``scheduler_configuration``) and started as its own kube-scheduler; a
   pod a policy routes to ``schedulerName: gpugate-binpack`` stays Pending until that scheduler
   runs, is then bound by it (its Scheduled event is reported by ``gpugate-binpack``) and packed
   onto the node with the most GPUs already requested (MostAllocated), its default-scheduler twin
   going to an empty node.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e import shipped_scheduler
from tests.e2e.placement_env import (
    FREE,
    LOAD,
    POOL_LABEL,
    SKIP_LABEL,
    Watch,
    decision,
    delete_now,
    expected_marks,
    label_nodes,
    pod_watch,
    policy_folder,
    webhook,
)
from tests.e2e.shipped_scheduler import BINPACK
from tests.e2e.waiting import wait_until
from tests.e2e.webhook_fixture import (
    GpugateServer,
    Namespaces,
    Obj,
    ServingCerts,
    create_pod,
    policy_of,
)
from webhook.localcluster.cluster import Cluster, Nodes
from webhook.localcluster.processes import free_port

HOSTNAME = "kubernetes.io/hostname"
CLIQUE = "nvidia.com/gpu.clique"
GROUP = "gpugate.io/group"
EPOCH_LABEL = "e2e.gpugate.io/epoch"
EPOCHS = itertools.count(1)
# What policies/inference.yaml's minMemoryMiB demands of every inference pod, shaped or not.
INFERENCE_MEMORY = [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["23999"]}]
# The test policy: pods of profile `batch` in ml-* namespaces go to the second scheduler's profile.
BINPACK_POLICY = f"""\
apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata:
  name: e2e-binpack
spec:
  priority: 100
  match:
    namespaces: ["ml-*"]
    podSelector:
      matchLabels: {{gpugate.io/profile: batch}}
  gpu:
    resource: nvidia.com/gpu
    default: 1
    max: 8
  tolerations: auto
  schedulerName: {BINPACK}
"""


# --- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpugate(local: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpugateServer]:
    workdir = tmp_path_factory.mktemp("placement")
    policies = policy_folder(workdir / "policies", {"e2e-binpack.yaml": BINPACK_POLICY})
    with webhook(local, workdir, policies) as server:
        yield server


@dataclass
class Env:
    """One test's namespace (an ``ml-*`` one, where the starter policies apply) and its pod watch."""

    cluster: Cluster
    nodes: Nodes
    namespace: str
    pods: Watch
    tag: str

    @property
    def core(self) -> client.CoreV1Api:
        return self.cluster.core()


@pytest.fixture
def env(local: Cluster, gpugate: GpugateServer, nodes: Nodes) -> Iterator[Env]:
    namespaces = Namespaces(local)
    namespace = namespaces.make("ml-place")
    try:
        with pod_watch(local, namespace) as pods:
            yield Env(local, nodes, namespace, pods, secrets.token_hex(2))
    finally:
        namespaces.delete_all()


# --- pools, pods, labels ---------------------------------------------------------------------

@dataclass
class Pool:
    """Fake nodes selected by ``e2e.gpugate.io/pool: <name>``; ``node[key]`` is a node name.

    ``used`` is the GPUs requested per node, from which :meth:`relabel` writes what the balancer
    would; ``load`` overrides the tier of some nodes, as the balancer does when DCGM utilization
    puts a node in a worse tier than its allocation (webhook/placement/tiers.py ``tier``).
    """

    name: str
    node: dict[str, str]
    gpus: int = 8
    used: dict[str, int] = field(default_factory=dict)
    load: dict[str, str] = field(default_factory=dict)

    def key_of(self, node: str) -> str:
        return {v: k for k, v in self.node.items()}[node]

    def relabel(self, core: client.CoreV1Api) -> None:
        wanted = {}
        for key, node in self.node.items():
            free, tier = expected_marks(self.gpus, self.used.get(key, 0))
            wanted[node] = {FREE: free, LOAD: self.load.get(key, tier)}
        label_nodes(core, wanted)


def twin_pools(env: Env, layout: dict[str, dict[str, Any]]) -> tuple[Pool, Pool]:
    """Two identical pools (shaped, control) of nodes from ``layout`` (key -> NodeSpec fields)."""
    pools = []
    for role in ("shaped", "control"):
        name = f"{env.tag}-{role}"
        made = {}
        for key, fields in layout.items():
            labels = {POOL_LABEL: name, **fields.get("labels", {})}
            rest = {k: v for k, v in fields.items() if k != "labels"}
            if "clique" in rest:
                # Topology domains are label values: the pools must not share one, or the shaped
                # pods' preferred pod affinity (which also pulls matching incoming pods toward
                # existing pods that declare it, framework/plugins/interpodaffinity/scoring.go)
                # would reach the control pool.
                rest["clique"] = f"{name}-{rest['clique']}"
            made[key] = env.nodes.gpu(f"{name}-{key}", wait=False, labels=labels, **rest)
        pools.append(Pool(name, made))
    for pool in pools:
        for node in pool.node.values():
            env.cluster.kubelet.wait_schedulable(node)
    return pools[0], pools[1]


def pod(name: str, pool: Pool, *, profile: str, gpus: int, cpu: str = "4", memory: str = "16Gi",
        twin: bool = False, on: str | None = None, group: str | None = None,
        required: list[Obj] | None = None) -> Obj:
    """A pod as an ML engineer writes it: ``gpugate.io/gpus`` and a profile, cpu and memory requests.

    A ``twin`` opts out of shaping (``gpugate.io/skip``) and so asks for its GPUs itself, with
    requests == limits: the same resources as its shaped sibling, without the affinity.
    ``on`` pins it to one node of the pool (for pods that already run there). ``required`` is
    required node affinity the author writes (validation demands a policy's hardware requirement
    of unshaped pods too; it is a filter every node of these pools passes).
    """
    labels = {"gpugate.io/profile": profile}
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if twin:
        labels[SKIP_LABEL] = "true"
        if gpus:
            resources["requests"]["nvidia.com/gpu"] = str(gpus)
            resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    else:
        labels["gpugate.io/gpus"] = str(gpus)
    if group:
        labels[GROUP] = group
    selector = {POOL_LABEL: pool.name}
    if on:
        selector[HOSTNAME] = pool.node[on]
    spec: Obj = {"nodeSelector": selector,
                 "containers": [{"name": "main", "image": "registry.example/cuda:12", "resources": resources}]}
    if required:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": required}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def place(env: Env, pool: Pool, manifest: Obj, *, timeout: float = 30.0) -> tuple[Obj, str | None]:
    """Create the pod; return it as stored and the key of the node it was bound to (None: unschedulable).

    A binding is booked in ``pool.used`` and the pool relabelled, as the balancer would.
    """
    stored = create_pod(env.core, env.namespace, manifest)
    name = stored["metadata"]["name"]
    verdict: str = env.pods.wait(lambda objects: decision(objects.get(name)), timeout=timeout,
                                 what=f"a decision for {name}", explain=env.cluster.logs_tail)
    if verdict.startswith("unschedulable:"):
        return stored, None
    key = pool.key_of(verdict.split(":", 1)[1])
    gpus = sum(int(((c.get("resources") or {}).get("requests") or {}).get("nvidia.com/gpu", 0))
               for c in stored["spec"]["containers"])
    if gpus:
        pool.used[key] = pool.used.get(key, 0) + gpus
        pool.relabel(env.core)
    return stored, key


def settle(env: Env, pool: Pool) -> None:
    """Return once kube-scheduler's own view of the nodes holds every label written on ``pool`` so far.

    The scheduler scores from its informer's cache, which may trail our patch by a moment: a pod
    created right after a relabel could be scored on the old labels. So the pool's last node gets
    a fresh epoch label, written after every other label, and a probe pod requiring that epoch is
    created; the scheduler binds it only once its informer delivered that update. Node updates
    reach the scheduler's handlers in the order the API server committed them (one watch over all
    nodes; client-go's shared informer hands each handler its notifications in order,
    tools/cache/shared_informer.go processorListener), so every earlier label is in its cache too.
    The probe asks 1m cpu and 1 MiB (no GPU, unshaped) and is deleted at once. A probe that meets
    a stale cache is marked unschedulable first and retried on the node update: only its binding counts.
    """
    epoch = str(next(EPOCHS))
    last = list(pool.node.values())[-1]
    env.core.patch_node(last, {"metadata": {"labels": {EPOCH_LABEL: epoch}}})
    name = f"settle-{pool.name}-{epoch}"
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {SKIP_LABEL: "true"}},
             "spec": {"nodeSelector": {POOL_LABEL: pool.name, EPOCH_LABEL: epoch},
                      "containers": [{"name": "main", "image": "registry.example/busybox:1",
                                      "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}]}}
    create_pod(env.core, env.namespace, probe)
    env.pods.wait(lambda objects: (objects.get(name) or {}).get("spec", {}).get("nodeName"), timeout=60,
                  what=f"the scheduler seeing epoch {epoch} of pool {pool.name}", explain=env.cluster.logs_tail)
    delete_now(env.core, env.namespace, name)


def unschedulable_reason(env: Env, name: str) -> str:
    return str(decision(env.pods.objects.get(name)) or "")


def fill(env: Env, pools: tuple[Pool, Pool], running: dict[str, tuple[int, str, str]]) -> None:
    """Pods already running: per node key, (GPUs, cpu, memory) requested, in both pools; then labels."""
    for pool in pools:
        for key, (gpus, cpu, memory) in running.items():
            profile = "training" if gpus else "tools"
            _, landed = place(env, pool, pod(f"fill-{pool.name}-{key}", pool, profile=profile, gpus=gpus, cpu=cpu,
                                             memory=memory, twin=True, on=key))
            assert landed == key
        pool.relabel(env.core)
        settle(env, pool)


# --- 1. pack -------------------------------------------------------------------------------------

def test_pack_fills_the_tightest_node_first(env: Env) -> None:
    # Eight 8-GPU nodes; n2..n7 already run pods holding 2..8 GPUs (and 4 cores, 32 GiB per GPU).
    layout = {f"n{i}": {"gpus": 8, "cpu": 64, "memory_gib": 512} for i in range(8)}
    pools = twin_pools(env, layout)
    fill(env, pools, {k: (g, str(4 * g), f"{32 * g}Gi")
                      for k, g in {"n2": 2, "n3": 4, "n4": 5, "n5": 6, "n6": 7, "n7": 8}.items()})
    shaped_pool, control = pools

    stored, landed = place(env, shaped_pool, pod("train-2", shaped_pool, profile="training", gpus=2))
    assert (policy_of(stored) or "").startswith("training@")
    terms = stored["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert {t["preference"]["matchExpressions"][0]["key"] for t in terms} == {FREE}
    _, twin = place(env, control, pod("twin-2", control, profile="training", gpus=2, twin=True))
    # Without the affinity LeastAllocated takes an empty node; with it, the node with exactly 2 free.
    assert twin in {"n0", "n1"}, twin
    assert landed == "n5", landed

    _, landed = place(env, shaped_pool, pod("train-1", shaped_pool, profile="training", gpus=1))
    _, twin = place(env, control, pod("twin-1", control, profile="training", gpus=1, twin=True))
    assert twin in {"n0", "n1"}, twin
    assert landed == "n6", landed


# --- 2. spread -----------------------------------------------------------------------------------

def test_spread_prefers_idle_nodes(env: Env) -> None:
    # i0, i1: GPUs idle, but CPU-heavy pods (48 of 64 cores); b0..b3: 5 of 8 GPUs taken, little CPU.
    layout = {key: {"gpus": 8, "cpu": 64, "memory_gib": 512} for key in ("i0", "i1", "b0", "b1", "b2", "b3")}
    pools = twin_pools(env, layout)
    fill(env, pools, {"i0": (0, "48", "32Gi"), "i1": (0, "48", "32Gi"),
                      **{key: (5, "1", "8Gi") for key in ("b0", "b1", "b2", "b3")}})
    shaped_pool, control = pools

    landed, twins = [], []
    for i in range(3):
        stored, key = place(env, shaped_pool, pod(f"serve-{i}", shaped_pool, profile="inference", gpus=1, cpu="2",
                                                  memory="8Gi"))
        assert (policy_of(stored) or "").startswith("inference@")
        landed.append(key)
        twins.append(place(env, control, pod(f"twin-{i}", control, profile="inference", gpus=1, cpu="2",
                                             memory="8Gi", twin=True, required=INFERENCE_MEMORY))[1])
    assert all(key and key.startswith("b") for key in twins), twins
    assert all(key and key.startswith("i") for key in landed), landed


# --- 3. avoidCongested: required -------------------------------------------------------------

def test_avoid_congested_required_never_lands_on_a_congested_node(env: Env) -> None:
    # c0, c1: 4 of 8 GPUs taken, little CPU, but their GPUs are saturated: the balancer labels them
    # congested from DCGM utilization. i0: idle GPUs, CPU-heavy pods. LeastAllocated prefers c0/c1.
    layout = {key: {"gpus": 8, "cpu": 64, "memory_gib": 512} for key in ("c0", "c1", "i0")}
    pools = twin_pools(env, layout)
    for pool in pools:
        pool.load.update(c0="congested", c1="congested")
    fill(env, pools, {"c0": (4, "1", "8Gi"), "c1": (4, "1", "8Gi"), "i0": (0, "48", "32Gi")})
    shaped_pool, control = pools

    for i in range(2):
        stored, landed = place(env, shaped_pool, pod(f"serve-{i}", shaped_pool, profile="inference", gpus=1,
                                                     cpu="2", memory="8Gi"))
        required = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert {"key": LOAD, "operator": "NotIn", "values": ["congested"]} in \
            required["nodeSelectorTerms"][0]["matchExpressions"]
        _, twin = place(env, control, pod(f"twin-{i}", control, profile="inference", gpus=1, cpu="2",
                                          memory="8Gi", twin=True, required=INFERENCE_MEMORY))
        assert twin in {"c0", "c1"}, twin
        assert landed == "i0", landed

    # Utilization rises on i0 too: every node of the pool is congested now. The shaped pod waits;
    # its twin takes a congested node.
    for pool in pools:
        pool.load["i0"] = "congested"
        pool.relabel(env.core)
        settle(env, pool)
    _, landed = place(env, shaped_pool, pod("serve-late", shaped_pool, profile="inference", gpus=1, cpu="2",
                                            memory="8Gi"))
    assert landed is None
    assert "affinity" in unschedulable_reason(env, "serve-late"), unschedulable_reason(env, "serve-late")
    _, twin = place(env, control, pod("twin-late", control, profile="inference", gpus=1, cpu="2", memory="8Gi",
                                      twin=True, required=INFERENCE_MEMORY))
    assert twin is not None


# --- 4. topology ---------------------------------------------------------------------------------

def test_topology_co_locates_one_jobs_pods_on_one_clique(env: Env) -> None:
    # Clique A: three small nodes (32 cores), LeastAllocated's last choice. Cliques B and C: big nodes.
    layout: dict[str, dict[str, Any]] = {}
    for clique, keys, cores in (("a", ("a0", "a1", "a2"), 32), ("b", ("b0", "b1", "b2"), 128),
                                ("c", ("c0", "c1"), 128)):
        for key in keys:
            layout[key] = {"gpus": 8, "cpu": cores, "memory_gib": 4 * cores, "clique": f"fabric-{clique}.0"}
    pools = twin_pools(env, layout)
    for pool in pools:
        pool.relabel(env.core)
        settle(env, pool)
    shaped_pool, control = pools
    group = f"job-{env.tag}"

    def job_pod(i: int, pool: Pool, *, twin: bool = False, on: str | None = None) -> str | None:
        name = f"{'twin' if twin else 'job'}-{i}"
        stored, key = place(env, pool, pod(name, pool, profile="training", gpus=8, group=group, twin=twin, on=on))
        if not twin:
            preferred = stored["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            assert [t["podAffinityTerm"]["topologyKey"] for t in preferred] == [CLIQUE]
        return key

    # The job's first pod runs on a0 (pinned, so the test knows the clique), in both pools.
    assert job_pod(0, shaped_pool, on="a0") == "a0" and job_pod(0, control, twin=True, on="a0") == "a0"
    shaped = [job_pod(i, shaped_pool) for i in (1, 2)]
    twins = [job_pod(i, control, twin=True) for i in (1, 2)]
    assert not any(key and key.startswith("a") for key in twins), twins  # LeastAllocated: the big nodes
    assert sorted(key or "" for key in shaped) == ["a1", "a2"], shaped   # topology: the rest of clique A
    # Clique A is full: the next pod opens another clique, and the one after follows it there.
    third, fourth = job_pod(3, shaped_pool), job_pod(4, shaped_pool)
    assert third and fourth and third[0] in "bc" and fourth[0] == third[0], (third, fourth)


# --- 5. the second scheduler ---------------------------------------------------------------------

def scheduler_configuration(workdir: Path) -> dict[str, Any]:
    """The KubeSchedulerConfiguration as manifests/scheduler ships it (:mod:`tests.e2e.shipped_scheduler`).

    Only where its extenders are is switched, as the webhook's ``clientConfig`` is elsewhere: the
    balancer's Service name does not resolve here and its CA is a mounted Secret. Each extender
    gets a CA file that exists and a loopback URL where nothing listens; kube-scheduler gives a
    pod no extender score when prioritize fails and schedules it by its plugins
    (pkg/scheduler/schedule_one.go, prioritizeNodes: "Prioritization errors from extender can be
    ignored"). The extender's own scoring is tested with the balancer that serves it, not here.
    """
    document = shipped_scheduler.configuration()
    for extender in document.get("extenders") or []:
        assert extender.get("ignorable") is True, extender  # else an outage of the balancer stops scheduling
        assert not extender.get("filterVerb") and not extender.get("bindVerb"), extender
        extender["urlPrefix"] = f"https://127.0.0.1:{free_port()}/extender"
        if (extender.get("tlsConfig") or {}).get("caFile"):
            extender["tlsConfig"]["caFile"] = str(ServingCerts(workdir / "extender-ca").ca)
    return document


def scheduled_by(env: Env, pod_name: str) -> set[str]:
    """Which controllers reported a Scheduled event for the pod (events.k8s.io/v1 reportingController:
    kube-scheduler's recorder for a profile is named after its schedulerName, pkg/scheduler/profile)."""
    events = client.EventsV1Api(env.cluster.api_client()).list_namespaced_event(env.namespace)
    return {e.reporting_controller for e in events.items
            if e.regarding is not None and e.regarding.name == pod_name and e.reason == "Scheduled"}


def test_second_scheduler_from_manifests_schedules_and_packs_the_pods_that_name_it(env: Env, tmp_path: Path) -> None:
    config = scheduler_configuration(tmp_path)
    layout = {f"n{i}": {"gpus": 8, "cpu": 64, "memory_gib": 512} for i in range(5)}
    pools = twin_pools(env, layout)
    fill(env, pools, {"n0": (4, "16", "128Gi"), "n1": (2, "8", "64Gi")})
    shaped_pool, control = pools

    # A policy routes profile `batch` to gpugate-binpack; while no such scheduler runs the pod waits:
    # a scheduler only queues pods naming one of its profiles (pkg/scheduler/eventhandlers.go,
    # responsibleForPod).
    stored = create_pod(env.core, env.namespace, pod("batch-0", shaped_pool, profile="batch", gpus=2))
    assert stored["spec"]["schedulerName"] == BINPACK and (policy_of(stored) or "").startswith("e2e-binpack@")
    time.sleep(2.0)  # the default scheduler binds a pod within ~100 ms here: it had its chance
    assert decision(env.pods.objects.get("batch-0")) is None, env.pods.objects.get("batch-0")

    scheduler = env.cluster.start_scheduler(config, name=f"{BINPACK}-{env.tag}", leader_elect=False)
    try:
        verdict: str = env.pods.wait(lambda objects: decision(objects.get("batch-0")), timeout=60,
                                     what="gpugate-binpack to bind batch-0", explain=lambda: scheduler.tail())
        assert verdict.startswith("node:"), verdict
        landed = shaped_pool.key_of(verdict.split(":", 1)[1])
        # MostAllocated (nvidia.com/gpu weight 5): the node already holding the most GPUs.
        assert landed == "n0", landed
        shaped_pool.used["n0"] += 2
        _, twin = place(env, control, pod("twin-0", control, profile="batch", gpus=2, twin=True))
        assert twin in {"n2", "n3", "n4"}, twin  # the default profile: LeastAllocated, an empty node
        assert wait_until(lambda: scheduled_by(env, "batch-0"), timeout=30,
                          what="the Scheduled event of batch-0") == {BINPACK}
        assert wait_until(lambda: scheduled_by(env, "twin-0"), timeout=30,
                          what="the Scheduled event of twin-0") == {"default-scheduler"}
        # The next pod of the profile packs onto the same node while it has room.
        _, again = place(env, shaped_pool, pod("batch-1", shaped_pool, profile="batch", gpus=2))
        assert again == "n0", again
    finally:
        scheduler.stop()
    assert not scheduler.running()
