"""The balancer's DRA watches: ResourceSlices and ResourceClaims, when the cluster serves them.

Two ``cluster.Informer`` s, the same list-then-watch machinery as nodes and pods. Slices are
selected by ``spec.driver=gpu.nvidia.com`` on the server (a field selector the API server
supports for ResourceSlices), so other drivers' slices never reach us. Claims cannot be selected
by driver and are few next to pods; each is reduced at once to what it holds
(``dracount.reduce_claim``).

A cluster without ``resource.k8s.io/v1`` (before Kubernetes 1.34, or with the API turned off):
the group's discovery document answers 404. Then both caches are empty and count as synced, so
the balancer is ready and counts the device plugin only, as before; the probe is repeated every
``probe_interval`` seconds, and once the API appears the informers start (a cluster upgraded
under a running balancer starts counting DRA without a restart). Any other probe failure (a 403,
a timeout) is retried with the informers' backoff and keeps the balancer unready: a balancer that
cannot see claims would label DRA-held GPUs free.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.balancer.cluster import Informer
from webhook.kube import allocations, slices
from webhook.names import DRA_DRIVER
from webhook.placement import dracount

log = logging.getLogger("gpugate.balancer.dra")

DISCOVERY_PATH = "/apis/resource.k8s.io/v1"
SLICE_SELECTOR = f"spec.driver={DRA_DRIVER}"


def served(api: client.ApiClient) -> bool:
    """True when the API server serves ``resource.k8s.io/v1``; False on 404; raises otherwise."""
    method, url, headers, data, post = api.param_serialize(
        method="GET", resource_path=DISCOVERY_PATH, header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"])
    response = api.call_api(method, url, header_params=headers, body=data, post_params=post,
                            _request_timeout=(10, 30))
    response.read()
    if response.status == 404:
        return False
    if not 200 <= response.status < 300:
        raise ApiException(http_resp=response)
    return True


class DraWatch:
    """Runs the slice and claim informers once the API is there; empty and synced where it is not."""

    def __init__(self, api: client.ApiClient, *, informer_args: dict[str, Any],
                 on_slices: Callable[[dict[str, slices.Slice | None]], None],
                 on_slice: Callable[[str, str, slices.Slice | None], None],
                 on_claims: Callable[[dict[str, allocations.Claim | None]], None],
                 on_claim: Callable[[str, str, allocations.Claim | None], None],
                 probe_interval: float = 60.0) -> None:
        self._api = api
        self._probe_interval = probe_interval
        self._backoff = informer_args["backoff"]
        self._on_error = informer_args["on_error"]
        resource = client.ResourceV1Api(api)
        self.slices = Informer[slices.Slice | None](
            name="resourceslices", list_call=resource.list_resource_slice, reduce=dracount.reduce_slice,
            on_replace=on_slices, on_event=on_slice, field_selector=SLICE_SELECTOR, **informer_args)
        self.claims = Informer[allocations.Claim | None](
            name="resourceclaims", list_call=resource.list_resource_claim_for_all_namespaces,
            reduce=dracount.reduce_claim, on_replace=on_claims, on_event=on_claim, **informer_args)
        self._on_slices = on_slices
        self._on_claims = on_claims
        self.available: bool | None = None
        """None until the first probe answers; then whether the cluster serves resource.k8s.io/v1."""

    @property
    def synced(self) -> bool:
        return self.slices.synced.is_set() and self.claims.synced.is_set()

    def run(self, stop: threading.Event) -> None:
        """Probe until the API is served (or ``stop``), then run both informers until ``stop``."""
        while not stop.is_set():
            try:
                found = served(self._api)
            except Exception as err:
                self._on_error("resource.k8s.io.discovery", err)
                delay = self._backoff.next()
                log.warning("cannot tell whether the cluster serves resource.k8s.io/v1; retrying",
                            extra={"fields": {"error": f"{type(err).__name__}: {err}"[:300], "retry_in_s": delay}})
                stop.wait(delay)
                continue
            self._backoff.reset()
            if found:
                break
            if self.available is not False:
                log.info("no resource.k8s.io/v1 on this cluster: counting device-plugin GPUs only",
                         extra={"fields": {"probe_every_s": self._probe_interval}})
                self._on_slices({})
                self._on_claims({})
                self.slices.synced.set()
                self.claims.synced.set()
            self.available = False
            stop.wait(self._probe_interval)
        if stop.is_set():
            return
        if self.available is False:
            log.info("resource.k8s.io/v1 is served now: counting DRA devices")
        self.available = True
        claims_thread = threading.Thread(target=self.claims.run, args=(stop,), name="informer-resourceclaims",
                                         daemon=True)
        claims_thread.start()
        self.slices.run(stop)
        claims_thread.join(timeout=5)

    def close(self) -> None:
        self.slices.close()
        self.claims.close()
