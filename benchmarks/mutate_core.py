"""How much the mutation core costs per pod, next to the floor every webhook pays.

The floor is ``json.loads`` + ``json.dumps`` of the same AdmissionReview: any Python webhook
decodes the request and encodes a response. The core (select a policy among 20+, compute the
desired pod, diff it into a JSON patch) should cost at most 2x that floor.

Run: python benchmarks/mutate_core.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable

from webhook.admission import mutation, validation
from webhook.policy import PolicySet, parsing


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


def rate(function: Callable[[], object], seconds: float) -> tuple[float, float]:
    """Calls per second (median of 5 rounds) and its spread."""
    rounds = []
    for _ in range(5):
        count, deadline = 0, time.perf_counter() + seconds / 5
        start = time.perf_counter()
        while time.perf_counter() < deadline:
            for _ in range(50):
                function()
            count += 50
        rounds.append(count / (time.perf_counter() - start))
    return statistics.median(rounds), (max(rounds) - min(rounds)) / statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--policies", type=int, default=24)
    args = parser.parse_args()
    policies = parsing.parse(policy_texts(args.policies))
    pod = realistic_pod()
    body = json.dumps(review_for(pod))
    result = mutation.mutate(pod, namespace="team-19-vision", policies=policies)
    assert result.patch and result.policy and result.policy.name == "team-19", result.policy

    def floor() -> object:
        return json.dumps(json.loads(body))

    def core() -> object:
        return mutation.mutate(pod, namespace="team-19-vision", policies=policies)

    def core_and_validate() -> object:
        m = mutation.mutate(pod, namespace="team-19-vision", policies=policies)
        return validation.validate(m.desired, namespace="team-19-vision", policies=policies)

    floor_rate, floor_spread = rate(floor, args.seconds)
    core_rate, core_spread = rate(core, args.seconds)
    both_rate, both_spread = rate(core_and_validate, args.seconds)
    print(f"policies: {len(policies.policies)}, review: {len(body)} bytes, patch ops: {len(result.patch)}")
    print(f"{'what':<34}{'per second':>12}{'us each':>10}{'spread':>8}{'x floor':>9}")
    for name, value, spread in (("floor: json.loads + json.dumps", floor_rate, floor_spread),
                                ("mutate (select+steps+make_patch)", core_rate, core_spread),
                                ("mutate + validate", both_rate, both_spread)):
        print(f"{name:<34}{value:>12,.0f}{1e6 / value:>10.1f}{spread:>8.0%}{floor_rate / value:>9.2f}")
    print(f"goal: mutate costs at most 2.00x the floor -> {'met' if floor_rate / core_rate <= 2 else 'MISSED'}")
    print_breakdown(pod, policies, floor_rate)


def print_breakdown(pod: dict, policies: PolicySet, floor_rate: float) -> None:
    """Where one mutation's time goes, each part timed alone (microseconds, x floor)."""
    import timeit

    import jsonpatch

    from webhook.admission import patches
    from webhook.policy import matching

    namespace = "team-19-vision"
    policy = matching.select(policies, pod, namespace=namespace)
    desired = mutation.mutate(pod, namespace=namespace, policies=policies).desired
    skeleton = patches._strip_shared(pod, desired, {})
    parts = {
        "select the policy": lambda: matching.select(policies, pod, namespace=namespace),
        "copy + steps (+ re-select)": lambda: mutation._shape(pod, policy, namespace, policies),
        "strip to a skeleton": lambda: patches._strip_shared(pod, desired, {}),
        "jsonpatch.make_patch(skeleton)": lambda: jsonpatch.make_patch(*skeleton),
        "jsonpatch.make_patch(whole pods)": lambda: jsonpatch.make_patch(pod, desired),
    }
    print("breakdown (each part alone)")
    for name, function in parts.items():
        seconds = min(timeit.repeat(function, number=500, repeat=5)) / 500
        print(f"  {name:<32}{seconds * 1e6:>10.1f} us{seconds * floor_rate:>9.2f}x floor")


if __name__ == "__main__":
    main()
