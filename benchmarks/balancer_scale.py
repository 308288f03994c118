"""Balancer at scale: 5,000 GPU nodes and 150,000 pods of real size in the local fake API server.

Runs ``gpugate balance`` as its own process (so its memory and CPU are its own) against
tests/kubefake.py in this process, held to the Deployment's CPU limit (manifests/balancer:
500m) by a CPU cgroup when this machine lets us make one (root, cgroup v1 or v2), and prints:

- wall time from process start to every GPU node labelled (goal < 60 s), and the balancer's CPU
  seconds over the same span divided by the CPU limit (the wall time the limit alone would
  impose, whatever else the machine was doing);
- resident memory of the balancer, after the sync and peak (goal < 500 MB);
- CPU cost per watch event (goal < 1 ms): balancer CPU seconds over a burst of pod events
  (pods finishing and new pods starting), including the node patches they cause;
- node PATCHes per second (mean, and the busiest second) and per node, for the first labelling
  and for the burst, and the 429s the balancer got.

Objects are shaped like ``kubectl get -o json`` output of a real GPU cluster: pods of 4 to 15 KB
(managedFields of the Job controller, scheduler and kubelet, env, volumes, tolerations, status
with conditions and container statuses) and nodes of 10 to 50 KB (GFD and NFD labels and their
managedFields, conditions, the image list, node info). ``--objects small`` gives the old ~1 KB
pods and ~0.7 KB nodes for comparison. ``--code DIR`` runs the balancer of another checkout
(e.g. ``git archive HEAD~1 | tar -x -C /tmp/old``) against the same objects.

Usage: python benchmarks/balancer_scale.py [--nodes 5000] [--pods 150000] [--events 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.kubefake import FakeKube  # noqa: E402
from webhook.balancer.settings import InventorySettings  # noqa: E402
from webhook.names import GPU_FREE_LABEL, GPU_LOAD_LABEL  # noqa: E402

INVENTORY = InventorySettings().name

TICKS = os.sysconf("SC_CLK_TCK")
Obj = dict[str, Any]
STAMP = "2026-11-30T08:12:44Z"


def _hex(seed: str, length: int = 64) -> str:
    out = ""
    while len(out) < length:
        seed = hashlib.sha256(seed.encode()).hexdigest()
        out += seed
    return out[:length]


def _uid(seed: str) -> str:
    h = _hex(seed, 32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# ---- realistic nodes ------------------------------------------------------------------------------
CPU_FEATURES = ("ADX AESNI AMXBF16 AMXINT8 AMXTILE AVX AVX2 AVX512BF16 AVX512BITALG AVX512BW AVX512CD AVX512DQ "
                "AVX512F AVX512FP16 AVX512IFMA AVX512VBMI AVX512VBMI2 AVX512VL AVX512VNNI AVX512VPOPCNTDQ AVXVNNI "
                "CETIBT CETSS CLDEMOTE CMPXCHG8 FMA3 FSRM FXSR FXSROPT GFNI HYPERVISOR IBPB LAHF MOVBE MOVDIR64B "
                "MOVDIRI OSXSAVE SERIALIZE SHA SPEC_CTRL_SSBD STIBP SYSCALL SYSEE TSXLDTRK VAES VMX VPCLMULQDQ WAITPKG "
                "WBNOINVD X87 XGETBV1 XSAVE XSAVEC XSAVEOPT XSAVES").split()

OPERANDS = ("container-toolkit", "dcgm", "dcgm-exporter", "device-plugin", "driver", "gpu-feature-discovery",
            "node-status-exporter", "operator-validator")
"""The GPU Operator's operands; it labels a GPU node ``nvidia.com/gpu.deploy.<operand>=true`` for each."""


