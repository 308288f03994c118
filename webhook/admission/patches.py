"""The JSON patch (RFC 6902) from one document to another, derived by comparing them. Pure.

A mutation computes the desired pod; the patch is never written by hand, it is the difference
between the pod as it came and the desired pod, with every path built here (``/`` and ``~`` in
keys escaped as RFC 6901 says). jsonpatch's ``make_patch`` gives the same result but costs more
than all the rest of a mutation (it copies and serializes its inputs and searches lists for
moves), so the comparison is done here, for the shapes mutations produce:

- dicts: ``remove`` for keys gone, ``add`` for new keys, recursion into keys on both sides;
- lists of equal length: recursion by position;
- a list that only grew at its end (tolerations, terms and expressions appended): one ``add``
  per new member at its index; one that only shrank at its end: ``remove`` from the end;
- anything else: one ``replace`` of the whole value.

Applying the result to the source gives the desired document, exactly (a property test checks it
against arbitrary JSON, and against jsonpatch's own application).
"""

from __future__ import annotations

from typing import Any

PatchOp = dict[str, Any]


def clone(obj: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars): several times faster than copy.deepcopy."""
    if isinstance(obj, dict):
        return {key: clone(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [clone(value) for value in obj]
    return obj


def make_patch(source: Any, desired: Any) -> tuple[PatchOp, ...]:
    """The operations that turn ``source`` into ``desired`` (values are shared, not copied)."""
    operations: list[PatchOp] = []
    _diff(source, desired, "", operations)
    return tuple(operations)


def escape(key: str) -> str:
    """A key as a JSON pointer token (RFC 6901: ``~`` is ``~0``, ``/`` is ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


def _diff(source: Any, desired: Any, path: str, out: list[PatchOp]) -> None:
    if _same(source, desired):
        return
    if type(source) is dict and type(desired) is dict:
        for key in source:
            if key not in desired:
                out.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in desired.items():
            if key in source:
                if source[key] is not value:  # shared subtrees (most of a pod) are skipped at once
                    _diff(source[key], value, f"{path}/{escape(key)}", out)
            else:
                out.append({"op": "add", "path": f"{path}/{escape(key)}", "value": value})
        return
    if type(source) is list and type(desired) is list:
        common = min(len(source), len(desired))
        if len(source) == len(desired):
            for index in range(common):
                _diff(source[index], desired[index], f"{path}/{index}", out)
            return
        if all(_same(source[i], desired[i]) for i in range(common)):
            if len(desired) > len(source):
                out.extend({"op": "add", "path": f"{path}/{i}", "value": desired[i]}
                           for i in range(common, len(desired)))
            else:
                out.extend({"op": "remove", "path": f"{path}/{i}"}
                           for i in range(len(source) - 1, common - 1, -1))
            return
    out.append({"op": "replace", "path": path, "value": desired})


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON. Subtrees a mutation did not touch are the same objects (the working copy shares
    them), so identity answers most calls; Python's == answers at C speed that most others differ;
    only an equal pair is walked to tell 1 from True and 1 from 1.0, which JSON keeps apart."""
    if a is b:
        return True
    if type(a) is not type(b) or a != b:
        return False
    if type(a) is dict:
        return all(_same(value, b[key]) for key, value in a.items())
    if type(a) is list:
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return True
