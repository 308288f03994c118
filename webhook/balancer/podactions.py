"""The writes idle reclaim makes, and nothing else: an Event, the idle annotation, an eviction.

- An eviction goes through the Eviction API (``pods/eviction``), never a delete: the API server
  checks PodDisruptionBudgets and answers 429 when one allows no disruption now
  (``pkg/registry/core/pod/storage/eviction.go``). It names the pod's UID as a precondition, so a
  pod recreated under the same name since the measurement is never the one evicted (409).
- The annotation is written with a JSON merge patch of ``metadata.annotations`` (``null`` removes
  it): no resourceVersion, nothing else of the pod touched.
- Events are ``core/v1`` Events on the pod (``kubectl describe pod`` shows them; they outlive an
  evicted pod for the API server's event TTL, an hour by default).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import kubeclient, names
from webhook.kube import timestamps
from webhook.usage.workloads import PodRecord

log = logging.getLogger("gpugate.balancer.idle")

COMPONENT = "gpugate-balancer"
MERGE_PATCH = "application/merge-patch+json"
MESSAGE_LIMIT = 1024
EvictResult = Literal["ok", "pdb", "gone", "error"]


class PodActions:
    """Writes through one API client; each method raises nothing (a failure is logged and answered)."""

    def __init__(self, api: client.ApiClient, *, identity: str, clock: Callable[[], float]) -> None:
        self._core = client.CoreV1Api(api)
        self._identity = identity or COMPONENT
        self._clock = clock

    def event(self, record: PodRecord, reason: str, message: str, *, warning: bool = False) -> bool:
        """One Event on the pod; False when it could not be written."""
        stamp = timestamps.rfc3339(self._clock())
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{record.name}.", "namespace": record.namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": record.name,
                                   "namespace": record.namespace, "uid": record.uid},
                "reason": reason, "message": message[:MESSAGE_LIMIT], "type": "Warning" if warning else "Normal",
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
                "reportingInstance": self._identity[:128], "firstTimestamp": stamp, "lastTimestamp": stamp,
                "count": 1}
        try:
            self._core.create_namespaced_event(record.namespace, body,  # type: ignore[arg-type]  # a dict is sent as is
                                              _request_timeout=(10, 30))
        except (ApiException, OSError) as err:
            log.warning("cannot write an Event", extra={"fields": {"pod": record.key, "reason": reason,
                                                                   "error": kubeclient.failure(err)}})
            return False
        return True

    def annotate(self, record: PodRecord, note: str | None) -> bool:
        """Set (or, with None, remove) the idle annotation; False when the patch failed."""
        body = {"metadata": {"annotations": {names.IDLE_ANNOTATION: note}}}
        try:
            self._core.patch_namespaced_pod(record.name, record.namespace, body, _content_type=MERGE_PATCH,
                                            _request_timeout=(10, 30))
        except (ApiException, OSError) as err:
            if isinstance(err, ApiException) and err.status == 404:
                return False
            log.warning("cannot annotate a pod", extra={"fields": {"pod": record.key,
                                                                    "error": kubeclient.failure(err)}})
            return False
        return True

    def evict(self, record: PodRecord) -> EvictResult:
        """Ask the Eviction API; ``pdb`` when a PodDisruptionBudget refused (429), ``gone`` when the pod
        (with this UID) is no longer there."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": record.name, "namespace": record.namespace},
                "deleteOptions": {"preconditions": {"uid": record.uid}}}
        try:
            self._core.create_namespaced_pod_eviction(record.name, record.namespace,
                                                      body, _request_timeout=(10, 30))  # type: ignore[arg-type]
        except ApiException as err:
            if err.status == 429:
                return "pdb"
            if err.status in (404, 409):
                return "gone"
            log.warning("eviction failed", extra={"fields": {"pod": record.key, "error": kubeclient.failure(err)}})
            return "error"
        except OSError as err:
            log.warning("eviction failed", extra={"fields": {"pod": record.key, "error": str(err)}})
            return "error"
        return "ok"