def _node_labels(name: str, i: int) -> dict[str, str]:
    labels = {
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/instance-type": "p5.48xlarge",
        "beta.kubernetes.io/os": "linux", "failure-domain.beta.kubernetes.io/region": "us-east-1",
        "failure-domain.beta.kubernetes.io/zone": f"us-east-1{'abc'[i % 3]}",
        "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": f"us-east-1{'abc'[i % 3]}",
        "k8s.amazonaws.com/accelerator": "nvidia-h100", "node-pool": "h100-train",
        "nvidia.com/cuda.driver-version.full": "580.82.07", "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.minor": "82", "nvidia.com/cuda.driver-version.revision": "07",
        "nvidia.com/cuda.driver.major": "580", "nvidia.com/cuda.driver.minor": "82", "nvidia.com/cuda.driver.rev": "07",
        "nvidia.com/cuda.runtime-version.full": "13.0", "nvidia.com/cuda.runtime-version.major": "13",
        "nvidia.com/cuda.runtime-version.minor": "0", "nvidia.com/cuda.runtime.major": "13",
        "nvidia.com/cuda.runtime.minor": "0", "nvidia.com/gfd.timestamp": "1764489164",
        "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0", "nvidia.com/gpu.count": "8",
        **{f"nvidia.com/gpu.deploy.{operand}": "true" for operand in OPERANDS},
        "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.machine": "p5.48xlarge", "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.mode": "compute", "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mps.capable": "false", "nvidia.com/vgpu.present": "false",
        "feature.node.kubernetes.io/kernel-version.full": "6.8.0-1019-aws",
        "feature.node.kubernetes.io/kernel-version.major": "6", "feature.node.kubernetes.io/kernel-version.minor": "8",
        "feature.node.kubernetes.io/pci-10de.present": "true", "feature.node.kubernetes.io/pci-1d0f.present": "true",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
        "feature.node.kubernetes.io/cpu-model.family": "6", "feature.node.kubernetes.io/cpu-model.id": "143",
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
    }
    labels.update({f"feature.node.kubernetes.io/cpu-cpuid.{f}": "true" for f in CPU_FEATURES})
    return labels


def _fields(keys: Any) -> Obj:
    return {".": {}, **{f"f:{k}": {} for k in keys}}


def _node_managed_fields(labels: dict[str, str]) -> list[Obj]:
    nfd = [k for k in labels if k.startswith(("feature.node", "nvidia.com"))]
    return [
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
            "f:annotations": _fields(["volumes.kubernetes.io/controller-managed-attach-detach"]),
            "f:labels": _fields([k for k in labels if not k.startswith(("feature.node", "nvidia.com"))])}},
         "manager": "kubelet", "operation": "Update", "time": STAMP},
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
            "f:annotations": {"f:node.alpha.kubernetes.io/ttl": {}}}, "f:spec": {
            "f:podCIDR": {}, "f:podCIDRs": {".": {}, "v:\"10.64.0.0/24\"": {}}}},
         "manager": "kube-controller-manager", "operation": "Update", "time": STAMP},
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
            "f:annotations": _fields(["nfd.node.kubernetes.io/feature-labels",
                                      "nfd.node.kubernetes.io/extended-resources"]),
            "f:labels": _fields(nfd)}},
         "manager": "nfd-master", "operation": "Update", "time": STAMP},
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:taints": {}}},
         "manager": "gpu-operator", "operation": "Update", "time": STAMP},
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {
            "f:allocatable": _fields(["cpu", "ephemeral-storage", "memory", "nvidia.com/gpu", "pods",
                                      "nvidia.com/cx7_sriov_rdma", "vpc.amazonaws.com/efa"]),
            "f:capacity": _fields(["cpu", "ephemeral-storage", "memory", "nvidia.com/gpu", "pods",
                                   "nvidia.com/cx7_sriov_rdma", "vpc.amazonaws.com/efa"]),
            "f:conditions": {f"k:{{\"type\":\"{t}\"}}": {"f:lastHeartbeatTime": {}, "f:lastTransitionTime": {},
                                                        "f:message": {}, "f:reason": {}, "f:status": {}}
                             for t in ("DiskPressure", "MemoryPressure", "PIDPressure", "Ready", "GpuXidError",
                                       "GpuNvlinkError")},
            "f:images": {}, "f:nodeInfo": {"f:bootID": {}, "f:kernelVersion": {}, "f:osImage": {}},
            "f:runtimeHandlers": {}}},
         "manager": "kubelet", "operation": "Update", "subresource": "status", "time": STAMP},
    ]


IMAGE_NAMES = [f"{repo}:{tag}" for repo in (
    "nvcr.io/nvidia/pytorch", "nvcr.io/nvidia/tritonserver", "nvcr.io/nvidia/nemo", "nvcr.io/nvidia/cuda",
    "nvcr.io/nvidia/k8s/dcgm-exporter", "nvcr.io/nvidia/k8s-device-plugin", "nvcr.io/nvidia/gpu-operator",
    "registry.example.com/ml/trainer", "registry.example.com/ml/eval", "public.ecr.aws/eks-distro/kubernetes/pause",
    "docker.io/fluent/fluent-bit", "quay.io/prometheus/node-exporter", "registry.k8s.io/kube-proxy",
    "registry.example.com/ml/dataloader", "registry.example.com/infra/sidecar") for tag in
    ("24.08-py3", "24.10-py3", "25.01-py3", "25.03-py3", "2.4.1", "2.5.0", "v0.17.2", "v1.33.4")]


