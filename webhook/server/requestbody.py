"""A review's request body, read within the size limit, and the refusal of one that is not a review.

A body over the limit is refused (413), one that is not a review gets a 400 with a message; both
answer JSON, are counted and logged, and never reach the core.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from webhook import logs
from webhook.server import metrics

_admission_log = logging.getLogger(logs.ADMISSION_LOGGER)
_RESULTS = {413: "too_large", 405: "bad_request", 400: "bad_request"}


def refusal(endpoint: str, code: int, message: str, started: float, fields: dict[str, Any]) -> bytes:
    """Count and log a refused request; the JSON error body that answers it."""
    result = _RESULTS.get(code, "bad_request")
    metrics.ADMISSIONS.labels(endpoint, "", "", result).inc()
    metrics.DURATION.labels(endpoint, result, "").observe(time.perf_counter() - started)
    logs.log_admission(_admission_log, {**fields, "result": result, "error": message,
                                        "duration_ms": round((time.perf_counter() - started) * 1000, 3)})
    return orjson.dumps({"error": message, "code": code})


def read(environ: dict[str, Any], limit: int) -> bytes | None:
    """The request body from gunicorn's ``wsgi.input`` (a ``Content-Length`` body, a chunked one, or an
    HTTP/2 stream's), or None when it is longer than ``limit``: never more than ``limit`` + 1 bytes read."""
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    declared = environ.get("CONTENT_LENGTH")
    if declared and declared.isdigit():
        if int(declared) > limit:
            return None
        return bytes(stream.read(int(declared)))
    parts: list[bytes] = []
    size = 0
    while chunk := stream.read(65536):
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)
