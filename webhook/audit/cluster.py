"""The audit's edge: read what runs from the API server, write the PolicyReports back.

Raw JSON throughout (``_preload_content=False``): the client's models rename fields, and the
core judges objects as the API server stores them. A list's items carry no ``kind``, so it is set
from what was listed.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from webhook import kubeclient
from webhook.admission import workloads
from webhook.audit import findings
from webhook.errors import GpugateError

REPORT_GROUP, REPORT_VERSION = findings.REPORT_API_VERSION.split("/")
REPORT_PLURAL = "policyreports"
NO_CRD = ("the PolicyReport CRD (policyreports.wgpolicyk8s.io) is not installed: apply "
          "manifests/webhook/components/audit/policyreports-crd.yaml (or install Kyverno or Policy Reporter, "
          "which ship it), or leave out --write-reports")


def read(api: client.ApiClient, *, only: Sequence[str] = (), excluded: frozenset[str] = frozenset()
         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Namespace objects, pods and workloads) in the namespaces ``only`` names (all when empty),
    none in ``excluded``. A workload kind whose API is not served (JobSet without its CRD) is left out."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)

    def wanted(obj: dict[str, Any]) -> bool:
        namespace = (obj.get("metadata") or {}).get("namespace") or (obj.get("metadata") or {}).get("name")
        return namespace not in excluded and (not only or namespace in only)

    namespaces = [n for n in _items(kubeclient.call(lambda: core.list_namespace(_preload_content=False),
                                                     "list namespaces"), "v1", "Namespace") if wanted(n)]
    objects = [p for p in _items(kubeclient.call(lambda: core.list_pod_for_all_namespaces(_preload_content=False),
                                                 "list pods"), "v1", "Pod") if wanted(p)]
    for kind in workloads.WORKLOAD_KINDS:
        def listing(kind: workloads.WorkloadKind = kind) -> Any:
            return custom.list_cluster_custom_object(kind.group, kind.version, kind.resource, _preload_content=False)

        listed = kubeclient.call_unless_absent(listing, f"list {kind.resource}")
        if listed is not None:
            objects += [o for o in _items(listed, f"{kind.group}/{kind.version}", kind.kind) if wanted(o)]
    return namespaces, objects


def _items(response: Any, api_version: str, kind: str) -> list[dict[str, Any]]:
    return [{**item, "apiVersion": api_version, "kind": kind} for item in kubeclient.raw_json(response)["items"]]


def write(api: client.ApiClient, reports: Sequence[dict[str, Any]], *, scope: Sequence[str] = ()) -> int:
    """Create or replace each report; delete gpugate's reports in namespaces that have none now (in
    ``scope`` when it names namespaces). The number of objects written or deleted."""
    custom = client.CustomObjectsApi(api)
    written = 0
    for report in reports:
        written += _put(custom, report)
    keep = {r["metadata"]["namespace"] for r in reports}
    selector = ",".join(f"{k}={v}" for k, v in findings.MANAGED_BY.items())
    try:
        existing = kubeclient.raw_json(custom.list_cluster_custom_object(
            REPORT_GROUP, REPORT_VERSION, REPORT_PLURAL, label_selector=selector, _preload_content=False))["items"]
    except ApiException as err:
        raise _refusal(err, "list PolicyReports") from err
    for stale in existing:
        namespace = stale["metadata"]["namespace"]
        if stale["metadata"]["name"] == findings.REPORT_NAME and namespace not in keep \
                and (not scope or namespace in scope):
            def delete(namespace: str = namespace) -> Any:
                return custom.delete_namespaced_custom_object(REPORT_GROUP, REPORT_VERSION, namespace, REPORT_PLURAL,
                                                              findings.REPORT_NAME)

            kubeclient.call(delete, f"delete PolicyReport {namespace}/{findings.REPORT_NAME}")
            written += 1
    return written


def _put(custom: client.CustomObjectsApi, report: dict[str, Any]) -> int:
    namespace = report["metadata"]["namespace"]
    name = report["metadata"]["name"]
    try:
        current = kubeclient.raw_json(custom.get_namespaced_custom_object(
            REPORT_GROUP, REPORT_VERSION, namespace, REPORT_PLURAL, name, _preload_content=False))
    except ApiException as err:
        if err.status != 404 or _crd_missing(err):
            raise _refusal(err, f"read PolicyReport {namespace}/{name}") from err
        try:
            custom.create_namespaced_custom_object(REPORT_GROUP, REPORT_VERSION, namespace, REPORT_PLURAL,
                                                   kubeclient.body(report))
        except ApiException as created:
            raise _refusal(created, f"create PolicyReport {namespace}/{name}") from created
        return 1
    if _content(current) == _content(report):
        return 0  # unchanged: no write, so a resync of a quiet cluster costs reads only
    body = copy.deepcopy(report)
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    kubeclient.call(lambda: custom.replace_namespaced_custom_object(
        REPORT_GROUP, REPORT_VERSION, namespace, REPORT_PLURAL, name, kubeclient.body(body)),
        f"replace PolicyReport {namespace}/{name}")
    return 1


def _content(report: dict[str, Any]) -> Any:
    """What a report says, its results' timestamps aside (they would make every resync a write)."""
    results = [{k: v for k, v in r.items() if k != "timestamp"} for r in report.get("results") or []]
    return report.get("summary"), results


def _crd_missing(err: ApiException) -> bool:
    """A 404 for the resource type itself (no such API), not for one object of it."""
    details = kubeclient.status_of(err).get("details") or {}
    return err.status == 404 and not (isinstance(details, dict) and details.get("name"))


def _refusal(err: ApiException, what: str) -> GpugateError:
    if err.status == 404:
        return GpugateError(NO_CRD)
    return GpugateError(f"{what}: {kubeclient.failure(err)}")