def realistic_node(i: int, rng: random.Random) -> Obj:
    name = f"gpu-{i:05d}"
    labels = _node_labels(name, i)
    images = [{"names": [f"{n.split(':')[0]}@sha256:{_hex(n + str(j))}", n], "sizeBytes": 50_000_000 + 7919 * j}
              for j, n in enumerate(rng.sample(IMAGE_NAMES, rng.randint(10, 110)))]
    resources = {"cpu": "192", "ephemeral-storage": "3748664308Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                 "memory": "2097152000Ki", "nvidia.com/gpu": "8", "nvidia.com/cx7_sriov_rdma": "16", "pods": "110",
                 "vpc.amazonaws.com/efa": "32"}

    def condition(kind: str, status: str, reason: str, message: str) -> Obj:
        return {"lastHeartbeatTime": STAMP, "lastTransitionTime": STAMP, "message": message, "reason": reason,
                "status": status, "type": kind}

    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "annotations": {
            "alpha.kubernetes.io/provided-node-ip": f"10.200.{i // 250}.{i % 250 + 1}",
            "csi.volume.kubernetes.io/nodeid": f'{{"ebs.csi.aws.com":"i-0{_hex(name, 16)}"}}',
            "nfd.node.kubernetes.io/feature-labels": ",".join(f"cpu-cpuid.{f}" for f in CPU_FEATURES),
            "nfd.node.kubernetes.io/extended-resources": "", "node.alpha.kubernetes.io/ttl": "0",
            "nvidia.com/gpu-driver-upgrade-enabled": "true",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        "creationTimestamp": STAMP, "labels": labels, "managedFields": _node_managed_fields(labels), "name": name,
        "uid": _uid(name)},
        "spec": {"podCIDR": f"10.64.{i % 250}.0/24", "podCIDRs": [f"10.64.{i % 250}.0/24"],
                 "providerID": f"aws:///us-east-1a/i-0{_hex(name, 16)}",
                 "taints": [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "value": "present"}]},
        "status": {
            "addresses": [{"address": f"10.200.{i // 250}.{i % 250 + 1}", "type": "InternalIP"},
                          {"address": f"ip-10-200-{i // 250}-{i % 250 + 1}.ec2.internal", "type": "InternalDNS"},
                          {"address": name, "type": "Hostname"}],
            "allocatable": resources, "capacity": resources,
            "conditions": [condition("GpuXidError", "False", "NoXidErrors", "no XID errors"),
                           condition("GpuNvlinkError", "False", "NvlinkHealthy", "NVLink is healthy"),
                           condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                                     "kubelet has sufficient memory available"),
                           condition("DiskPressure", "False", "KubeletHasNoDiskPressure",
                                     "kubelet has no disk pressure"),
                           condition("PIDPressure", "False", "KubeletHasSufficientPID",
                                     "kubelet has sufficient PID available"),
                           condition("Ready", "True", "KubeletReady", "kubelet is posting ready status")],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}, "features": {"supplementalGroupsPolicy": True},
            "images": images,
            "nodeInfo": {"architecture": "amd64", "bootID": _uid(name + "boot"), "containerRuntimeVersion":
                         "containerd://1.7.27", "kernelVersion": "6.8.0-1019-aws", "kubeProxyVersion": "",
                         "kubeletVersion": "v1.33.4", "machineID": _hex(name, 32), "operatingSystem": "linux",
                         "osImage": "Ubuntu 22.04.5 LTS", "systemUUID": _uid(name + "sys")},
            "runtimeHandlers": [{"features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}, "name": n}
                                for n in ("nvidia", "runc", "")]}}


# ---- realistic pods ---------------------------------------------------------------------------------
ENV = [{"name": f"{key}", "value": value} for key, value in (
    ("NCCL_DEBUG", "WARN"), ("NCCL_SOCKET_IFNAME", "eth0"), ("NCCL_IB_HCA", "mlx5"), ("NCCL_ALGO", "Ring,Tree"),
    ("FI_PROVIDER", "efa"), ("FI_EFA_USE_DEVICE_RDMA", "1"), ("OMP_NUM_THREADS", "8"), ("PYTHONUNBUFFERED", "1"),
    ("HF_HOME", "/data/hf-cache"), ("TORCH_DISTRIBUTED_DEBUG", "OFF"), ("WANDB_MODE", "offline"),
    ("CUDA_DEVICE_MAX_CONNECTIONS", "1"), ("MASTER_PORT", "29500"), ("WORLD_SIZE", "32"),
    ("CHECKPOINT_DIR", "/data/checkpoints/run-2026-11-30"), ("DATASET", "s3://datasets/pretrain/shards-v7"),
    ("LOG_LEVEL", "info"), ("METRICS_PORT", "9400"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector:4317"),
    ("OTEL_SERVICE_NAME", "trainer"))] + [{"name": f"EXTRA_SETTING_{k:02d}", "value": f"value-{k:04d}-" + "x" * 40}
                                          for k in range(60)]
TOLERATIONS = [
    {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 300},
    {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists", "tolerationSeconds": 300}]
GPU_TOLERATION = [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
AFFINITY = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"preference": {"matchExpressions": [{"key": "gpugate.io/gpu-free", "operator": "Lt", "values": [str(n)]}]},
     "weight": w} for n, w in ((2, 40), (3, 30), (5, 20), (9, 10))] + [
    {"preference": {"matchExpressions": [{"key": "gpugate.io/gpu-load", "operator": "NotIn",
                                          "values": ["congested"]}]}, "weight": 5}]}}


