"""The worker's lean path for the two admission calls: which requests take it, and their answer's bytes. Pure.

Why: a review through gunicorn's parser, its WSGI environ and response, and Flask's request
context, URL map, request and response objects cost about 0.8 ms of CPU in a worker (in-process, the
null webhook's review; `python benchmarks/create_latency.py` shows what it adds to a pod create). The
API server's call is always the same shape: ``POST /mutate?timeout=10s HTTP/1.1``, a JSON body with a
``Content-Length``, on a kept-alive connection. Such a request, once the loop has it whole, goes
straight to the route's function (``routes.lean_routes``: body in, status and JSON out) and its answer
is written here, in one piece. Anything else (another method or path, HTTP/1.0, a chunked body, a
header line this module does not read plainly) takes the full gunicorn + Flask path, as before, so
the errors it answers stay the parser's and the app's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

LeanRoute = Callable[[bytes], tuple[int, bytes]]
"""A route's function: the request body in, (HTTP status, JSON body) out; it never raises for bad input."""



@dataclass(frozen=True)
class LeanRoutes:
    """What an app offers the lean path (under ``worker.LEAN_ROUTES`` in its ``extensions``)."""

    routes: Mapping[str, LeanRoute]
    """Path -> the route's function."""
    inline: bool
    """The functions do no I/O (only CPU), so the worker's loop may run them itself instead of handing
    them to a thread. False when a route reads from the API (``--resolve-claims``)."""


_CRLF = b"\r\n"
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REASONS = {200: "OK", 400: "Bad Request", 413: "Payload Too Large"}


@dataclass(frozen=True, slots=True)
class LeanRequest:
    path: str
    """The route's path, without the query (the API server adds ``?timeout=10s``)."""
    body: bytes
    closes: bool
    """The client asked to close after the answer (``Connection: close``)."""
    raw: bytes
    """The whole request, for the full path should the route's function fail."""


def lean_request(data: bytes, body_start: int, paths: Collection[str]) -> LeanRequest | None:
    """``data`` (one whole request, framed by ``framing.frame``) if it may take the lean path, else None."""
    line_end = data.find(_CRLF)
    if line_end <= 0:
        return None  # empty lines before the request line: the full parser skips them
    parts = data[:line_end].split(b" ")
    if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1":
        return None
    target = parts[1]
    if not target.startswith(b"/") or not target.isascii():
        return None
    path = target.split(b"?", 1)[0].decode("ascii")
    if path not in paths:
        return None
    closes = False
    has_length = False
    for header in data[line_end + 2:body_start - 4].split(_CRLF):
        name, colon, value = header.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            return None  # obs-fold, a space before the colon, no colon: the parser's 400
        key = name.lower()
        if key == b"transfer-encoding":
            return None
        if key == b"content-length":
            has_length = True
        elif key == b"connection":
            closes = b"close" in (token.strip() for token in value.lower().split(b","))
    if not has_length:
        return None
    return LeanRequest(path=path, body=data[body_start:], closes=closes, raw=data)


def answer(status: int, body: bytes, *, close: bool, date: str) -> bytes:
    """The whole HTTP/1.1 answer: status line, headers and JSON body, to be sent in one write."""
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Date: {date}\r\n"
            f"Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n")
    return head.encode("latin-1") + body
