"""Who a review is from and what it is about, read from its first bytes when the whole cannot be decoded. Pure.

Why: the validating webhook fails closed, so every review the API server sends must get an answer
(HTTP 200, ``allowed: false`` with the reason) even when gpugate cannot read the object in it. The
API server's JSON decoder accepts nesting up to 10,000 levels (k8s.io/apimachinery's
``util/json``) and keeps raw JSON it does not type (``managedFields[].fieldsV1``, a claim's opaque
parameters) as sent, so a review can nest deeper than orjson's 1,024 levels or hold an integer no
64-bit decoder takes. An answer the API server accepts must echo ``request.uid``: this module finds
it (and the few request fields a refusal names) without building the document, by walking the
JSON tokens with a flat stack, so no depth can overflow it.

The API server writes ``request``'s fields in the order of ``AdmissionRequest``
(k8s.io/api ``admission/v1/types.go``): uid first, ``object`` after every field read here, so for
its reviews the walk stops within the first few hundred bytes. A hand-made body that hides the
fields behind a large value costs at most ``MAX_TOKENS`` tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.admission import reviews

MAX_TOKENS = 200_000
"""Tokens walked before giving up (a hand-made body; the API server's puts the fields first)."""

_TOKEN = re.compile(rb'[ \t\r\n]*(?:("[^"\\]*(?:\\.[^"\\]*)*")|([{}\[\],:])|([^ \t\r\n{}\[\],:"]+))', re.DOTALL)
_SCALARS = frozenset({"uid", "operation", "namespace", "name", "subResource"})
_OBJECTS = frozenset({"kind", "resource"})
_STOP = "object"


@dataclass(frozen=True)
class Envelope:
    """The fields of a review that a refusal needs: enough to answer it, nothing of its object."""

    api_version: str = ""
    kind: str = ""
    request: dict[str, Any] = field(default_factory=dict)
    """``uid``, ``operation``, ``namespace``, ``name``, ``subResource`` as strings; ``kind`` and
    ``resource`` as the small objects they are. Only those found before ``object``."""

    @property
    def uid(self) -> str:
        uid = self.request.get("uid")
        return uid if isinstance(uid, str) else ""


def review(body: bytes) -> reviews.Review | None:
    """A ``reviews.Review`` without its object, for a body ``reviews.decode`` refused: None unless the
    body is an AdmissionReview of our version with a uid (anything else is not the API server's)."""
    found = read(body)
    if found is None or found.api_version != reviews.API_VERSION or found.kind != reviews.KIND or not found.uid:
        return None
    request = found.request
    kind, resource = request.get("kind"), request.get("resource")
    return reviews.Review(uid=found.uid, operation=str(request.get("operation", "")),
                          kind=kind if isinstance(kind, dict) else {},  # type: ignore[arg-type]
                          resource=resource if isinstance(resource, dict) else {},  # type: ignore[arg-type]
                          sub_resource=str(request.get("subResource", "")),
                          namespace=str(request.get("namespace", "")), name=str(request.get("name", "")),
                          dry_run=False, object=None, raw={"uid": found.uid})


def read(body: bytes) -> Envelope | None:
    """The envelope of ``body``, or None when it does not start like a JSON object with a ``request``."""
    walker = _Walker(body)
    try:
        return walker.walk()
    except (ValueError, orjson.JSONDecodeError):
        return None


class _Walker:
    """A flat walk over the tokens: the containers open above the current token, as a list."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.stack: list[str] = []      # "{" or "[" per open container
        self.keys: list[str | None] = []  # the key each open object's current value sits under
        self.top: dict[str, Any] = {}
        self.request: dict[str, Any] = {}
        self.capture_from = -1          # where a small request object (kind, resource) starts

    def walk(self) -> Envelope | None:
        position, expect_key = 0, False
        for _ in range(MAX_TOKENS):
            match = _TOKEN.match(self.body, position)
            if match is None:
                break
            position = match.end()
            text, punct, scalar = match.groups()
            if punct is not None:
                expect_key = self._punct(punct, match.start(2), position)
                if not self.stack:
                    break
                continue
            value = text if text is not None else scalar
            if expect_key and text is not None:
                self._key(orjson.loads(text))
                if len(self.stack) == 2 and self._in_request() and self.keys[-1] == _STOP:
                    break
                expect_key = False
                continue
            self._value(value)
        if self.top.get("request") is not True and not self.request:
            return None
        return Envelope(api_version=str(self.top.get("apiVersion", "")), kind=str(self.top.get("kind", "")),
                        request=self.request)

    def _punct(self, punct: str | bytes, start: int, end: int) -> bool:
        """Open or close a container; whether a key comes next."""
        char = punct.decode() if isinstance(punct, bytes) else punct
        if char in "{[":
            if self._in_request() and self.keys[-1] in _OBJECTS and len(self.stack) == 2:
                self.capture_from = start
            if len(self.stack) == 1 and self.keys[-1] == "request" and char == "{":
                self.top["request"] = True
            self.stack.append(char)
            self.keys.append(None)
            return char == "{"
        if char in "}]":
            if not self.stack:
                raise ValueError("unbalanced")
            self.stack.pop()
            self.keys.pop()
            if self.capture_from >= 0 and len(self.stack) == 2 and self._in_request():
                small = orjson.loads(self.body[self.capture_from:end])
                self.request[str(self.keys[-1])] = small
                self.capture_from = -1
            return False
        if char == ",":
            return bool(self.stack) and self.stack[-1] == "{"
        return False  # ":"

    def _key(self, key: Any) -> None:
        if not self.stack or self.stack[-1] != "{":
            raise ValueError("a key outside an object")
        self.keys[-1] = str(key)

    def _value(self, raw: bytes) -> None:
        depth = len(self.stack)
        if depth == 1 and self.keys[-1] in ("apiVersion", "kind"):
            self.top[str(self.keys[-1])] = orjson.loads(raw)
        elif depth == 2 and self._in_request() and self.keys[-1] in _SCALARS:
            value = orjson.loads(raw)
            if isinstance(value, str):
                self.request[str(self.keys[-1])] = value

    def _in_request(self) -> bool:
        return len(self.stack) >= 2 and self.stack[0] == "{" and self.stack[1] == "{" and self.keys[0] == "request"