def _volumes(suffix: str) -> list[Obj]:
    return [{"emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}, "name": "dshm"},
            {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
            {"name": f"kube-api-access-{suffix}", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
                {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                            "path": "namespace"}]}}]}}]


MOUNTS = [{"mountPath": "/dev/shm", "name": "dshm"}, {"mountPath": "/data", "name": "data", "readOnly": True},
          {"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "name": "kube-api-access-x7k2p",
           "readOnly": True, "recursiveReadOnly": "Disabled"}]


def _pod_managed_fields(env: list[Obj], gpu: bool) -> list[Obj]:
    container = {".": {}, "f:args": {}, "f:command": {}, "f:env": {".": {}, **{
        f"k:{{\"name\":\"{e['name']}\"}}": {".": {}, "f:name": {}, "f:value": {}} for e in env}},
        "f:image": {}, "f:imagePullPolicy": {}, "f:name": {}, "f:ports": {}, "f:resources": {
        ".": {}, "f:limits": _fields(["memory"] + (["nvidia.com/gpu"] if gpu else [])),
        "f:requests": _fields(["cpu", "memory"] + (["nvidia.com/gpu"] if gpu else []))},
        "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}, "f:volumeMounts": {}}
    conditions = {f"k:{{\"type\":\"{t}\"}}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {},
                                              "f:status": {}, "f:type": {}}
                  for t in ("ContainersReady", "Initialized", "PodReadyToStartContainers", "Ready")}
    return [
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {
            "f:metadata": {"f:annotations": _fields(["gpugate.io/policy", "kubectl.kubernetes.io/default-container"]),
                           "f:finalizers": {".": {}, "v:\"batch.kubernetes.io/job-tracking\"": {}},
                           "f:generateName": {}, "f:labels": _fields([
                               "app", "batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name",
                               "controller-uid", "gpugate.io/group", "job-name"]),
                           "f:ownerReferences": {".": {}}},
            "f:spec": {"f:affinity": {}, "f:containers": {"k:{\"name\":\"main\"}": container},
                       "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {},
                       "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}, "f:tolerations": {},
                       "f:volumes": {}}},
         "manager": "kube-controller-manager", "operation": "Update", "time": STAMP},
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {
            ".": {}, "k:{\"type\":\"PodScheduled\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {},
                                                    "f:status": {}, "f:type": {}}}}},
         "manager": "kube-scheduler", "operation": "Update", "subresource": "status", "time": STAMP},
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {
            "f:conditions": conditions, "f:containerStatuses": {}, "f:hostIP": {}, "f:hostIPs": {}, "f:phase": {},
            "f:podIP": {}, "f:podIPs": {".": {}}, "f:startTime": {}}},
         "manager": "kubelet", "operation": "Update", "subresource": "status", "time": STAMP},
    ]


# Shared sub-objects: the fake keeps one serialized copy per pod, but the dicts it keeps may share
# their unchanging parts, so 150,000 pods fit in the benchmark's memory.
_SHARED: dict[tuple[int, bool], tuple[list[Obj], list[Obj]]] = {}


def _shared(env_count: int, gpu: bool) -> tuple[list[Obj], list[Obj]]:
    key = (env_count, gpu)
    if key not in _SHARED:
        env = ENV[:env_count]
        _SHARED[key] = (env, _pod_managed_fields(env, gpu))
    return _SHARED[key]


VOLUMES = _volumes("x7k2p")


