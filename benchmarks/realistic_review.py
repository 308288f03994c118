"""An AdmissionReview as the API server sends it for a real training worker (about 5.5 KB).

An 8-GPU PyTorch worker created by a training operator: a sidecar (log shipper, ``restartPolicy:
Always``), the env, volume mounts and projected service-account token the API server and its
admission plugins add before webhooks run (ServiceAccount, DefaultTolerationSeconds, Priority),
and the managedFields entry of the creating controller. The benchmark's default payload: small
example pods flatter the server, since most of a review's cost is its bytes.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

_ENV = [
    {"name": "MASTER_ADDR", "value": "llama-ft-master-0"}, {"name": "MASTER_PORT", "value": "23456"},
    {"name": "WORLD_SIZE", "value": "32"}, {"name": "RANK", "value": "7"},
    {"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "NCCL_DEBUG", "value": "WARN"},
    {"name": "NCCL_IB_HCA", "value": "mlx5_0,mlx5_1,mlx5_2,mlx5_3"},
    {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}, {"name": "HF_HOME", "value": "/cache/hf"},
    {"name": "WANDB_PROJECT", "value": "llama-finetune"},
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
    {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"key": "api-key", "name": "wandb"}}},
]

_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "generateName": "llama-ft-worker-7-",
        "namespace": "ml-vision",
        "labels": {
            "training.kubeflow.org/job-name": "llama-ft", "training.kubeflow.org/job-role": "worker",
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-index": "7", "training.kubeflow.org/replica-type": "worker",
            "gpugate.io/profile": "training",
        },
        "annotations": {"sidecar.istio.io/inject": "false", "prometheus.io/scrape": "true",
                        "prometheus.io/port": "9400"},
        "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama-ft",
                             "uid": "3f6f2e2a-8a51-4f0e-9a7e-0c6f2d9a1b55", "controller": True,
                             "blockOwnerDeletion": True}],
        "managedFields": [{
            "manager": "pytorchjob-controller", "operation": "Update", "apiVersion": "v1",
            "time": "2026-11-30T08:14:03Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {
                ".": {}, "f:gpugate.io/profile": {}, "f:training.kubeflow.org/job-name": {},
                "f:training.kubeflow.org/job-role": {}, "f:training.kubeflow.org/operator-name": {},
                "f:training.kubeflow.org/replica-index": {}, "f:training.kubeflow.org/replica-type": {}},
                "f:ownerReferences": {".": {}, "k:{\"uid\":\"3f6f2e2a-8a51-4f0e-9a7e-0c6f2d9a1b55\"}": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"pytorch\"}": {
                    ".": {}, "f:args": {}, "f:command": {}, "f:env": {}, "f:image": {},
                    "f:imagePullPolicy": {}, "f:name": {}, "f:resources": {}, "f:volumeMounts": {}}},
                    "f:initContainers": {"k:{\"name\":\"log-shipper\"}": {".": {}, "f:image": {}, "f:name": {},
                                                                          "f:restartPolicy": {}}},
                    "f:restartPolicy": {}, "f:volumes": {}}},
        }],
    },
    "spec": {
        "initContainers": [{
            "name": "log-shipper", "image": "registry.example.com/infra/vector:0.41.1", "restartPolicy": "Always",
            "args": ["--config", "/etc/vector/vector.yaml"],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
            "volumeMounts": [{"name": "logs", "mountPath": "/var/log/train"},
                             {"name": "kube-api-access-7x2kq", "readOnly": True,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent",
        }],
        "containers": [{
            "name": "pytorch", "image": "registry.example.com/ml/llama-finetune:2026.11.3",
            "command": ["torchrun"],
            "args": ["--nnodes=4", "--nproc-per-node=8", "train.py", "--config=/etc/train/llama-70b.yaml"],
            "env": _ENV,
            "resources": {"requests": {"cpu": "48", "memory": "800Gi", "nvidia.com/gpu": "8"},
                          "limits": {"memory": "900Gi", "nvidia.com/gpu": "8"}},
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "cache", "mountPath": "/cache"},
                             {"name": "config", "mountPath": "/etc/train", "readOnly": True},
                             {"name": "logs", "mountPath": "/var/log/train"},
                             {"name": "kube-api-access-7x2kq",
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}],
            "ports": [{"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}],
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent",
        }],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
            {"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}},
            {"name": "config", "configMap": {"name": "llama-ft-config", "defaultMode": 420}},
            {"name": "logs", "emptyDir": {}},
            {"name": "kube-api-access-7x2kq", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                            "fieldPath": "metadata.namespace"}}]}}]}},
        ],
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
        "schedulerName": "default-scheduler", "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300},
        ],
    },
    "status": {},
}


def review(*, uid: str | None = None) -> dict[str, Any]:
    """A fresh review of the training worker (a new uid each call, as the API server sends)."""
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "", "namespace": "ml-vision", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kubeflow:training-operator",
                         "uid": "b1d8a3c1-0d2e-4e4f-9e8b-6a2f3d1c0b9a",
                         "groups": ["system:serviceaccounts", "system:serviceaccounts:kubeflow",
                                    "system:authenticated"]},
            "object": copy.deepcopy(_POD), "oldObject": None, "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
                        "fieldManager": "pytorchjob-controller"},
        },
    }
