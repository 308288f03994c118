"""Read the ResourceClaims and templates a pod references, for ``max`` per pod (the edge; optional).

The webhook has no API access by default: a pod's admission request carries only the claims'
names. With ``gpugate serve --resolve-claims`` (a service account that may get
``resourceclaims`` and ``resourceclaimtemplates``, or a KUBECONFIG) the server reads each
referenced object once per pod and hands what it read to the pure core as data
(``admission.dra.validate_pod_claims``).

Reads fail closed and stay inside the review's time: all of a pod's references are read at once,
under one deadline shared by the review (well under the webhook's ``timeoutSeconds``), each with
no retry (the ``kubernetes`` client's urllib3 pool retries a failed read three times by default:
one slow read once cost 6 s, past the API server's 5 s timeout), and each answer is capped in
size. A reference that is absent (404) is not counted: the claim is judged when it is created. A
reference that cannot be read (the deadline, an error, an answer too large or too deeply nested to
decode, more references than are read) raises ``ClaimReadError``, and the server refuses the pod
with that reason: a pod whose claims gpugate cannot see is a pod it cannot judge.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import Any

import orjson
import urllib3

from webhook import kubeclient
from webhook.errors import InputError
from webhook.kube import claims, demand
from webhook.kube.claims import ClaimAsk

READ_SECONDS = 2.0
"""The time all claim reads of one review share, from the review's start: the API server's call
times out after ``timeoutSeconds`` (5 in the shipped configurations), and the refusal must reach it first."""
MAX_CLAIM_BYTES = 1024 * 1024
"""The largest claim or template answer read; a larger one is not a claim gpugate can judge (a real one
is a few KB). Bounds what a tenant's claims can cost the webhook's memory per read."""
MAX_REFERENCES = 128
"""Kubernetes' own limit on a pod's ``spec.resourceClaims``; a pod naming more is refused."""
CONCURRENT_READS = 8
"""Reads in flight at once per worker process."""

_PLURAL = {claims.CLAIM_KIND: "resourceclaims", claims.TEMPLATE_KIND: "resourceclaimtemplates"}


class ClaimReadError(InputError):
    """A claim or template a pod references could not be read in time; the pod cannot be judged."""


class ClaimLookup:
    """GETs of ``resource.k8s.io/v1`` claims and templates through one ApiClient's connection pool."""

    def __init__(self, api: Any, *, read_seconds: float = READ_SECONDS, max_bytes: int = MAX_CLAIM_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self.read_seconds = read_seconds
        self._max_bytes = max_bytes
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=CONCURRENT_READS, thread_name_prefix="claim-read")

    @property
    def api(self) -> Any:
        """The ApiClient, shared with the other reads of the same account (pods, DeviceClasses)."""
        return self._api

    @classmethod
    def from_environment(cls) -> ClaimLookup:
        """In-cluster service account, else KUBECONFIG (``kubeclient.api_client``)."""
        return cls(kubeclient.api_client())

    def resolve(self, pod: dict[str, Any], namespace: str,
                deadline: float | None = None) -> dict[tuple[str, str], ClaimAsk]:
        """What each claim and template ``pod`` references asks, read by ``deadline`` (monotonic; by
        default ``read_seconds`` from now). Absent ones are left out; ClaimReadError for the rest."""
        deadline = self._clock() + self.read_seconds if deadline is None else deadline
        keys = list(dict.fromkeys(ref.key for ref in demand.claim_refs(pod) if ref.key is not None))
        if len(keys) > MAX_REFERENCES:
            raise ClaimReadError(f"the pod names {len(keys)} claims and templates; gpugate reads at most "
                                 f"{MAX_REFERENCES} (Kubernetes' own limit)")
        reads: dict[tuple[str, str], Future[dict[str, Any] | None]] = {
            key: self._pool.submit(self.get, key[0], key[1], namespace, deadline) for key in keys}
        wait_all(reads.values(), timeout=max(deadline - self._clock(), 0.0))
        out: dict[tuple[str, str], ClaimAsk] = {}
        for (kind, name), read in reads.items():
            if not read.done():
                read.cancel()
                raise ClaimReadError(f"reading {kind} {namespace}/{name} took longer than {self.read_seconds:g} s")
            document = read.result()  # raises ClaimReadError
            if document is None:
                continue
            try:
                out[(kind, name)] = claims.parse(document)
            except claims.ClaimError as err:
                raise ClaimReadError(f"{kind} {namespace}/{name} cannot be read: {err}") from err
        return out

    def get(self, kind: str, name: str, namespace: str, deadline: float) -> dict[str, Any] | None:
        """The object's JSON, None when it is absent (404); ClaimReadError when it cannot be read."""
        what = f"{kind} {namespace}/{name}"
        _, url, headers, _, _ = self._api.param_serialize(
            method="GET", resource_path=f"/apis/{claims.API_VERSION}/namespaces/{{namespace}}/{_PLURAL[kind]}/{{name}}",
            path_params={"namespace": namespace, "name": name}, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        left = deadline - self._clock()
        if left <= 0:
            raise ClaimReadError(f"reading {what} took longer than {self.read_seconds:g} s")
        try:
            response = self._api.rest_client.pool_manager.request(
                "GET", url, headers=headers, retries=False, preload_content=False,
                timeout=urllib3.Timeout(connect=left, read=left))
            try:
                if response.status == 404:
                    return None
                body = self._read_capped(response, what, deadline)
            finally:
                response.release_conn()
        except urllib3.exceptions.HTTPError as err:
            raise ClaimReadError(f"reading {what} failed: {kubeclient.failure(err)}") from err
        except OSError as err:
            raise ClaimReadError(f"reading {what} failed: {err}") from err
        if not 200 <= response.status < 300:
            raise ClaimReadError(f"reading {what}: the API server answered {response.status}")
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise ClaimReadError(f"{what} cannot be decoded ({err})") from err
        if not isinstance(document, dict):
            raise ClaimReadError(f"{what} is not a JSON object")
        return document

    def _read_capped(self, response: Any, what: str, deadline: float) -> bytes:
        parts: list[bytes] = []
        size = 0
        for chunk in response.stream(65536):
            size += len(chunk)
            if size > self._max_bytes:
                raise ClaimReadError(f"{what} is larger than the {self._max_bytes} bytes gpugate reads of a claim")
            if self._clock() > deadline:
                raise ClaimReadError(f"reading {what} took longer than {self.read_seconds:g} s")
            parts.append(chunk)
        return b"".join(parts)
