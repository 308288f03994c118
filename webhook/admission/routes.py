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
from webhook.admission import answers, framing, leanpath, metrics, requestbody, reviews, worker, workloads
from webhook.admission.inventoryfile import InventoryFile
from webhook.admission.results import CoreResult
from webhook.admission.serverstate import ClaimCore, Core, PolicyCore, ServerSettings, ServerState
from webhook.errors import BadReview, InputError
from webhook.kube import pods
from webhook.policy import PolicySet
from webhook.policy.store import PolicyStore

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
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
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
    lookup = None
    if settings.resolve_claims:
        from webhook.admission.claimlookup import ClaimLookup

        lookup = ClaimLookup.from_environment()
    claim_core = ClaimCore(lookup) if core is None else None  # a stub core (benchmarks) judges pods only
    app.extensions[EXTENSION] = ServerState(settings, store, core or PolicyCore(), inventory_file, claim_core)
    app.extensions[worker.LEAN_ROUTES] = lean_routes(app.extensions[EXTENSION])
    app.register_blueprint(blueprint)
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


@blueprint.get("/metrics")
def metrics_route() -> Response:
    body, content_type = metrics.exposition()
    return Response(body, 200, content_type=content_type)


@blueprint.post("/mutate")
def mutate_route() -> Response:
    return _admit("mutate")


@blueprint.post("/validate")
def validate_route() -> Response:
    return _admit("validate")


# --- the admission path ------------------------------------------------------------------------

_OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})


def _admit(endpoint: str) -> Response:
    """The Flask route: reads the body under the limit, then ``admit`` answers it."""
    started = time.perf_counter()
    st = state()
    limit = st.settings.max_body_bytes
    fields: dict[str, Any] = {"endpoint": endpoint}
    # Refuse on the declared length before buffering or parsing any of the body.
    if request.content_length is not None and request.content_length > limit:
        return requestbody.refuse(endpoint, 413, framing.too_large(limit, request.content_length), started, fields,
                                  drain=True)
    try:
        body = requestbody.read(limit)
    except Exception as err:  # the server's body reader refused a malformed (e.g. chunked) body
        return requestbody.refuse(endpoint, 400, f"malformed request body: {err or type(err).__name__}", started,
                                  fields)
    if body is None:  # a chunked body that grew past the limit
        return requestbody.refuse(endpoint, 413, framing.too_large(limit), started, fields, drain=True)
    status, body_out = admit(st, endpoint, body, started)
    return Response(body_out, status, content_type="application/json")


def lean_routes(st: ServerState) -> leanpath.LeanRoutes:
    """``POST /mutate`` and ``/validate`` for the worker's lean path (``worker.LEAN_ROUTES``): the
    request's whole body in, (status, JSON body) out, without Flask's request and response objects.
    Run by the worker's loop itself unless claims are read from the API (network I/O)."""

    def route(endpoint: str) -> leanpath.LeanRoute:
        def answer(body: bytes) -> tuple[int, bytes]:
            started = time.perf_counter()
            limit = st.settings.max_body_bytes
            if len(body) > limit:
                message = framing.too_large(limit, len(body))
                return 413, requestbody.refusal(endpoint, 413, message, started, {"endpoint": endpoint})
            return admit(st, endpoint, body, started)
        return answer

    return leanpath.LeanRoutes({"/mutate": route("mutate"), "/validate": route("validate")},
                               inline=st.claims is None or st.claims.lookup is None)


def admit(st: ServerState, endpoint: str, body: bytes, started: float) -> tuple[int, bytes]:
    """One review's answer from its body: (200, review) or (400, error); logged and counted."""
    try:
        review = reviews.decode(body)
    except BadReview as err:
        return 400, requestbody.refusal(endpoint, 400, str(err), started, {"endpoint": endpoint})

    try:
        decision = _decide(st, endpoint, review)
    except Exception as err:  # our own bug outside the core: still answer the review
        _server_log.exception("admission failed", extra={"fields": {"uid": review.uid}})
        decision = answers.internal_error(err, endpoint=endpoint, uid=review.uid, fail_closed=st.settings.fail_closed)
    try:
        body_out = reviews.encode(review, decision.answer)
    except (RecursionError, ValueError) as err:  # warnings or a patch we cannot serialize
        decision = answers.internal_error(err, endpoint=endpoint, uid=review.uid, fail_closed=st.settings.fail_closed)
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
    fail_closed = st.settings.fail_closed
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
        # Input we cannot read: the API server never sends such a pod (it decodes into typed
        # structs first), so this is a hand-made or hostile request. One line, no traceback.
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
