"""The admission server: a Flask app factory and its routes.

``POST /mutate`` and ``POST /validate`` take an AdmissionReview v1 and always answer 200 with a
review, 400 with a message for a malformed one, or 413 for a body over the limit: never 5xx, and
no exception leaves a route (a crashing worker would cost the API server a timeout on every
request it was serving). State lives on the app (``app.extensions["gpugate"]``, a
``serverstate.ServerState``); a route takes one snapshot of the policy set, so a hot reload never
mixes two revisions in one answer. The core's typed result becomes the review's answer in one
place, ``answers.answer``, for both endpoints.

Errors are told apart in the log: input we cannot read (a field of the wrong type, nesting deeper
than any pod) is a one-line warning counted as ``result=invalid``; a traceback and ``result=error``
are for our own bugs only.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from webhook import logs
from webhook.admission import answers, budget, envelope, reviews, workloads
from webhook.admission.results import CoreResult
from webhook.errors import BadReview, InputError
from webhook.kube import pods
from webhook.policy import PolicySet
from webhook.policy.store import PolicyStore
from webhook.server import framing, metrics, requestbody, worker
from webhook.server.inventoryfile import InventoryFile
from webhook.server.serverstate import ClaimCore, Core, PolicyCore, ServerSettings, ServerState

EXTENSION = "gpugate"

_admission_log = logging.getLogger(logs.ADMISSION_LOGGER)
_server_log = logging.getLogger(logs.SERVER_LOGGER)


def _count_load(new: PolicySet, old: PolicySet | None) -> None:
    metrics.POLICY_RELOADS.inc()
    metrics.set_revision(new.revision, old.revision if old else None)


def create_app(settings: ServerSettings | None = None, *, core: Core | None = None) -> Flask:
    """Build the app; loads the policy folder once and starts watching it."""
    settings = settings or ServerSettings.from_env()
    app = Flask("gpugate")
    store = PolicyStore(
        settings.policy_dir,
        on_loaded=_count_load,
        on_refused=lambda message: metrics.POLICY_RELOAD_ERRORS.inc(),
        allow_empty=settings.allow_empty,
        snapshot_dir=settings.snapshot_dir,
    )
    store.check()
    store.start(settings.reload_interval)
    inventory_file = InventoryFile(settings.inventory_file, interval=max(settings.reload_interval, 0.1))
    lookup = pod_lookup = classes = None
    if settings.resolve_claims:
        from webhook.server.claimlookup import ClaimLookup
        from webhook.server.deviceclasswatch import DeviceClassWatch
        from webhook.server.podlookup import PodLookup

        lookup = ClaimLookup.from_environment()
        pod_lookup, classes = PodLookup(lookup.api), DeviceClassWatch.start(lookup.api)
    claim_core = ClaimCore(lookup, classes, pod_lookup) if core is None else None  # a stub core judges pods only
    app.extensions[EXTENSION] = ServerState(settings, store, core or PolicyCore(classes), inventory_file, claim_core)
    app.register_blueprint(blueprint)
    app.wsgi_app = admission_wsgi(app.extensions[EXTENSION], app.wsgi_app)  # type: ignore[method-assign]
    app.register_error_handler(HTTPException, _http_error)
    return app


def state() -> ServerState:
    return current_app.extensions[EXTENSION]


blueprint = Blueprint("gpugate", __name__)


@blueprint.get("/healthz")
def healthz() -> Response:
    return jsonify(ok=True)


@blueprint.get("/readyz")
def readyz() -> tuple[Response, int]:
    st = state()
    if request.environ.get(worker.DRAINING_KEY):
        # The pod is stopping: leave the Service's endpoints now, while in-flight work finishes.
        return jsonify(ready=False, reason="draining: this worker is shutting down"), 503
    current = st.store.current()
    if current is None:
        return jsonify(ready=False, reason=f"no valid policy set loaded from {st.store.directory}"), 503
    return jsonify(ready=True, revision=current.revision), 200


# --- the admission path ------------------------------------------------------------------------

_OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
ADMISSION_ENDPOINTS = {"/mutate": "mutate", "/validate": "validate"}
_STATUS = {200: "200 OK", 400: "400 Bad Request", 405: "405 Method Not Allowed", 413: "413 Payload Too Large"}


def admission_wsgi(st: ServerState, inner: Any) -> Any:
    """``POST /mutate`` and ``/validate`` as a plain WSGI app in front of Flask (``app.wsgi_app``).

    The API server calls these two the same way every time, and Flask's request context, URL map and
    request and response objects cost about 0.8 ms of CPU per review (``benchmarks/admission_load.py
    --profile``) for nothing they decide: the body goes to ``admit``
    (bytes in, status and JSON out) and the answer out, over HTTP/1.1 and HTTP/2 alike (gunicorn's
    ``wsgi.input`` decodes both). Every other path is Flask's.
    """

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        endpoint = ADMISSION_ENDPOINTS.get(environ.get("PATH_INFO", ""))
        if endpoint is None:
            return inner(environ, start_response)
        started = time.perf_counter()
        fields = {"endpoint": endpoint}
        limit = st.settings.max_body_bytes
        if environ.get("REQUEST_METHOD") != "POST":
            status, out = 405, requestbody.refusal(endpoint, 405, f"use POST {environ.get('PATH_INFO')}", started,
                                                   fields)
        else:
            body = requestbody.read(environ, limit)
            if body is None:
                status, out = 413, requestbody.refusal(endpoint, 413, framing.too_large(limit), started, fields)
            else:
                status, out = admit(st, endpoint, body, started)
        start_response(_STATUS[status], [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
        return [out]

    return app


def admit(st: ServerState, endpoint: str, body: bytes, started: float) -> tuple[int, bytes]:
    """One review's answer from its body: (200, review) or (400, error); logged and counted."""
    fail_closed = st.settings.fails_closed(endpoint)
    try:
        if budget.keys_over(body):  # counted on the bytes: decoding such a body is the cost itself
            raise _OverBudget(budget.over_reason())
        review = reviews.decode(body)
    except _OverBudget as over:
        salvaged = envelope.review(body)
        if salvaged is None:
            return 400, requestbody.refusal(endpoint, 400, str(over), started, {"endpoint": endpoint})
        review = salvaged
        decision = _unjudged(st, endpoint, review, str(over))
    except BadReview as err:
        # A review the API server sent but gpugate cannot decode (nested deeper than the decoder
        # goes) is still answered, by its uid: fail closed.
        salvaged = envelope.review(body) if isinstance(err, reviews.UndecodableBody) else None
        if salvaged is None:
            return 400, requestbody.refusal(endpoint, 400, str(err), started, {"endpoint": endpoint})
        review = salvaged
        decision = _unjudged(st, endpoint, review, str(err))
    else:
        try:
            decision = _decide(st, endpoint, review)
        except Exception as err:  # our own bug outside the core: still answer the review
            _server_log.exception("admission failed", extra={"fields": {"uid": review.uid}})
            decision = answers.internal_error(err, endpoint=endpoint, uid=review.uid, fail_closed=fail_closed)
    try:
        body_out = reviews.encode(review, decision.answer)
    except (RecursionError, ValueError) as err:  # warnings or a patch we cannot serialize
        decision = answers.internal_error(err, endpoint=endpoint, uid=review.uid, fail_closed=fail_closed)
        body_out = reviews.encode(review, decision.answer)
    duration = time.perf_counter() - started

    operation = review.operation if review.operation in _OPERATIONS else "other"  # bounded label values
    metrics.ADMISSIONS.labels(endpoint, operation, decision.policy, decision.result).inc()
    metrics.DURATION.labels(endpoint, decision.result, decision.policy.split("@", 1)[0]).observe(duration)
    if decision.patch_ops:
        metrics.PATCH_OPERATIONS.labels(decision.policy).inc(decision.patch_ops)
    obj = review.object if review.object is not None else {}
    logs.log_admission(_admission_log, {
        "uid": review.uid,
        "endpoint": endpoint,
        "operation": review.operation,
        "namespace": _namespace(review),
        "pod": pods.display_name(obj),
        "dry_run": review.dry_run,
        "policy": decision.policy,
        "revision": decision.revision,
        "patch_ops": decision.patch_ops,
        "result": decision.result,
        "duration_ms": round(duration * 1000, 3),
        **({"error": decision.error} if decision.error else {}),
    })
    return 200, body_out


