"""A review's request body, read within the size limit, and the refusal of one that is not a review.

A body over the limit is refused before it is buffered (413), one that is malformed gets a 400 with
a message; both answer JSON, are counted and logged, and never reach the core.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from flask import Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from webhook import logs
from webhook.admission import metrics

DRAIN_LIMIT_BYTES = 16 * 1024 * 1024
"""How much of an over-limit body is read and dropped so the client can see its 413."""

_admission_log = logging.getLogger(logs.ADMISSION_LOGGER)


def refuse(endpoint: str, code: int, message: str, started: float, fields: dict[str, Any],
           drain: bool = False) -> Response:
    """Answer ``code`` (400 or 413) with ``message`` for a body that is not a review we read."""
    if drain:
        # Read (and drop) what the client is still sending: closing a socket with unread data
        # makes the kernel reset it and the client would never see the 413. Bounded, so a
        # client streaming without end is cut off instead.
        discard(request.environ.get("wsgi.input"), DRAIN_LIMIT_BYTES)
    response = Response(refusal(endpoint, code, message, started, fields), code, content_type="application/json")
    if drain:
        response.headers["Connection"] = "close"
    return response


def refusal(endpoint: str, code: int, message: str, started: float, fields: dict[str, Any]) -> bytes:
    """Count and log a refused request; the JSON error body that answers it."""
    result = "too_large" if code == 413 else "bad_request"
    metrics.ADMISSIONS.labels(endpoint, "", "", result).inc()
    metrics.DURATION.labels(endpoint, result, "").observe(time.perf_counter() - started)
    logs.log_admission(_admission_log, {**fields, "result": result, "error": message,
                                        "duration_ms": round((time.perf_counter() - started) * 1000, 3)})
    return orjson.dumps({"error": message, "code": code})


def read(limit: int) -> bytes | None:
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


def discard(stream: Any, limit: int) -> None:
    """Read and drop up to ``limit`` bytes of ``stream``; a client that went away ends it quietly."""
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
