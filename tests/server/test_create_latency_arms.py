"""benchmarks/create_latency.py's ``shaped`` arm: the user's pod plus exactly what gpugate's patch set
(it tells what the bigger pod costs the API server apart from what the patch costs). The body is
built in tests/server/shapedpod.py, which the benchmark imports."""

from __future__ import annotations

import copy

import jsonpatch

from tests.server.shapedpod import shaped_body, the_pod

DEFAULT_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]
PATCH = [
    {"op": "add", "path": "/metadata/annotations", "value": {"gpugate.io/policy": "default-gpu@51df6f62ec8d"}},
    {"op": "add", "path": "/spec/containers/0/resources/requests", "value": {"nvidia.com/gpu": "1"}},
    {"op": "add", "path": "/spec/containers/0/resources/limits", "value": {"nvidia.com/gpu": "1"}},
    {"op": "add", "path": "/spec/tolerations/2",
     "value": {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}},
    {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {"matchExpressions": [
            {"key": "gpugate.io/gpu-load", "operator": "In", "values": ["idle"]}]}}]}}},
]


def stored(pod: dict) -> dict:
    """``pod`` as the API server hands it to a webhook and stores it: defaults, server-set metadata,
    the default tolerations and the service-account token volume."""
    out = copy.deepcopy(pod)
    out["metadata"].update(name="warm-0", namespace="ml-bench-gpugate", uid="u-1", resourceVersion="7",
                           managedFields=[{"manager": "python", "operation": "Update"}])
    spec = out["spec"]
    spec.update(dnsPolicy="ClusterFirst", restartPolicy="Always", schedulerName="default-scheduler",
                tolerations=copy.deepcopy(DEFAULT_TOLERATIONS), priority=0,
                volumes=[{"name": "kube-api-access-x1", "projected": {"sources": []}}])
    container = spec["containers"][0]
    container.update(resources={}, imagePullPolicy="IfNotPresent",
                     volumeMounts=[{"name": "kube-api-access-x1", "mountPath": "/var/run/secrets"}])
    out["status"] = {"phase": "Pending"}
    return out


def test_the_shaped_pod_is_the_users_pod_plus_the_patched_fields_and_nothing_the_server_sets() -> None:
    created = jsonpatch.apply_patch(stored(the_pod("x")), PATCH)
    shaped = shaped_body(created, PATCH)
    assert shaped["metadata"] == {"labels": {"gpugate.io/gpus": "1"},
                                  "annotations": {"gpugate.io/policy": "default-gpu@51df6f62ec8d"}}
    assert "status" not in shaped
    spec = shaped["spec"]
    assert spec["affinity"] == created["spec"]["affinity"]
    assert spec["tolerations"] == [*DEFAULT_TOLERATIONS, PATCH[3]["value"]]  # the whole list the patch added to
    assert spec["containers"][0]["resources"] == {"requests": {"nvidia.com/gpu": "1"},
                                                  "limits": {"nvidia.com/gpu": "1"}}
    # Nothing defaulted or added by the API server's own plugins is sent back as the client's.
    for field in ("dnsPolicy", "restartPolicy", "schedulerName", "priority", "volumes"):
        assert field not in spec, field
    assert set(spec["containers"][0]) == set(the_pod("x")["spec"]["containers"][0]) | {"resources"}