class _OverBudget(Exception):
    """The review holds more than the core judges in time (``admission.budget``)."""


def _unjudged(st: ServerState, endpoint: str, review: reviews.Review, reason: str) -> answers.Decision:
    """The answer to a review whose body could not be decoded: what the webhook judges is refused
    (validation) or left unshaped (mutation), with the reason; anything else is let through."""
    workload = endpoint == "validate" and not review.sub_resource and review.operation in ("CREATE", "UPDATE") \
        and workloads.kind_of(review.kind.get("group", ""), str(review.kind.get("kind"))) is not None
    if not (review.is_claim() or workload or (review.is_pod() and review.operation == "CREATE")):
        return answers.SKIPPED
    logs.log_event(_server_log, "admission input refused", logging.WARNING, uid=review.uid, endpoint=endpoint,
                   error=reason)
    current = st.store.current()
    return answers.unreadable(reason, revision=current.revision if current else "",
                              fail_closed=st.settings.fails_closed(endpoint))


def _decide(st: ServerState, endpoint: str, review: reviews.Review) -> answers.Decision:
    claim = st.claims is not None and review.is_claim() and isinstance(review.object, dict) \
        and _claim_needs_judging(endpoint, review)
    workload = workloads.kind_of(review.kind.get("group", ""), str(review.kind.get("kind"))) \
        if endpoint == "validate" and not review.sub_resource else None
    if workload is not None and not workloads.needs_judging(workload, review.operation, review.object,
                                                            review.old_object):
        workload = None
    if not claim and workload is None and not (review.is_pod() and review.operation == "CREATE"
                                               and isinstance(review.object, dict)):
        # Registered for pod CREATE, claim and workload CREATE/UPDATE only; anything else passes untouched.
        return answers.SKIPPED
    fail_closed = st.settings.fails_closed(endpoint)
    policies = st.store.current()
    if policies is None:
        return answers.internal_error(RuntimeError(f"no valid policy set loaded from {st.store.directory}"),
                                      endpoint=endpoint, uid=review.uid, fail_closed=fail_closed)
    obj = review.object
    assert obj is not None  # checked above
    namespace = _namespace(review)
    try:
        if workload is not None:  # its pod templates, judged as the pods they become
            result: CoreResult = workloads.judge(workload, obj, namespace=namespace, policies=policies,
                                                 inventory=st.inventory.current(), now=datetime.now(UTC))
        else:
            result = _judge(st, endpoint, obj, namespace, policies, claim=claim)
        return answers.answer(result, revision=policies.revision, subject=obj)
    except (InputError, RecursionError) as err:
        # Input we cannot read (a field of the wrong type, absurd nesting, a claim the pod names that
        # cannot be read in time). One line, no traceback; validation refuses it.
        reason = str(err) if isinstance(err, InputError) else "the pod is nested deeper than any Kubernetes object"
        logs.log_event(_server_log, "admission input refused", logging.WARNING, uid=review.uid,
                       endpoint=endpoint, error=reason)
        return answers.unreadable(reason, revision=policies.revision, fail_closed=fail_closed)
    except Exception as err:
        _server_log.exception("policy core failed", extra={"fields": {"uid": review.uid, "endpoint": endpoint}})
        return answers.internal_error(err, endpoint=endpoint, uid=review.uid, revision=policies.revision,
                                      fail_closed=fail_closed)


