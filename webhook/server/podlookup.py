"""Read the pods a new ResourceClaim serves, to judge it with them (the edge; with ``--resolve-claims``).

A claim's admission request carries the claim, not the pods that will use it. Two reads give them
to the pure core (``admission.dra.ClaimContext``):

- the pod a claim names as its controlling owner, by name (kube-scheduler's claim for a pod's
  extended resources, and the resourceclaim controller's claim made from a template): its UID is
  then compared with the owner reference, since owner references are not authenticated;
- the live pods of the namespace that reference the claim (or a right-sized template) by name,
  by listing the namespace's pods in pages.

Both are bounded (short timeouts, at most ``MAX_PAGES`` pages) and raise ClusterAPIError when they
cannot answer, which the caller turns into a refusal: a claim that cannot be judged with its pods
is not admitted.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import orjson
from kubernetes import client

from webhook import kubeclient
from webhook.errors import ClusterAPIError
from webhook.kube import demand as kube_demand
from webhook.kube import pods

TIMEOUT_SECONDS = (1.0, 2.0)
"""(connect, read) per request: the API server's call to the webhook times out after 5 s in all."""
PAGE_SIZE = 500
MAX_PAGES = 20
"""At most this many pages (10,000 pods) are read for one claim; a larger namespace cannot be judged."""
TERMINAL = ("Succeeded", "Failed")


class PodLookup:
    """GET and LIST of ``v1`` pods through one ApiClient."""

    def __init__(self, api: Any) -> None:
        self._core: Any = client.CoreV1Api(api)  # raw answers (_preload_content=False), not models

    def get(self, namespace: str, name: str) -> pods.Pod | None:
        """The pod's JSON, or None when it does not exist; ClusterAPIError when it cannot be read."""
        response = kubeclient.call_unless_absent(
            lambda: self._core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                   _request_timeout=TIMEOUT_SECONDS),
            f"get pod {namespace}/{name}")
        if response is None:
            return None
        found = orjson.loads(response.data)
        return found if isinstance(found, dict) else None

    def naming(self, namespace: str, key: tuple[str, str]) -> list[pods.Pod]:
        """The namespace's pods, not finished, that reference ``key`` ((kind, name) of a claim or
        template) in ``spec.resourceClaims``; ClusterAPIError when the list cannot be read whole."""
        found: list[pods.Pod] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            kwargs: dict[str, Any] = {"limit": PAGE_SIZE, "_preload_content": False,
                                      "_request_timeout": TIMEOUT_SECONDS}
            if token:
                kwargs["_continue"] = token
            response: Any = kubeclient.call(partial(self._core.list_namespaced_pod, namespace, **kwargs),
                                            f"list pods in {namespace}")
            page = orjson.loads(response.data)
            for pod in page.get("items") or ():
                if isinstance(pod, dict) and _live(pod) and any(r.key == key for r in kube_demand.claim_refs(pod)):
                    found.append(pod)
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return found
        raise ClusterAPIError(f"list pods in {namespace}: more than {MAX_PAGES * PAGE_SIZE} pods, not read whole")


def _live(pod: pods.Pod) -> bool:
    status = pod.get("status")
    return not (isinstance(status, dict) and status.get("phase") in TERMINAL)
