"""The admission server: a Flask app factory, its routes and its per-app state.

``POST /mutate`` and ``POST /validate`` take an AdmissionReview v1 and always answer 200 with a
review, 400 with a message for a malformed one, or 413 for a body over the limit: never 5xx, and
no exception leaves a route (a crashing worker would cost the API server a timeout on every
request it was serving). State lives on the app (``app.extensions["gpugate"]``); a route takes
one snapshot of the policy set, so a hot reload never mixes two revisions in one answer.

Settings come from the caller (``gpugate serve``) or, for ``gunicorn 'webhook.admission.routes:create_app()'``,
from ``GPUGATE_*`` variables read once in ``ServerSettings.from_env``. The policy core is passed in
(``Core``): the real one by default, a stub in the benchmark that measures what the server alone costs.

Errors are told apart in the log: input we cannot read (a field of the wrong type, nesting deeper
than any pod) is a one-line warning counted as ``result=invalid``; a traceback and ``result=error``
are for our own bugs only.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import orjson
from flask import Blueprint, Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from webhook import logs
from webhook.admission import leanpath, metrics, patchcheck, reviews, worker
from webhook.admission.inventoryfile import InventoryFile
from webhook.errors import BadReview, InputError
from webhook.kube import demand as kube_demand
from webhook.kube import pods
from webhook.kube.inventory import Inventory
from webhook.policy import PolicySet
from webhook.policy.store import PolicyStore

MAX_BODY_BYTES = 3 * 1024 * 1024
# How much of an over-limit body is read and dropped so the client can see its 413.
DRAIN_LIMIT_BYTES = 16 * 1024 * 1024
EXTENSION = "gpugate"

_admission_log = logging.getLogger(logs.ADMISSION_LOGGER)
_server_log = logging.getLogger(logs.SERVER_LOGGER)


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    policy_dir: Path = Path("policies")
    """The folder of GPUPolicy files; watched for changes."""
    fail_closed: bool = False
    """On an internal error, deny instead of admitting unchanged. Off by default: a bug in gpugate
    must not stop every pod in the cluster (the API server rejects on a failed call anyway when
    the webhook configuration says failurePolicy: Fail)."""
    reload_interval: float = 1.0
    """Seconds between two looks at the policy folder; 0 disables hot reload."""
    max_body_bytes: int = MAX_BODY_BYTES
    """The API server sends at most ~3 MiB objects (etcd's request limit); more is not a review."""
    allow_empty: bool = False
    """Serve a folder without any policy. Off: an emptied folder would silently lift every deny rule."""
    snapshot_dir: Path | None = None
    """Where the last accepted policy files are kept for sibling workers (gpugate serve sets it)."""
    inventory_file: Path | None = None
    """The balancer's GPUInventory (the gpugate-inventory ConfigMap, mounted); optional."""
    resolve_claims: bool = False
    """Read the ResourceClaims and ResourceClaimTemplates a pod references from the API (in-cluster
    service account or KUBECONFIG), so ``max`` per pod counts their devices. Off: the webhook has no
    API access, and a pod's claims are judged one by one when each is created."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ServerSettings:
        env = os.environ if environ is None else environ
        truthy = {"1", "true", "yes", "on"}
        snapshot = env.get("GPUGATE_POLICY_SNAPSHOT_DIR")
        inventory_file = env.get("GPUGATE_INVENTORY")
        return cls(
            policy_dir=Path(env.get("GPUGATE_POLICIES", "policies")),
            fail_closed=env.get("GPUGATE_FAIL_CLOSED", "").lower() in truthy,
            reload_interval=float(env.get("GPUGATE_RELOAD_INTERVAL", "1.0")),
            allow_empty=env.get("GPUGATE_ALLOW_EMPTY_POLICIES", "").lower() in truthy,
            snapshot_dir=Path(snapshot) if snapshot else None,
            inventory_file=Path(inventory_file) if inventory_file else None,
            resolve_claims=env.get("GPUGATE_RESOLVE_CLAIMS", "").lower() in truthy,
        )


class Core(Protocol):
    """The policy core the routes call: ``mutation.mutate`` and ``validation.validate``."""

    def mutate(self, pod: dict[str, Any], *, namespace: str, policies: PolicySet, inventory: Inventory,
               now: datetime) -> Any: ...

    def validate(self, pod: dict[str, Any], *, namespace: str, policies: PolicySet, inventory: Inventory,
                 now: datetime) -> Any: ...


class PolicyCore:
    """The real core, imported when the app is built (so a broken core still lets /healthz answer)."""

    def __init__(self) -> None:
        from webhook.admission import mutation, validation

        self._mutate, self._validate = mutation.mutate, validation.validate

    def mutate(self, pod: dict[str, Any], *, namespace: str, policies: PolicySet, inventory: Inventory,
               now: datetime) -> Any:
        return self._mutate(pod, namespace=namespace, policies=policies, inventory=inventory, now=now)

    def validate(self, pod: dict[str, Any], *, namespace: str, policies: PolicySet, inventory: Inventory,
                 now: datetime) -> Any:
        return self._validate(pod, namespace=namespace, policies=policies, inventory=inventory, now=now)


class ClaimCore:
    """The DRA half of the core (``admission.dra``): claims, templates and the pods that use them."""

    def __init__(self, lookup: Any = None) -> None:
        from webhook.admission import dra, mutation

        self.dra = dra
        self.mutation = mutation
        self.lookup = lookup
        """A ``claimlookup.ClaimLookup`` when ``resolve_claims`` is on, else None."""

    def resolving(self, pod: dict[str, Any]) -> bool:
        """The pod references claims and the lookup is on: read them for the core."""
        return self.lookup is not None and bool(kube_demand.claim_refs(pod))


@dataclass(frozen=True)
class ServerState:
    settings: ServerSettings
    store: PolicyStore
    core: Core
    inventory: InventoryFile
    claims: ClaimCore | None = None


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

@dataclass
class _Outcome:
    answer: reviews.Answer
    result: str
    policy: str = ""
    revision: str = ""
    patch_ops: int = 0
    error: str = ""


def _admit(endpoint: str) -> Response:
    """The Flask route: reads the body under the limit, then ``admit`` answers it."""
    started = time.perf_counter()
    st = state()
    limit = st.settings.max_body_bytes
    fields: dict[str, Any] = {"endpoint": endpoint}
    # Refuse on the declared length before buffering or parsing any of the body.
    if request.content_length is not None and request.content_length > limit:
        return _refuse(endpoint, 413, f"body of {request.content_length} bytes exceeds the {limit}-byte limit",
                       started, fields, drain=True)
    try:
        body = _read_body(limit)
    except Exception as err:  # the server's body reader refused a malformed (e.g. chunked) body
        return _refuse(endpoint, 400, f"malformed request body: {err or type(err).__name__}", started, fields)
    if body is None:  # a chunked body that grew past the limit
        return _refuse(endpoint, 413, f"body exceeds the {limit}-byte limit", started, fields, drain=True)
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
                message = f"body of {len(body)} bytes exceeds the {limit}-byte limit"
                return 413, _refusal(endpoint, 413, message, started, {"endpoint": endpoint})
            return admit(st, endpoint, body, started)
        return answer

    return leanpath.LeanRoutes({"/mutate": route("mutate"), "/validate": route("validate")},
                               inline=st.claims is None or st.claims.lookup is None)


def admit(st: ServerState, endpoint: str, body: bytes, started: float) -> tuple[int, bytes]:
    """One review's answer from its body: (200, review) or (400, error); logged and counted."""
    try:
        review = reviews.decode(body)
    except BadReview as err:
        return 400, _refusal(endpoint, 400, str(err), started, {"endpoint": endpoint})

    try:
        outcome = _decide(st, endpoint, review)
    except Exception as err:  # our own bug outside the core: still answer the review
        _server_log.exception("admission failed", extra={"fields": {"uid": review.uid}})
        outcome = _internal_error(st, endpoint, review, err)
    try:
        body_out = reviews.encode(review, outcome.answer)
    except (RecursionError, ValueError) as err:  # warnings or a patch we cannot serialize
        outcome = _internal_error(st, endpoint, review, err)
        body_out = reviews.encode(review, outcome.answer)
    duration = time.perf_counter() - started

    operation = review.operation if review.operation in _OPERATIONS else "other"  # bounded label values
    metrics.ADMISSIONS.labels(endpoint, operation, outcome.policy, outcome.result).inc()
    metrics.DURATION.labels(endpoint, outcome.result, outcome.policy.split("@", 1)[0]).observe(duration)
    if outcome.patch_ops:
        metrics.PATCH_OPERATIONS.labels(outcome.policy).inc(outcome.patch_ops)
    obj = review.object if review.object is not None else {}
    logs.log_admission(_admission_log, {
        "uid": review.uid,
        "endpoint": endpoint,
        "operation": review.operation,
        "namespace": _namespace(review),
        "pod": pods.display_name(obj),
        "dry_run": review.dry_run,
        "policy": outcome.policy,
        "revision": outcome.revision,
        "patch_ops": outcome.patch_ops,
        "result": outcome.result,
        "duration_ms": round(duration * 1000, 3),
        **({"error": outcome.error} if outcome.error else {}),
    })
    return 200, body_out


def _decide(st: ServerState, endpoint: str, review: reviews.Review) -> _Outcome:
    claim = st.claims is not None and review.is_claim() and isinstance(review.object, dict) \
        and _claim_needs_judging(endpoint, review)
    if not claim and not (review.is_pod() and review.operation == "CREATE" and isinstance(review.object, dict)):
        # Registered for pod CREATE and claim CREATE/UPDATE only; anything else is let through untouched.
        return _Outcome(reviews.Answer(allowed=True), result="skipped")
    policies = st.store.current()
    if policies is None:
        return _internal_error(st, endpoint, review,
                               RuntimeError(f"no valid policy set loaded from {st.store.directory}"))
    pod = review.object
    assert pod is not None  # checked above
    namespace = _namespace(review)
    try:
        if claim and st.claims is not None:
            dra = st.claims.dra
            if endpoint == "mutate":
                return _mutated(st, pod, namespace, policies, dra.mutate_claim(pod, namespace=namespace,
                                                                               policies=policies))
            return _validated(st, pod, namespace, policies, dra.validate_claim(pod, namespace=namespace,
                                                                               policies=policies))
        if endpoint == "mutate":
            return _mutated(st, pod, namespace, policies)
        return _validated(st, pod, namespace, policies)
    except (InputError, RecursionError) as err:
        # Input we cannot read: the API server never sends such a pod (it decodes into typed
        # structs first), so this is a hand-made or hostile request. One line, no traceback.
        reason = str(err) if isinstance(err, InputError) else "the pod is nested deeper than any Kubernetes object"
        logs.log_event(_server_log, "admission input refused", logging.WARNING, uid=review.uid,
                       endpoint=endpoint, error=reason)
        return _invalid(st, endpoint, review, reason, revision=policies.revision)
    except Exception as err:
        _server_log.exception("policy core failed", extra={"fields": {"uid": review.uid, "endpoint": endpoint}})
        return _internal_error(st, endpoint, review, err, revision=policies.revision)


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


def _mutated(st: ServerState, pod: dict[str, Any], namespace: str, policies: PolicySet,
             result: Any = None) -> _Outcome:
    if result is None and st.claims is not None and st.claims.resolving(pod):
        # A pod asking GPUs only through claims is shaped as a GPU pod (tolerations, placement terms).
        result = st.claims.mutation.mutate(pod, namespace=namespace, policies=policies,
                                           inventory=st.inventory.current(), now=datetime.now(UTC),
                                           resolved=st.claims.lookup.resolve(pod, namespace))
    if result is None:
        result = st.core.mutate(pod, namespace=namespace, policies=policies, inventory=st.inventory.current(),
                                now=datetime.now(UTC))
    policy = str(result.policy) if result.policy else ""
    if getattr(result, "denials", ()):
        # An ask no node can hold (e.g. gpus: "1k"): refused here rather than written into the pod.
        answer = reviews.Answer(allowed=False, warnings=tuple(result.warnings), denial_code=403,
                                denial_message="; ".join(result.denials),
                                audit_annotations=_audit(policy, policies.revision))
        return _Outcome(answer, result="denied", policy=policy, revision=policies.revision)
    patch = list(result.patch)
    patch_json = b""
    if patch:
        # A patch the API server cannot apply rejects the pod even with failurePolicy: Ignore,
        # so check it here and treat a bad one as an internal error (admitted unchanged).
        patch_json = orjson.dumps(patch)
        patchcheck.check(pod, patch_json)
    answer = reviews.Answer(allowed=True, patch=patch, warnings=tuple(result.warnings),
                              audit_annotations=_audit(policy, policies.revision), patch_json=patch_json)
    if patch:
        outcome = "patched"
    elif getattr(result, "mode", "") == "audit":
        outcome = "audit"
    else:
        outcome = "unchanged"
    return _Outcome(answer, result=outcome, policy=policy, revision=policies.revision, patch_ops=len(patch))


def _validated(st: ServerState, pod: dict[str, Any], namespace: str, policies: PolicySet,
               verdict: Any = None) -> _Outcome:
    if verdict is None:
        verdict = st.core.validate(pod, namespace=namespace, policies=policies, inventory=st.inventory.current(),
                                   now=datetime.now(UTC))
        if st.claims is not None and st.claims.resolving(pod):
            resolved = st.claims.lookup.resolve(pod, namespace)
            verdict = st.claims.dra.merge(verdict, st.claims.dra.validate_pod_claims(
                pod, namespace=namespace, policies=policies, resolved=resolved))
    policy = str(verdict.policy) if verdict.policy else ""
    audit = _audit(policy, policies.revision)
    if verdict.allowed:
        answer = reviews.Answer(allowed=True, warnings=tuple(verdict.warnings), audit_annotations=audit)
        return _Outcome(answer, result="allowed", policy=policy, revision=policies.revision)
    message = "; ".join(verdict.reasons) or f"denied by policy {policy or 'gpugate'}"
    answer = reviews.Answer(allowed=False, warnings=tuple(verdict.warnings), audit_annotations=audit,
                              denial_code=403, denial_message=message)
    return _Outcome(answer, result="denied", policy=policy, revision=policies.revision)


def _invalid(st: ServerState, endpoint: str, review: reviews.Review, reason: str, revision: str) -> _Outcome:
    """A pod we cannot read: admitted unchanged with the reason (denied when failing closed)."""
    message = f"gpugate could not read this pod ({reason}); "
    if st.settings.fail_closed:
        message += "denied because the webhook fails closed"
        answer = reviews.Answer(allowed=False, denial_code=400, denial_message=message, warnings=(message,))
    else:
        answer = reviews.Answer(allowed=True, warnings=(message + "admitted unchanged",))
    return _Outcome(answer, result="invalid", revision=revision, error=reason)


def _internal_error(st: ServerState, endpoint: str, review: reviews.Review, err: Exception,
                    revision: str = "") -> _Outcome:
    detail = f"{type(err).__name__}: {err}"
    if st.settings.fail_closed:
        message = (f"gpugate could not {endpoint} this pod (internal error {type(err).__name__}, uid {review.uid}); "
                   f"denied because the webhook fails closed")
        answer = reviews.Answer(allowed=False, denial_code=403, denial_message=message, warnings=(message,))
    else:
        message = (f"gpugate could not {endpoint} this pod (internal error {type(err).__name__}, uid {review.uid}); "
                   f"admitted unchanged")
        answer = reviews.Answer(allowed=True, warnings=(message,))
    return _Outcome(answer, result="error", revision=revision, error=detail)


def _refuse(endpoint: str, code: int, message: str, started: float, fields: dict[str, Any],
            drain: bool = False) -> Response:
    if drain:
        # Read (and drop) what the client is still sending: closing a socket with unread data
        # makes the kernel reset it and the client would never see the 413. Bounded, so a
        # client streaming without end is cut off instead.
        _discard(request.environ.get("wsgi.input"), DRAIN_LIMIT_BYTES)
    response = Response(_refusal(endpoint, code, message, started, fields), code, content_type="application/json")
    if drain:
        response.headers["Connection"] = "close"
    return response


def _refusal(endpoint: str, code: int, message: str, started: float, fields: dict[str, Any]) -> bytes:
    """Count and log a refused request; the JSON error body that answers it."""
    result = "too_large" if code == 413 else "bad_request"
    metrics.ADMISSIONS.labels(endpoint, "", "", result).inc()
    metrics.DURATION.labels(endpoint, result, "").observe(time.perf_counter() - started)
    logs.log_admission(_admission_log, {**fields, "result": result, "error": message,
                                        "duration_ms": round((time.perf_counter() - started) * 1000, 3)})
    return orjson.dumps({"error": message, "code": code})


def _read_body(limit: int) -> bytes | None:
    """The request body, or None when it is longer than ``limit``.

    With a Content-Length, Flask reads it. A chunked body (no length) is read here from the
    server's stream, which decodes the chunks: Werkzeug hands out an empty stream for it unless
    the server sets ``wsgi.input_terminated``, which gunicorn does not.
    """
    if request.content_length is not None:
        try:
            return request.get_data(cache=False)
        except RequestEntityTooLarge:
            return None
    stream = request.environ.get("wsgi.input")
    if stream is None:
        return b""
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = stream.read(65536)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)


def _discard(stream: Any, limit: int) -> None:
    if stream is None:
        return
    remaining = limit
    try:
        while remaining > 0:
            chunk = stream.read(min(65536, remaining))
            if not chunk:
                return
            remaining -= len(chunk)
    except Exception:  # the client went away or sent a broken chunk: nothing left to answer
        return


def _audit(policy: str, revision: str) -> dict[str, str]:
    return {"policy": policy or "none", "revision": revision}


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
