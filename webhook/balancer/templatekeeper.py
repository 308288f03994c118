"""Keeps the ResourceClaimTemplates that right-sizing through DRA references.

The webhook cannot create objects, and a pod cannot carry a claim inline; so a right-sized pod names
a template ``gpugate-rightsized-<hash>`` that may not exist in its namespace yet, labelled
``gpugate.io/claim-template`` with the template in the annotation of the same name
(webhook/kube/rightsizedclaims.py). This watches pending pods with that label and creates each
missing template in the pod's namespace; the controller manager's resourceclaim controller, which
retries a missing template, then makes the pod's claim and kube-scheduler allocates it.

Only the lease holder writes. A template is created once per namespace and never updated (its name
is the hash of its content); an AlreadyExists answer is success. The API server sends the create
through the gpugate webhook like any other template, so the policy's claim rules judge it.

A pod's author can write the label and the annotation too, with any template whose name is its
hash: the balancer would then create, with its own rights, whatever a pod describes. So it creates
only what gpugate itself wrote, recomputed: the webhook admits a ``gpugate-rightsized-*`` template
only when a pod that names it in ``spec.resourceClaims`` (set at the pod's creation, immutable, and
checked then against right-sizing) recomputes to exactly it under the current policies
(``webhook/admission/rightsizedtemplate.py``). A refusal (403) is logged with the webhook's reason
and counted in ``refused``, and not tried again before ``RECHECK_SECONDS``: it is a pod's doing,
not the balancer's failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import kubeclient, names
from webhook.balancer.cluster import Informer
from webhook.kube import rightsizedclaims
from webhook.kube.claims import Claim

log = logging.getLogger("gpugate.balancer.templates")
PENDING = "status.phase=Pending"
RECHECK_SECONDS = 300.0
"""A template made earlier is created again (a 409 if it is still there) after this long, so one
deleted by hand comes back for the next pod."""

Wanted = tuple[str, Claim] | None
"""(namespace, template) a pending pod needs, or None (no label, or a bad annotation)."""


def wanted(obj: dict[str, Any]) -> tuple[str, Wanted]:
    """The informer's reduction: pod key -> what it needs (a bad annotation is logged, not kept)."""
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    try:
        found = rightsizedclaims.wanted(obj)
    except rightsizedclaims.TemplateError as err:
        log.warning("pod names a claim template the balancer will not create", extra={"fields": {
            "pod": key, "error": str(err)}})
        return key, None
    return key, (str(meta.get("namespace")), found) if found is not None else None


class TemplateKeeper:
    """Creates the templates pending right-sized pods need; :meth:`run` blocks until ``stop``."""

    def __init__(self, api: client.ApiClient, *, informer_args: dict[str, Any], may_write: Callable[[], bool],
                 on_error: Callable[[str, BaseException], None], dra_served: Callable[[], bool | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._resource = client.ResourceV1Api(api)
        self._may_write = may_write
        self._dra_served = dra_served
        self._on_error = on_error
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, Wanted] = {}
        self._made: dict[tuple[str, str], float] = {}
        self._wake = threading.Event()
        self.created = 0
        self.refused = 0
        """Creates the gpugate webhook refused: a template no pod recomputes to (written by hand)."""
        self.informer = Informer[Wanted](
            name="rightsized-pods", list_call=client.CoreV1Api(api).list_pod_for_all_namespaces, reduce=wanted,
            on_replace=self._replace, on_event=self._event, field_selector=PENDING,
            label_selector=names.CLAIM_TEMPLATE_LABEL, **informer_args)

    def _replace(self, found: dict[str, Wanted]) -> None:
        with self._lock:
            self._pending = {k: v for k, v in found.items() if v is not None}
        self._wake.set()

    def _event(self, etype: str, key: str, value: Wanted) -> None:
        with self._lock:
            if etype == "DELETED" or value is None:
                self._pending.pop(key, None)
            else:
                self._pending[key] = value
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Once the cluster serves ``resource.k8s.io/v1`` (no template can exist before), watch and create."""
        while not stop.is_set() and not self._dra_served():
            stop.wait(1.0)
        if stop.is_set():
            return
        thread = threading.Thread(target=self.informer.run, args=(stop,), name="informer-rightsized-pods",
                                  daemon=True)
        thread.start()
        while not stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if stop.is_set() or not self.informer.synced.is_set() or not self._may_write():
                continue
            self.pass_once()

    def pass_once(self) -> int:
        """Create what pending pods need and was not made recently; returns how many were created."""
        now = self._clock()
        with self._lock:
            todo = {(ns, doc["metadata"]["name"]): (ns, doc) for ns, doc in
                    (v for v in self._pending.values() if v is not None)}
        made = 0
        for key, (namespace, document) in sorted(todo.items()):
            last = self._made.get(key)
            if last is not None and now - last < RECHECK_SECONDS:
                continue
            try:
                self._resource.create_namespaced_resource_claim_template(namespace, document)  # type: ignore[arg-type]
                made += 1
                log.info("created a right-sizing claim template", extra={"fields": {
                    "namespace": namespace, "template": key[1]}})
            except ApiException as err:
                if err.status == 403:
                    self.refused += 1
                    log.warning("the webhook refused a right-sizing claim template: no pod that names it "
                                "recomputes to it", extra={"fields": {"namespace": namespace, "template": key[1],
                                                                      "error": kubeclient.failure(err)}})
                elif err.status != 409:
                    self._on_error("claimtemplate.create", err)
                    continue
            self._made[key] = now
        self.created += made
        return made

    def close(self) -> None:
        self.informer.close()