def realistic_pod(i: int, node_name: str, gpus: int, phase: str = "Running", *, env_count: int = 20) -> Obj:
    job = f"job-{i // 4:06d}"
    job_uid = _uid(job)
    env, managed = _shared(env_count, gpus > 0)
    resources: Obj = {"limits": {"memory": "64Gi"}, "requests": {"cpu": "12", "memory": "64Gi"}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
    running = phase == "Running"
    ip = f"10.{64 + i % 64}.{(i // 64) % 250}.{i % 250 + 1}"
    host_ip = f"10.200.{int(node_name[-5:]) // 250}.{int(node_name[-5:]) % 250 + 1}"
    state = {"running": {"startedAt": STAMP}} if running else {"terminated": {
        "containerID": f"containerd://{_hex(str(i))}", "exitCode": 0, "finishedAt": STAMP, "reason": "Completed",
        "startedAt": STAMP}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "annotations": {"gpugate.io/policy": "training@3f2a9c1b7d0e",
                        "kubectl.kubernetes.io/default-container": "main"},
        "creationTimestamp": STAMP, "finalizers": ["batch.kubernetes.io/job-tracking"], "generateName": f"{job}-",
        "labels": {"app": "trainer", "batch.kubernetes.io/controller-uid": job_uid, "batch.kubernetes.io/job-name": job,
                   "controller-uid": job_uid, "gpugate.io/group": job, "job-name": job},
        "managedFields": managed, "name": f"{job}-{i:06d}", "namespace": f"team-{i % 40}",
        "ownerReferences": [{"apiVersion": "batch/v1", "blockOwnerDeletion": True, "controller": True, "kind": "Job",
                             "name": job, "uid": job_uid}], "uid": _uid(str(i))},
        "spec": {**({"affinity": AFFINITY} if gpus else {}), "containers": [{
            "args": ["--config", "/etc/train/config.yaml", "--resume"], "command": ["torchrun", "-m", "train"],
            "env": env, "image": "nvcr.io/nvidia/pytorch:25.01-py3", "imagePullPolicy": "IfNotPresent", "name": "main",
            "ports": [{"containerPort": 9400, "name": "metrics", "protocol": "TCP"}], "resources": resources,
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            "volumeMounts": MOUNTS}],
            "dnsPolicy": "ClusterFirst", "enableServiceLinks": True, "nodeName": node_name,
            "preemptionPolicy": "PreemptLowerPriority", "priority": 0, "restartPolicy": "Never",
            "schedulerName": "default-scheduler", "securityContext": {}, "serviceAccount": "default",
            "serviceAccountName": "default", "terminationGracePeriodSeconds": 30,
            "tolerations": TOLERATIONS + (GPU_TOLERATION if gpus else []), "volumes": VOLUMES},
        "status": {
            "conditions": [{"lastProbeTime": None, "lastTransitionTime": STAMP,
                            "status": "True" if running else "False", "type": t}
                           for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                     "PodScheduled")],
            "containerStatuses": [{
                "allocatedResources": resources["requests"], "containerID": f"containerd://{_hex(str(i))}",
                "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                "imageID": f"nvcr.io/nvidia/pytorch@sha256:{_hex('pytorch')}", "lastState": {}, "name": "main",
                "ready": running, "resources": resources, "restartCount": 0, "started": running, "state": state,
                "user": {"linux": {"gid": 0, "supplementalGroups": [0], "uid": 0}},
                "volumeMounts": MOUNTS}],
            "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "phase": phase, "podIP": ip, "podIPs": [{"ip": ip}],
            "qosClass": "Burstable", "startTime": STAMP}}


# ---- the old small shapes (--objects small) -----------------------------------------------------------
def small_node(i: int, rng: random.Random) -> Obj:
    name = f"gpu-{i:05d}"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type":
                "p5.48xlarge", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                "topology.kubernetes.io/zone": f"zone-{i % 3}"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "190", "memory": "2000Gi", "nvidia.com/gpu": "8", "pods": "110"},
                       "capacity": {"cpu": "192", "memory": "2048Gi", "nvidia.com/gpu": "8", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}


