"""Does a JSON Patch apply to an object? Checked before the API server has to find out.

A patch the API server cannot apply is an internal error that rejects the pod even with
``failurePolicy: Ignore`` (kubernetes dispatcher.go), so the server checks every patch it is
about to send. The operations are applied copy-on-write: a container of the document (or of a
value the patch added) is copied the first time an operation writes into it, so the caller's pod
is never changed and only the few objects on the patched paths are copied, not the whole pod.
Semantics are RFC 6902's (and evanphx json-patch's): ``add`` needs the parent, ``remove``/``replace``
need the target, array indexes must be in range (``-`` appends), ``test`` compares.
"""

from __future__ import annotations

from typing import Any

import orjson


class PatchError(ValueError):
    """The patch does not apply; ``str()`` names the operation and the path."""


def check(document: Any, patch_json: str | bytes) -> None:
    """Raise PatchError unless the patch (JSON of an array of ops) applies to ``document``."""
    ops = orjson.loads(patch_json)
    if not isinstance(ops, list):
        raise PatchError("a patch is a JSON array of operations")
    state = _Document(document)
    for index, op in enumerate(ops):
        try:
            state.apply(op)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            what = f"{op.get('op')} {op.get('path')}" if isinstance(op, dict) else repr(op)
            raise PatchError(f"operation {index} ({what}) does not apply: {type(err).__name__} {err}") from err


class _Document:
    """The document being patched; containers are copied before their first change."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._owned: set[int] = set()

    def _own(self, value: Any) -> Any:
        if isinstance(value, (dict, list)) and id(value) not in self._owned:
            value = dict(value) if isinstance(value, dict) else list(value)
            self._owned.add(id(value))
        return value

    def _writable_parent(self, tokens: list[str]) -> Any:
        """The parent of the last token, with every container on the way made our own."""
        self.root = node = self._own(self.root)
        for token in tokens[:-1]:
            if isinstance(node, dict):
                child = self._own(node[token])
                node[token] = child
            elif isinstance(node, list):
                position = _index(node, token, for_add=False)
                child = self._own(node[position])
                node[position] = child
            else:
                raise TypeError(f"{token!r} is below a scalar")
            node = child
        return node

    def apply(self, op: Any) -> None:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise ValueError("an operation is an object with a string 'path'")
        kind, path = op.get("op"), op["path"]
        if kind == "add":
            self._add(path, op["value"])
        elif kind == "remove":
            self._remove(path)
        elif kind == "replace":
            _get(self.root, path)  # the target must exist
            self._set(path, op["value"])
        elif kind == "move":
            source = op["from"]
            if path == source:
                _get(self.root, source)  # a no-op, but the value must exist
                return
            if path.startswith(source + "/"):
                raise ValueError("cannot move a value into itself")
            self._add(path, self._remove(source))
        elif kind == "copy":
            self._add(path, _get(self.root, op["from"]))
        elif kind == "test":
            if _get(self.root, path) != op["value"]:
                raise ValueError("test failed")
        else:
            raise ValueError(f"unknown operation {kind!r}")

    def _add(self, pointer: str, value: Any) -> None:
        self._put(pointer, value, insert=True)

    def _set(self, pointer: str, value: Any) -> None:
        self._put(pointer, value, insert=False)

    def _put(self, pointer: str, value: Any, *, insert: bool) -> None:
        """Write ``value`` at ``pointer``: into a list, ``insert`` adds a member (``add``, where ``-``
        appends) and otherwise replaces one that must exist (``replace``)."""
        tokens = _tokens(pointer)
        if not tokens:
            self.root = value
            return
        parent = self._writable_parent(tokens)
        if isinstance(parent, dict):
            parent[tokens[-1]] = value
        elif not isinstance(parent, list):
            raise TypeError("path goes below a scalar")
        elif insert:
            parent.insert(_index(parent, tokens[-1], for_add=True), value)
        else:
            parent[_index(parent, tokens[-1], for_add=False)] = value

    def _remove(self, pointer: str) -> Any:
        tokens = _tokens(pointer)
        if not tokens:
            raise ValueError("cannot remove the whole document")
        parent = self._writable_parent(tokens)
        if isinstance(parent, dict):
            return parent.pop(tokens[-1])
        if isinstance(parent, list):
            return parent.pop(_index(parent, tokens[-1], for_add=False))
        raise TypeError("path goes below a scalar")


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
