"""The smallest WSGI app, for measuring what stock gunicorn does without gpugate's worker."""

from __future__ import annotations

from typing import Any


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body) + 2))])
    return [b"ok" + body]
