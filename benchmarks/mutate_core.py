"""How much the mutation core costs per pod, next to the floor every webhook pays.

The floor is ``json.loads`` + ``json.dumps`` of the same AdmissionReview: any Python webhook
decodes the request and encodes a response. The core (select a policy among 20+, compute the
desired pod, diff it into a JSON patch) should cost at most 2x that floor.

Run: python benchmarks/mutate_core.py [--seconds 6] [--before REV]   (shortest: --seconds 0.3)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from webhook.admission import mutation, validation
from webhook.kube import pods
from webhook.kube.inventory import EMPTY
from webhook.policy import PolicySet, parsing

REPO = Path(__file__).resolve().parents[1]


def policy_texts(count: int) -> list[tuple[str, str]]:
    """``count`` realistic policies with distinct priorities, the matching one last in priority order."""
    texts = []
    for i in range(count):
        texts.append((f"team-{i:02d}.yaml", f"""
apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {{name: team-{i:02d}}}
spec:
  priority: {1000 - i}
  match:
    namespaces: ["team-{i:02d}-*", "shared-{i:02d}"]
    podSelector:
      matchLabels: {{gpugate.io/profile: training}}
      matchExpressions: [{{key: tier, operator: NotIn, values: [batch]}}]
  gpu: {{resource: nvidia.com/gpu, default: 1, max: 8, products: [NVIDIA-H100-80GB-HBM3], minMemoryMiB: 40000}}
  tolerations: auto
  placement:
    strategy: pack
    avoidCongested: preferred
    topology: {{key: nvidia.com/gpu.clique, mode: preferred}}
  priorityClassName: team-{i:02d}-training
