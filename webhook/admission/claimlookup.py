"""Read the ResourceClaims and templates a pod references, for ``max`` per pod (the edge; optional).

The webhook has no API access by default: a pod's admission request carries only the claims'
names. With ``gpugate serve --resolve-claims`` (a service account that may get
``resourceclaims`` and ``resourceclaimtemplates``, or a KUBECONFIG) the validating endpoint reads
each referenced object once per pod, with a short timeout, and hands what it read to the pure
core as data (``admission.dra.validate_pod_claims``). A reference it cannot read (absent yet,
forbidden, the API slow) is not counted and says so in a log line: the claim itself was judged
when it was created, so a missing read weakens only the per-pod sum, never a per-claim rule.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.rest import ApiException

from webhook import kubeclient, logs
from webhook.errors import ClusterAPIError
from webhook.kube import claims, demand
from webhook.kube.claims import ClaimAsk

_log = logging.getLogger(logs.SERVER_LOGGER)

TIMEOUT_SECONDS = (1.0, 1.5)
"""(connect, read) per GET: the API server's call to the webhook times out after 5 s in all."""
MAX_REFERENCES = 32
"""A pod lists at most this many claims that are read; more are not counted (Kubernetes allows 128)."""

_PLURAL = {claims.CLAIM_KIND: "resourceclaims", claims.TEMPLATE_KIND: "resourceclaimtemplates"}


class ClaimLookup:
    """GETs of ``resource.k8s.io/v1`` claims and templates through one ApiClient."""

    def __init__(self, api: Any) -> None:
        self._api = api

    @property
    def api(self) -> Any:
        """The ApiClient, shared with the other reads of the same account (pods, DeviceClasses)."""
        return self._api

    @classmethod
    def from_environment(cls) -> ClaimLookup:
        """In-cluster service account, else KUBECONFIG (``kubeclient.api_client``)."""
        return cls(kubeclient.api_client())

    def resolve(self, pod: dict[str, Any], namespace: str) -> dict[tuple[str, str], ClaimAsk]:
        out: dict[tuple[str, str], ClaimAsk] = {}
        for ref in demand.claim_refs(pod)[:MAX_REFERENCES]:
            if ref.key is None or ref.key in out:
                continue
            document = self.get(ref.key[0], ref.key[1], namespace)
            if document is not None:
                try:
                    out[ref.key] = claims.parse(document)
                except claims.ClaimError as err:  # the API server stored it, so this is our gap, not the user's
                    logs.log_event(_log, "claim unreadable", logging.WARNING, kind=ref.key[0], name=ref.key[1],
                                   error=str(err))
        return out

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        """The object's JSON, or None when it is absent or cannot be read (logged)."""
        method, url, headers, data, post = self._api.param_serialize(
            method="GET", resource_path=f"/apis/{claims.API_VERSION}/namespaces/{{namespace}}/{_PLURAL[kind]}/{{name}}",
            path_params={"namespace": namespace, "name": name}, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])

        def fetch() -> Any:
            response = self._api.call_api(method, url, header_params=headers, body=data, post_params=post,
                                          _request_timeout=TIMEOUT_SECONDS)
            response.read()
            if not 200 <= response.status < 300:
                raise ApiException(http_resp=response)
            return response

        try:
            response = kubeclient.call_unless_absent(fetch, f"get {kind} {namespace}/{name}")
        except ClusterAPIError as err:
            logs.log_event(_log, "claim lookup failed", logging.WARNING, kind=kind, name=name, namespace=namespace,
                           error=str(err))
            return None
        if response is None:
            return None
        document = kubeclient.raw_json(response)
        return document if isinstance(document, dict) else None
