"""Does a JSON Patch apply to an object? Checked before the API server has to find out.

A patch the API server cannot apply is an internal error that rejects the pod even with
``failurePolicy: Ignore`` (kubernetes dispatcher.go), so the server checks every patch it is
about to send. ``jsonpatch.apply`` deep-copies the document and every added value in Python,
which cost more than the mutation itself; here the document and the operations are private
copies made by a JSON round trip (C speed) and the operations are applied in place on them.
Semantics are RFC 6902's (and evanphx json-patch's): ``add`` needs the parent, ``remove``/``replace``
need the target, array indexes must be in range (``-`` appends), ``test`` compares.
"""

from __future__ import annotations

import json
from typing import Any


class PatchError(ValueError):
    """The patch does not apply; ``str()`` names the operation and the path."""


def check(document: Any, patch_json: str) -> None:
    """Raise PatchError unless the patch (JSON text of an array of ops) applies to ``document``."""
    doc = json.loads(json.dumps(document))
    ops = json.loads(patch_json)
    if not isinstance(ops, list):
        raise PatchError("a patch is a JSON array of operations")
    for index, op in enumerate(ops):
        try:
            doc = _apply(doc, op)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            what = f"{op.get('op')} {op.get('path')}" if isinstance(op, dict) else repr(op)
            raise PatchError(f"operation {index} ({what}) does not apply: {type(err).__name__} {err}") from err


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"JSON pointer {pointer!r} does not start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _index(container: list, token: str, *, for_add: bool) -> int:
    if for_add and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise ValueError(f"{token!r} is not an array index")
    position = int(token)
    limit = len(container) if for_add else len(container) - 1
    if position > limit:
        raise IndexError(f"index {position} is out of range")
    return position


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_add=False)]
        else:
            raise TypeError(f"{token!r} is below a scalar")
    return node


def _get(doc: Any, pointer: str) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return doc
    parent = _parent(doc, tokens)
    if isinstance(parent, dict):
        return parent[tokens[-1]]
    if isinstance(parent, list):
        return parent[_index(parent, tokens[-1], for_add=False)]
    raise TypeError("path goes below a scalar")


def _remove(doc: Any, pointer: str) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        raise ValueError("cannot remove the whole document")
    parent = _parent(doc, tokens)
    if isinstance(parent, dict):
        return parent.pop(tokens[-1])
    if isinstance(parent, list):
        return parent.pop(_index(parent, tokens[-1], for_add=False))
    raise TypeError("path goes below a scalar")


def _add(doc: Any, pointer: str, value: Any) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, tokens[-1], for_add=True), value)
    else:
        raise TypeError("path goes below a scalar")
    return doc


def _apply(doc: Any, op: Any) -> Any:
    if not isinstance(op, dict) or not isinstance(op.get("path"), str):
        raise ValueError("an operation is an object with a string 'path'")
    kind, path = op.get("op"), op["path"]
    if kind == "add":
        return _add(doc, path, op["value"])
    if kind == "remove":
        _remove(doc, path)
        return doc
    if kind == "replace":
        _get(doc, path)  # the target must exist
        tokens = _tokens(path)
        if not tokens:
            return op["value"]
        parent = _parent(doc, tokens)
        if isinstance(parent, dict):
            parent[tokens[-1]] = op["value"]
        else:
            parent[_index(parent, tokens[-1], for_add=False)] = op["value"]
        return doc
    if kind == "move":
        source = op["from"]
        if path == source:
            _get(doc, source)  # a no-op, but the value must exist
            return doc
        if path != source and path.startswith(source + "/"):
            raise ValueError("cannot move a value into itself")
        return _add(doc, path, _remove(doc, source))
    if kind == "copy":
        return _add(doc, path, json.loads(json.dumps(_get(doc, op["from"]))))
    if kind == "test":
        if _get(doc, path) != op["value"]:
            raise ValueError("test failed")
        return doc
    raise ValueError(f"unknown operation {kind!r}")
