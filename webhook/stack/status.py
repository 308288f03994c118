"""What Git declares for the GPU stack, and (with ``--kube``) what the cluster reports.

The Git half reads files only. The cluster half is the kube edge: the real ``kubernetes`` client
lists ClusterPolicy, NVIDIADriver and GPU nodes as raw JSON (``_preload_content=False``, so no
snake_case model conversion), and ``summarize_cluster`` turns them into per-pool counts (pure).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from webhook.errors import GpugateError
from webhook.kubetarget import Target
from webhook.names import DRIVER_UPGRADE_STATE_LABEL, GPU_PRESENT_LABEL
from webhook.stack import manifests, site
from webhook.stack import matrix as matrix_data
from webhook.stack.clusterstate import pool_of_node
from webhook.stack.gitrepo import Repo
from webhook.stack.model import Stack

NO_STATE = "(none)"
UPGRADE_FAILED = "upgrade-failed"
"""The upgrade controller's terminal failure state (k8s-operator-libs pkg/upgrade consts.go). It is
written only on the node label and counted in gpu_operator_nodes_upgrades_failed: no ClusterPolicy
or NVIDIADriver condition says it (controllers/upgrade_controller.go writes none), so Argo CD cannot
show it and this status (and the dashboard) must."""


def git_status(path: Path) -> dict[str, Any]:
    """The declared stack plus drift between stack.yaml and the files derived from it."""
    repo: Repo | None
    try:
        repo = Repo(path)
        root = repo.root
    except GpugateError:
        repo, root = None, path
    stack = manifests.load_stack(root)
    files = manifests.read_files(root)
    try:
        drift = sorted(manifests.derive(stack, files))
        drift = [p for p in drift if p != manifests.STACK_FILE]
    except GpugateError as err:
        drift = [str(err)]
    settings = site.load(root)
    matrix = matrix_data.load()
    try:
        patches = [str(r.version) for r in matrix.newer_patches(stack.operator_version)]
    except GpugateError:
        patches = []
    out: dict[str, Any] = {
        "stackFile": manifests.STACK_FILE,
        "operator": {"chart": stack.chart, "version": str(stack.operator_version),
                     "repository": settings.chart_repo_url if settings else None,
                     "newerPatches": patches},
        "kubernetesVersion": f"1.{stack.kubernetes_minor}",
        "driverManagement": stack.management,
        "pools": [
            {"name": p.name, "nvidiaDriver": p.resource_name if stack.management == "nvidiadriver" else None,
             "default": p.default, "nodeSelector": dict(p.node_selector), "driver": p.driver,
             "driverType": p.driver_type, "usePrecompiled": p.use_precompiled,
             "migAndFullGPUs": p.mig_and_full_gpus, "newerDrivers": list(matrix.newer_drivers(p.driver))}
            for p in stack.pools
        ],
        "components": dict(stack.components),
        "outOfStep": drift,
    }
    if repo is not None:
        try:
            out["head"] = repo.head()
            out["stackCommits"] = [{"sha": c.sha, "action": c.action, "subject": c.subject}
                                   for c in repo.stack_commits(limit=50)[:5]]
            out["canaryDecisions"] = canary_decisions(repo)
        except GpugateError:
            out["stackCommits"] = []
    return out


def canary_decisions(repo: Repo, shown: int = 5) -> list[dict[str, str]]:
    """The newest canary decisions in Git (``gpugate stack canary --watch`` commits them with trailers)."""
    from webhook.stack.canarygit import canary_history

    return canary_history(repo, limit=200)[:shown]


def _list(list_call: Any, what: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]] | None:
    """Call a list API as raw JSON; None when the resource type is not served (404).

    A refusal or a server that does not answer is kubeclient's ClusterAPIError, worded as for
    every other command that talks to the cluster.
    """
    from webhook import kubeclient

    response = kubeclient.call_unless_absent(lambda: list_call(*args, _preload_content=False, **kwargs),
                                             f"listing {what}")
    if response is None:
        return None
    body = kubeclient.raw_json(response)
    return list(body.get("items") or [])


def _cluster_policies(custom: Any) -> list[dict[str, Any]] | None:
    return _list(custom.list_cluster_custom_object, "ClusterPolicies", "nvidia.com", "v1", "clusterpolicies")


def fetch_cluster(server: Target | str | None) -> dict[str, Any]:
    """List ClusterPolicies, NVIDIADrivers and GPU nodes with the real kubernetes client."""
    from kubernetes import client

    from webhook.kubeclient import api_client

    api = api_client(server)
    try:
        custom = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        return {
            "clusterPolicies": _cluster_policies(custom),
            "nvidiaDrivers": _list(custom.list_cluster_custom_object, "NVIDIADrivers", "nvidia.com", "v1alpha1",
                                   "nvidiadrivers"),
            "nodes": _list(core.list_node, "nodes", label_selector=f"{GPU_PRESENT_LABEL}=true") or [],
        }
    finally:
        api.close()


def fetch_cluster_policies(server: Target | str | None) -> list[dict[str, Any]]:
    """The ClusterPolicies only (what step 2 of the driver migration waits on); none when the CRD is not served."""
    from kubernetes import client

    from webhook.kubeclient import api_client

    api = api_client(server)
    try:
        return _cluster_policies(client.CustomObjectsApi(api)) or []
    finally:
        api.close()


def _conditions(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = obj.get("status") or {}
    return [{k: c.get(k) for k in ("type", "status", "reason", "message") if c.get(k) is not None}
            for c in status.get("conditions") or []]


def pool_of(node: Mapping[str, Any], stack: Stack) -> str:
    """The pool a GPU node belongs to (the operator's ownership rule, ``clusterstate.pool_of_node``)."""
    return pool_of_node((node.get("metadata") or {}).get("labels") or {}, stack)


def summarize_cluster(stack: Stack, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Per-object states and per-pool upgrade-state counts (pure)."""
    def objects(items: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if items is None:
            return None
        return [{"name": (o.get("metadata") or {}).get("name"),
                 "state": (o.get("status") or {}).get("state", "(no status)"),
                 "conditions": _conditions(o)} for o in items]

    pools: dict[str, Counter[str]] = {p.name: Counter() for p in stack.pools}
    nodes: dict[str, list[str]] = {p.name: [] for p in stack.pools}
    failed: dict[str, list[str]] = {p.name: [] for p in stack.pools}
    for node in raw.get("nodes") or []:
        pool = pool_of(node, stack)
        labels = (node.get("metadata") or {}).get("labels") or {}
        state = labels.get(DRIVER_UPGRADE_STATE_LABEL) or NO_STATE
        name = str((node.get("metadata") or {}).get("name") or "")
        pools[pool][state] += 1
        nodes[pool].append(name)
        if state == UPGRADE_FAILED:
            failed[pool].append(name)
    drivers = objects(raw.get("nvidiaDrivers"))
    by_cr = {d["name"]: d for d in drivers or []}
    return {
        "clusterPolicies": objects(raw.get("clusterPolicies")),
        "nvidiaDrivers": drivers,
        "pools": [
            {"name": p.name,
             "nvidiaDriver": ((by_cr.get(p.resource_name) or {}).get("state")
                              if stack.management == "nvidiadriver" else None),
             "nodes": sorted(n for n in nodes[p.name] if n),
             "upgradeStates": dict(sorted(pools[p.name].items())),
             "upgradeFailed": sorted(failed[p.name])}
            for p in stack.pools
        ],
        "upgradeFailed": sum(len(names) for names in failed.values()),
    }


def status(path: Path, *, kube: bool, server: Target | str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"git": git_status(path)}
    if kube:
        root = Repo(path).root if _is_git(path) else path
        stack = manifests.load_stack(root)
        out["cluster"] = summarize_cluster(stack, fetch_cluster(server))
        out["cluster"]["server"] = (server if isinstance(server, Target) else Target(server=server)).describe()
    return out


def _is_git(path: Path) -> bool:
    try:
        Repo(path)
    except GpugateError:
        return False
    return True
