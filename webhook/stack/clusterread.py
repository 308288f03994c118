"""Read the cluster state the preflight rules need: through the API (``--kube``) or from a recording.

Through the API with the real ``kubernetes`` client, as raw JSON (``_preload_content=False``: no
snake_case models reach the core): the CRDs as the API server serves them, every node, every pod
and DaemonSet (pods using a GPU without asking can be in any namespace), and the NVIDIA objects
(ClusterPolicy, NVIDIADriver, GPUCluster; an unserved kind reads as none). A recording is YAML
documents or ``List`` objects, e.g. ``kubectl get crd,nodes,pods,daemonsets -A -o yaml``.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from webhook.errors import GpugateError
from webhook.kubetarget import Target
from webhook.stack.clusterstate import ClusterSnapshot

NVIDIA_KINDS = (("ClusterPolicy", "v1", "clusterpolicies"), ("NVIDIADriver", "v1alpha1", "nvidiadrivers"),
                ("GPUCluster", "v1alpha1", "gpuclusters"))


def _items(kind: str, call: Any, what: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    from webhook import kubeclient

    response = kubeclient.call_unless_absent(lambda: call(*args, _preload_content=False, **kwargs), f"listing {what}")
    if response is None:
        return []
    return [{**item, "kind": kind} for item in kubeclient.raw_json(response).get("items") or []]


def read_cluster(server: Target | str | None) -> ClusterSnapshot:
    """Everything the preflight rules read, listed once through the API server of ``server``."""
    from kubernetes import client

    from webhook.kubeclient import api_client

    api = api_client(server)
    try:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        custom, extensions = client.CustomObjectsApi(api), client.ApiextensionsV1Api(api)
        objects = _items("CustomResourceDefinition", extensions.list_custom_resource_definition, "CRDs")
        objects += _items("Node", core.list_node, "nodes")
        objects += _items("Pod", core.list_pod_for_all_namespaces, "pods")
        objects += _items("DaemonSet", apps.list_daemon_set_for_all_namespaces, "DaemonSets")
        for kind, version, plural in NVIDIA_KINDS:
            objects += _items(kind, custom.list_cluster_custom_object, f"{kind}s", "nvidia.com", version, plural)
    finally:
        api.close()
    state = ClusterSnapshot.from_objects(objects, source=f"the cluster ({server or 'kubeconfig / in-cluster'})",
                                      observed_at=datetime.now(UTC))
    # Listed, so read: an empty list still means "no CRD", unlike a recording without CRDs.
    return state if state.crds is not None else dataclasses.replace(state, crds=())


def load_recorded(path: Path) -> ClusterSnapshot:
    """A recorded state: YAML documents or Lists of the kinds the rules read, as observed now."""
    try:
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError) as err:
        raise GpugateError(f"--cluster-state {path}: {err}") from err
    return ClusterSnapshot.from_objects(documents, source=f"the recorded state {path}", observed_at=datetime.now(UTC))