"""))
    return texts


def realistic_pod() -> dict:
    """3 containers, an init container, existing tolerations and affinity, as a Job controller sends it."""
    container = {
        "image": "registry.example.com/ml/trainer:2.3.0",
        "command": ["torchrun", "--nproc-per-node=4", "train.py"],
        "env": [{"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(12)],
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "64Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "shm", "mountPath": "/dev/shm"}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "llama-train-0-", "namespace": "team-19-vision",
            "labels": {"gpugate.io/profile": "training", "gpugate.io/gpus": "4",
                       "batch.kubernetes.io/job-name": "llama-train", "app": "llama"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "llama-train",
                                 "uid": str(uuid.uuid4()), "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "initContainers": [dict(container, name="fetch")],
            "containers": [dict(container, name="trainer"), dict(container, name="logger"),
                           dict(container, name="metrics")],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
                        {"name": "shm", "emptyDir": {"medium": "Memory"}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                       "values": ["a", "b"]}]}]}}},
            "restartPolicy": "Never", "schedulerName": "default-scheduler", "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "trainer", "priority": 0,
        },
    }
    return json.loads(json.dumps(pod))  # no shared sub-dicts between the containers, as on the wire


def review_for(pod: dict) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "team-19-vision",
        "operation": "CREATE", "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
        "object": pod, "oldObject": None, "dryRun": False}}


def rates(functions: dict[str, Callable[[], object]], seconds: float, rounds: int = 15) -> dict[str, list[float]]:
    """Calls per CPU second of each function, ``rounds`` rounds each, the functions interleaved
    within every round. CPU time of this process, not wall time: on a shared machine the time the
    process waits for a core is not a cost of the code; interleaving spreads what remains (cache
    and frequency effects of the neighbours' load) over all of them alike."""
    found: dict[str, list[float]] = {name: [] for name in functions}
    share = seconds / rounds / len(functions)
    for _ in range(rounds):
        for name, function in functions.items():
            count, start = 0, time.process_time()
            deadline = start + share
            while True:
                for _ in range(10):
                    function()
                count += 10
                if time.process_time() >= deadline:
                    break
            found[name].append(count / (time.process_time() - start))
    return found


def load_before(revision: str) -> ModuleType:
    """webhook/admission/validation.py as it was at ``revision``, loaded beside today's (it is pure
    and imports only the package's other modules), so before and after are timed in one run."""
    done = subprocess.run(["git", "show", f"{revision}:webhook/admission/validation.py"], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--before {revision}: {done.stderr.strip()}")
    module = ModuleType(f"validation_at_{revision.replace('~', '_').replace('^', '_')}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(done.stdout, f"{revision}:webhook/admission/validation.py", "exec"), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="total timing budget (default 6)")
    parser.add_argument("--policies", type=int, default=24)
    parser.add_argument("--before", metavar="REV", help="also time validation as it was at this git revision")
    args = parser.parse_args()
    policies = parsing.parse(policy_texts(args.policies))
    namespace = "team-19-vision"
    pod = realistic_pod()
    body = json.dumps(review_for(pod))
    result = mutation.mutate(pod, namespace=namespace, policies=policies)
    assert result.patch and result.policy and result.policy.name == "team-19", result.policy
    assert validation.validate(result.desired, namespace=namespace, policies=policies).allowed

    def floor() -> object:
        return json.dumps(json.loads(body))

    def core() -> object:
        return mutation.mutate(pod, namespace=namespace, policies=policies)

    def core_and_validate() -> object:
        m = mutation.mutate(pod, namespace=namespace, policies=policies)
        return validation.validate(m.desired, namespace=namespace, policies=policies)

    functions: dict[str, Callable[[], object]] = {
        "floor: json.loads + json.dumps": floor,
        "mutate (select+steps+make_patch)": core,
        "mutate + validate": core_and_validate,
    }
    if args.before:
        old = load_before(args.before)
        assert old.validate(result.desired, namespace=namespace, policies=policies).allowed

        def core_and_old_validate() -> object:
            m = mutation.mutate(pod, namespace=namespace, policies=policies)
            return old.validate(m.desired, namespace=namespace, policies=policies)
        functions[f"mutate + validate at {args.before}"] = core_and_old_validate
    found = rates(functions, args.seconds)
    floor_rate = statistics.median(found["floor: json.loads + json.dumps"])
    print(f"policies: {len(policies.policies)}, review: {len(body)} bytes, patch ops: {len(result.patch)}, "
          f"{len(found[next(iter(found))])} interleaved rounds")
    print(f"{'what (CPU time)':<40}{'per second':>12}{'us each':>10}{'spread':>8}{'x floor':>9}")
    for name, values in found.items():
        value = statistics.median(values)
        spread = (max(values) - min(values)) / value
        print(f"{name:<40}{value:>12,.0f}{1e6 / value:>10.1f}{spread:>8.0%}{floor_rate / value:>9.2f}")
    both = floor_rate / statistics.median(found["mutate + validate"])
    print(f"goal: mutate + validate costs at most 2.00x the floor -> {both:.2f}x, {'met' if both <= 2 else 'MISSED'}")
    print_breakdown(pod, policies, floor_rate)


def print_breakdown(pod: dict, policies: PolicySet, floor_rate: float) -> None:
    """Where one admission's time goes, each part timed alone (microseconds, x floor)."""
    import timeit

    import jsonpatch

    from webhook.admission import patches
    from webhook.policy import matching

    namespace = "team-19-vision"
    policy = matching.select(policies, pod, namespace=namespace)
    assert policy is not None
    requested = frozenset(pods.requested_gpu_resources(pod))
    desired = mutation.mutate(pod, namespace=namespace, policies=policies).desired
    parts: dict[str, Callable[[], object]] = {
        "select the policy": lambda: matching.select(policies, pod, namespace=namespace),
        "copy + steps (+ re-select)": lambda: mutation._settle(pod, policy, namespace, policies, EMPTY, None,
                                                               requested=requested, gpu_pod=True),
        "patches.make_patch": lambda: patches.make_patch(pod, desired),
        "jsonpatch.make_patch (for scale)": lambda: jsonpatch.make_patch(pod, desired),
        "validate the shaped pod": lambda: validation.validate(desired, namespace=namespace, policies=policies),
    }
    print("breakdown (each part alone)")
    for name, function in parts.items():
        seconds = min(timeit.repeat(function, number=200, repeat=5, timer=time.process_time)) / 200
        print(f"  {name:<34}{seconds * 1e6:>10.1f} us{seconds * floor_rate:>9.2f}x floor")


if __name__ == "__main__":
    main()