def _judge(st: ServerState, endpoint: str, obj: dict[str, Any], namespace: str, policies: PolicySet, *,
           claim: bool) -> CoreResult:
    """The core's result on ``obj``: a claim's from the DRA core; a pod's from the pod core, with the
    claims it references when the lookup reads them (``max`` per pod, shaping a claim-only pod)."""
    claims = st.claims
    if claims is not None and claim:
        if endpoint == "mutate":
            return claims.mutate_claim(obj, namespace=namespace, policies=policies)
        return claims.validate_claim(obj, namespace=namespace, policies=policies)
    inventory = st.inventory.current()
    if endpoint == "mutate":
        resolved = claims.resolved(obj, namespace) if claims is not None else None
        if claims is not None and resolved is not None:
            return claims.mutate_pod(obj, namespace=namespace, policies=policies, inventory=inventory,
                                     now=datetime.now(UTC), resolved=resolved)
        return st.core.mutate(obj, namespace=namespace, policies=policies, inventory=inventory, now=datetime.now(UTC))
    verdict = st.core.validate(obj, namespace=namespace, policies=policies, inventory=inventory, now=datetime.now(UTC))
    resolved = claims.resolved(obj, namespace) if claims is not None else None
    if claims is None or resolved is None:
        return verdict
    return claims.add_pod_claims(verdict, obj, namespace=namespace, policies=policies, resolved=resolved)


def _claim_needs_judging(endpoint: str, review: reviews.Review) -> bool:
    """A claim's CREATE, and an UPDATE that changes its spec (validation only). A claim's spec is
    immutable once stored, so an UPDATE is metadata (the resourceclaim controller's finalizer, added
    and removed around a pod's life): judging it could only ever block a deletion, never a GPU."""
    if review.operation == "CREATE":
        return True
    if review.operation != "UPDATE" or endpoint != "validate" or review.object is None:
        return False
    old = review.old_object
    return old is None or old.get("spec") != review.object.get("spec")


def _namespace(review: reviews.Review) -> str:
    """The request's namespace: ``object.metadata.namespace`` is empty before 1.24 and on many CREATEs."""
    if review.namespace:
        return review.namespace
    obj = review.object if isinstance(review.object, dict) else {}
    return str(pods.metadata(obj).get("namespace") or "default")


def _http_error(err: HTTPException) -> Response:
    """404/405/413 raised by Flask itself answer JSON, like our own refusals."""
    response = jsonify(error=err.description, code=err.code)
    response.status_code = err.code or 400
    return response
