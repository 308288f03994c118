"""The health loop's API calls: the ledger ConfigMap, DeviceTaintRules, node taints, validation pods,
evictions and Events. Every write asks ``may_write`` (the lease) right before it goes out (fencing).

Objects are sent and read as plain JSON (the client's models would drop fields it does not
know, and ``to_dict`` answers in snake_case). A conflict (409) is not an error: the ledger was
changed by someone else since it was read (an operator's ``gpugate health release``), and the
next pass starts from the new one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import kubeclient
from webhook.balancer.quarantineledger import KEY, Ledger, decode, encode
from webhook.balancer.quarantineplan import SELECTOR, VALIDATION_LABEL
from webhook.kube import devicetaints, timestamps

log = logging.getLogger("gpugate.balancer.health")

EVENT_NAMESPACE = "default"
"""Events about a Node (cluster-scoped) must live here (core/v1 Event validation), where
``kubectl describe node`` finds them."""
STRATEGIC = "application/strategic-merge-patch+json"


class NotLeader(Exception):
    """The lease was lost between the decision and a write: the pass stops."""


class HealthApi:
    def __init__(self, api: client.ApiClient, *, namespace: str, ledger_name: str,
                 may_write: Callable[[], bool], reporter: str) -> None:
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.namespace = namespace
        self.ledger_name = ledger_name
        self._may_write = may_write
        self._reporter = reporter

    def _fence(self) -> None:
        if not self._may_write():
            raise NotLeader("this replica no longer holds the lease")

    # ---- the ledger ---------------------------------------------------------------------------
    def read_ledger(self) -> tuple[Ledger, str | None]:
        """The ledger and its resourceVersion (None: no ConfigMap yet)."""
        try:
            found = kubeclient.raw_json(self.core.read_namespaced_config_map(
                self.ledger_name, self.namespace, _preload_content=False))
        except ApiException as err:
            if err.status == 404:
                return Ledger(), None
            raise
        where = f"ConfigMap {self.namespace}/{self.ledger_name}"
        return decode((found.get("data") or {}).get(KEY), where=where), found["metadata"]["resourceVersion"]

    def write_ledger(self, ledger: Ledger, version: str | None) -> bool:
        """Store ``ledger`` if the ConfigMap is still at ``version``; False on a conflict."""
        self._fence()
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": self.ledger_name, "namespace": self.namespace,
                                             "labels": {"app.kubernetes.io/managed-by": "gpugate-balancer"}},
                                "data": {KEY: encode(ledger)}}
        try:
            if version is None:
                self.core.create_namespaced_config_map(self.namespace, kubeclient.body(body))
            else:
                body["metadata"]["resourceVersion"] = version
                self.core.replace_namespaced_config_map(self.ledger_name, self.namespace, kubeclient.body(body))
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    # ---- DeviceTaintRules ---------------------------------------------------------------------
    def rules(self) -> dict[str, devicetaints.RuleView]:
        listed = kubeclient.raw_json(self.resource.list_device_taint_rule(label_selector=SELECTOR,
                                                                          _preload_content=False))
        return {v.name: v for v in (devicetaints.parse_rule(item) for item in listed.get("items") or ())}

    def apply_rule(self, wanted: devicetaints.DeviceTaintRuleWire, current: devicetaints.RuleView | None) -> None:
        """Create the rule, or replace it where its taint or annotations differ."""
        self._fence()
        if current is None:
            self.resource.create_device_taint_rule(kubeclient.body(dict(wanted)))
            return
        body: dict[str, Any] = dict(wanted)
        body["metadata"] = {**wanted["metadata"], "resourceVersion": current.resource_version}
        self.resource.replace_device_taint_rule(current.name, kubeclient.body(body))

    def delete_rule(self, name: str) -> None:
        self._fence()
        try:
            self.resource.delete_device_taint_rule(name)
        except ApiException as err:
            if err.status != 404:
                raise

    # ---- nodes ----------------------------------------------------------------------------------
    def set_node_taints(self, name: str, taints: list[dict[str, Any]], resource_version: str) -> None:
        """The node's whole taint list, if the node is still at ``resource_version`` (else 409)."""
        self._fence()
        self.core.patch_node(name, {"metadata": {"resourceVersion": resource_version}, "spec": {"taints": taints}},
                             _content_type=STRATEGIC)

    # ---- validation pods ----------------------------------------------------------------------
    def pod_phases(self) -> dict[str, str]:
        """Our validation pods in the namespace, by name, with their phase."""
        listed = kubeclient.raw_json(self.core.list_namespaced_pod(self.namespace, label_selector=VALIDATION_LABEL,
                                                                   _preload_content=False))
        return {p["metadata"]["name"]: (p.get("status") or {}).get("phase") or "Pending"
                for p in listed.get("items") or () if not p["metadata"].get("deletionTimestamp")}

    def create_validation(self, pod: dict[str, Any], claim: dict[str, Any] | None) -> None:
        self._fence()
        if claim is not None:
            try:
                self.resource.create_namespaced_resource_claim(self.namespace, kubeclient.body(claim))
            except ApiException as err:
                if err.status != 409:
                    raise
        self.core.create_namespaced_pod(self.namespace, kubeclient.body(pod))

    def delete_validation(self, name: str, *, claim: bool) -> None:
        """The pod, then its claim (the claim is released once no pod reserves it)."""
        self._fence()
        for delete in ([self.core.delete_namespaced_pod] +
                       ([self.resource.delete_namespaced_resource_claim] if claim else [])):
            try:
                delete(name, self.namespace, grace_period_seconds=0)
            except ApiException as err:
                if err.status != 404:
                    raise

    def validation_claims(self) -> set[str]:
        listed = kubeclient.raw_json(self.resource.list_namespaced_resource_claim(
            self.namespace, label_selector=VALIDATION_LABEL, _preload_content=False))
        return {c["metadata"]["name"] for c in listed.get("items") or ()}

    # ---- evictions and Events -----------------------------------------------------------------
    def evict(self, namespace: str, name: str) -> str:
        """Evict through the Eviction API: ``ok``, ``blocked`` (429: a PodDisruptionBudget) or ``gone``."""
        self._fence()
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        try:
            self.core.create_namespaced_pod_eviction(name, namespace, kubeclient.body(body))
        except ApiException as err:
            if err.status == 429:
                return "blocked"
            if err.status == 404:
                return "gone"
            raise
        return "ok"

    def event(self, node: str, reason: str, message: str, *, warning: bool, now: float) -> None:
        """An Event on the Node, as ``kubectl describe node`` shows it."""
        self._fence()
        stamp = timestamps.rfc3339(now)
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{node}.gpugate-health.", "namespace": EVENT_NAMESPACE},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
                "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
                "source": {"component": "gpugate-balancer"}, "reportingComponent": "gpugate-balancer",
                "reportingInstance": self._reporter[:128], "firstTimestamp": stamp, "lastTimestamp": stamp,
                "count": 1}
        self.core.create_namespaced_event(EVENT_NAMESPACE, kubeclient.body(body))