def small_pod(i: int, node_name: str, gpus: int, phase: str = "Running", *, env_count: int = 1) -> Obj:
    resources: Obj = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"job-{i:06d}-worker", "namespace": f"team-{i % 40}",
                         "labels": {"app": "trainer", "gpugate.io/group": f"job-{i // 4}"},
                         "annotations": {"gpugate.io/policy": "training@3f2a9c1b7d0e"},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{i // 4}",
                                              "uid": f"00000000-0000-0000-0000-{i:012d}", "controller": True}]},
            "spec": {"nodeName": node_name, "schedulerName": "default-scheduler", "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "registry.example.com/ml/trainer:2.4.1",
                                     "command": ["python", "-m", "train"], "args": ["--epochs", "10"],
                                     "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                                     "resources": resources}],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
            "status": {"phase": phase, "podIP": f"10.{i % 250}.{(i // 250) % 250}.{i % 200 + 1}",
                       "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}]}}


# ---- measuring the balancer process --------------------------------------------------------------------
def node_pods(rng: random.Random, per_node: int, fill: int) -> list[int]:
    """The GPUs of each pod on one node: ``fill`` GPUs in pods of 1, 2 or 4, then CPU-only pods (0)
    up to ``per_node``, like a real cluster where most pods (daemons, sidecars, services) hold no GPU."""
    found = []
    while fill:
        gpus = rng.choice([g for g in (1, 2, 4) if g <= fill])
        found.append(gpus)
        fill -= gpus
    return found + [0] * max(per_node - len(found), 0)


def rss_mb(pid: int) -> tuple[float, float]:
    text = Path(f"/proc/{pid}/status").read_text()
    values = {k: int(re.search(rf"{k}:\s+(\d+)", text).group(1)) / 1024 for k in ("VmRSS", "VmHWM")}
    return values["VmRSS"], values["VmHWM"]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def metric(port: int, name: str, **labels: str) -> float:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        text = opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return 0.0
    total = 0.0
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():  # summed over label values not asked for
        if (line.startswith(name + " ") or line.startswith(name + "{")) and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def deployment_cpu_limit() -> float:
    """The balancer container's CPU limit in cores, from manifests/balancer/deployment.yaml."""
    doc = yaml.safe_load((REPO / "manifests/balancer/deployment.yaml").read_text())
    text = str(doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


@contextlib.contextmanager
def cpu_cgroup(cores: float) -> Iterator[Path | None]:
    """A CPU cgroup capped at ``cores`` (CFS quota, what a container's CPU limit is), or None.

    cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us``); needs root and a writable hierarchy.
    Yields the ``cgroup.procs`` file to put the balancer in; removed afterwards.
    """
    name = f"gpugate-balancer-bench-{os.getpid()}"
    period = 100_000
    candidates = [(Path("/sys/fs/cgroup") / name, lambda d: (d / "cpu.max").write_text(
        f"{int(cores * period)} {period}")),
                  (Path("/sys/fs/cgroup/cpu") / name, lambda d: ((d / "cpu.cfs_period_us").write_text(str(period)),
                                                                (d / "cpu.cfs_quota_us").write_text(
                                                                    str(int(cores * period)))))]
    made: Path | None = None
    for directory, configure in candidates:
        if not directory.parent.is_dir():
            continue
        if directory.parent == Path("/sys/fs/cgroup") and not (directory.parent / "cgroup.controllers").exists():
            continue  # not a cgroup v2 root
        try:
            directory.mkdir()
            made = directory
            configure(directory)
            break
        except OSError:
            if made is not None:
                with contextlib.suppress(OSError):
                    made.rmdir()
            made = None
    try:
        yield None if made is None else made / "cgroup.procs"
    finally:
        if made is not None:
            for _ in range(50):
                try:
                    made.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


# ---- the run --------------------------------------------------------------------------------------------
def patch_figures(requests: list[Any], since: float, until: float) -> tuple[int, float, int, float, int]:
    """(patches, mean per second, busiest second, mean per patched node, most on one node)."""
    patches = [r for r in requests if r.method == "PATCH" and r.path.startswith("/api/v1/nodes/")
               and since <= r.at <= until]
    if not patches:
        return 0, 0.0, 0, 0.0, 0
    seconds = Counter(int(r.at - since) for r in patches)
    per_node = Counter(r.path for r in patches)
    span = max(until - since, 1e-9)
    return (len(patches), len(patches) / span, max(seconds.values()), len(patches) / len(per_node),
            max(per_node.values()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--objects", choices=("realistic", "small"), default="realistic")
    parser.add_argument("--cpu-limit", type=float, default=None,
                        help="cores (default: the Deployment's limit); 0 runs the balancer unconstrained")
    parser.add_argument("--code", type=Path, default=REPO, help="checkout whose balancer runs [default: this one]")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    make_node, make_pod = (realistic_node, realistic_pod) if args.objects == "realistic" else (small_node, small_pod)
    limit = deployment_cpu_limit() if args.cpu_limit is None else args.cpu_limit

    fk = FakeKube(max_events=200_000, bookmark_interval=60.0).start()
    t0 = time.perf_counter()
    # What the Deployment's balancer reads besides nodes and pods: its namespace (Lease and the
    # GPUInventory ConfigMap live there) and the PriorityClasses every cluster has, plus gpugate's
    # own (manifests/webhook/priorityclass.yaml); without them it backed off on 404s and never
    # published the inventory that ships on by default.
    fk.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
    for name, value in (("system-cluster-critical", 2_000_000_000), ("system-node-critical", 2_000_001_000),
                        ("gpugate-critical", 1_000_000)):
        fk.put({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value, "globalDefault": False, "preemptionPolicy": "PreemptLowerPriority"})
    fk.put_many(make_node(i, rng) for i in range(args.nodes))
    names = [f"gpu-{i:05d}" for i in range(args.nodes)]
    # Every node gets a random GPU fill (0..8 GPUs in pods of 1, 2 or 4), the rest of its pods are
    # CPU-only, like a real cluster where most pods (daemons, sidecars, services) hold no GPU.
    gpu_pods: list[int] = []
    shapes: list[tuple[str, int, int]] = []
    free = {}
    per_node = args.pods // args.nodes
    for name in names:
        fill = rng.randint(0, 8)
        free[name] = 8 - fill
        for gpus in node_pods(rng, per_node, fill):
            if gpus:
                gpu_pods.append(len(shapes))
            shapes.append((name, gpus, rng.choice((0, 5, 10, 15, 20, 30, 40, 50))))
    fk.put_many(make_pod(i, node_name, gpus, env_count=env) for i, (node_name, gpus, env) in enumerate(shapes))
    node_bytes = fk.stored_bytes("v1", "Node")
    pod_bytes = fk.stored_bytes("v1", "Pod")
    print(f"fake API server: {args.nodes} nodes ({node_bytes / args.nodes / 1024:.1f} KB each, "
          f"{node_bytes / 2**20:.0f} MB), {len(shapes)} pods ({len(gpu_pods)} with GPUs; "
          f"{pod_bytes / max(len(shapes), 1) / 1024:.1f} KB each, {pod_bytes / 2**20:.0f} MB) stored in "
          f"{time.perf_counter() - t0:.1f} s")

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp, cpu_cgroup(limit if limit > 0 else 1e9) as procs:
        if limit <= 0:
            procs = None
        config = Path(tmp) / "balancer.yaml"
        config.write_text("resync_interval: 3600\nwatch_timeout: 600\n")
        env = {**os.environ, "PYTHONPATH": str(args.code)}
        fk.requests.clear()
        start = time.perf_counter()
        start_mono = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "webhook.cli", "balance", "--server", fk.url, "--config", str(config),
             "--identity", "bench", "--lease-namespace", "bench", "--health-bind", f"127.0.0.1:{port}",
             "--log-level", "WARNING"], cwd=args.code, env=env)
        if procs is not None:
            procs.write_text(str(proc.pid))
        constraint = (f"CPU cgroup quota {limit:g} cores" if procs is not None else
                      "no CPU constraint" if limit <= 0 else "no cgroup could be made: unconstrained "
                      "(see CPU/limit below)")
        print(f"balancer from {args.code}, {constraint}")
        try:
            def labelled(obj: dict) -> bool:
                labels = obj["metadata"].get("labels") or {}
                return GPU_FREE_LABEL in labels and GPU_LOAD_LABEL in labels

            synced_at: float | None = None
            has_readyz = True
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            while fk.count("v1", "Node", labelled) < args.nodes:
                if synced_at is None and has_readyz:
                    try:
                        if opener.open(f"http://127.0.0.1:{port}/readyz", timeout=5).status == 200:
                            synced_at = time.perf_counter() - start
                    except urllib.error.HTTPError as err:
                        has_readyz = err.code != 404  # 503: caches not synced; 404: a balancer without /readyz
                    except OSError:
                        pass  # not listening yet
                if proc.poll() is not None:
                    print("balancer exited early", file=sys.stderr)
                    return 1
                if time.perf_counter() - start > 900:
                    print("not all nodes labelled after 900 s", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            to_labelled = time.perf_counter() - start
            while fk.get("v1", "ConfigMap", INVENTORY, "bench") is None:
                if proc.poll() is not None or time.perf_counter() - start > 900:
                    print("the GPUInventory ConfigMap was never published", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            to_inventory = time.perf_counter() - start
            inventory = fk.get("v1", "ConfigMap", INVENTORY, "bench")
            assert inventory is not None
            inventory_bytes = sum(len(v) for v in (inventory.get("data") or {}).values())
            sync_end_mono = time.monotonic()
            cpu_sync = cpu_seconds(proc.pid)
            rss_sync, peak_sync = rss_mb(proc.pid)
            sync_patches = patch_figures(fk.requests, start_mono, sync_end_mono)

            # Burst of pod events: half of the GPU pods finish, as many new GPU pods start.
            while metric(port, "gpugate_balancer_last_full_sync_timestamp_seconds") <= 0:
                time.sleep(0.1)
            time.sleep(1.0)  # let the writes of the first labelling settle
            seen_before = metric(port, "gpugate_balancer_watch_events_total")
            cpu_before = cpu_seconds(proc.pid)
            half = min(args.events // 2, len(gpu_pods))
            finishing = rng.sample(gpu_pods, half)
            burst = [make_pod(i, shapes[i][0], shapes[i][1], phase="Succeeded", env_count=shapes[i][2])
                     for i in finishing]
            for i in finishing:
                free[shapes[i][0]] += shapes[i][1]
            roomy = [n for n in names if free[n]]
            for k in range(args.events - half):
                target = rng.choice(roomy)
                while not free[target]:
                    target = rng.choice(roomy)
                free[target] -= 1
                burst.append(make_pod(len(shapes) + k, target, 1, env_count=20))
            t_burst = time.perf_counter()
            burst_mono = time.monotonic()
            fk.put_many(burst)
            while metric(port, "gpugate_balancer_watch_events_total") - seen_before < len(burst):
                if time.perf_counter() - t_burst > 300:
                    print("events not all handled after 300 s", file=sys.stderr)
                    return 1
                time.sleep(0.05)
            # let the writes those events caused finish: no node PATCH for 3 s
            while True:
                last = max((r.at for r in fk.requests if r.method == "PATCH"), default=burst_mono)
                if time.monotonic() - last > 3.0:
                    break
                time.sleep(0.2)
            burst_wall = last - burst_mono
            cpu_burst = cpu_seconds(proc.pid) - cpu_before
            burst_patches = patch_figures(fk.requests, burst_mono, last)
            rss_end, peak_end = rss_mb(proc.pid)
            throttled = sum(1 for r in fk.requests if r.status == 429)
            inventory_writes = sum(1 for r in fk.requests if r.method in ("POST", "PUT", "PATCH")
                                   and "/configmaps" in r.path)
            lists = sum(1 for r in fk.requests if r.method == "GET" and r.path in ("/api/v1/pods", "/api/v1/nodes")
                        and ("watch" not in r.query or r.query.get("sendInitialEvents") == "true"))
        finally:
            proc.terminate()
            proc.wait(30)
        fk.stop()

    per_event_ms = cpu_burst / len(burst) * 1000
    rows = [
        ("start to all nodes labelled, wall (s)", f"{to_labelled:.1f}", "< 60"),
        ("  of which caches synced (/readyz), wall (s)", "-" if synced_at is None else f"{synced_at:.1f}", ""),
        ("start to GPUInventory published, wall (s)", f"{to_inventory:.1f}", ""),
        ("  GPUInventory size (KB) / ConfigMap writes", f"{inventory_bytes / 1024:.1f} / {inventory_writes}", ""),
        ("balancer CPU to all nodes labelled (s)", f"{cpu_sync:.1f}", ""),
        (f"  that CPU / the {limit:g}-core limit (s)", f"{cpu_sync / limit:.1f}" if limit > 0 else "-", "< 60"),
        ("lists to sync (pages, or streamed lists)", f"{lists}", ""),
        ("resident memory after sync (MB)", f"{rss_sync:.0f}", "< 500"),
        ("resident memory peak (MB)", f"{max(peak_sync, peak_end):.0f}", "< 500"),
        ("first labelling: node patches", f"{sync_patches[0]}", ""),
        ("  patches/s mean / busiest second", f"{sync_patches[1]:.0f} / {sync_patches[2]}", ""),
        ("  patches per node mean / max", f"{sync_patches[3]:.2f} / {sync_patches[4]}", ""),
        ("watch events in burst", f"{len(burst)}", ""),
        ("burst: node patches", f"{burst_patches[0]}", ""),
        ("  patches/s mean / busiest second", f"{burst_patches[1]:.0f} / {burst_patches[2]}", ""),
        ("  patches per node mean / max", f"{burst_patches[3]:.2f} / {burst_patches[4]}", ""),
        ("balancer CPU per watch event (ms)", f"{per_event_ms:.3f}", "< 1"),
        ("burst wall time, to the last patch (s)", f"{burst_wall:.1f}", ""),
        ("429 answers", f"{throttled}", ""),
        ("exit code after SIGTERM", f"{proc.returncode}", "0"),
    ]
    print()
    print(f"{'figure':<46}{'measured':>16}{'goal':>10}")
    for label, value, goal in rows:
        print(f"{label:<46}{value:>16}{goal:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
