"""The JSON patch from one document to another: ``jsonpatch.make_patch``, given only what differs.

jsonpatch is exact but costly: it copies and serializes whatever it is given. A mutation changes
a few fields of a large pod, so the documents are reduced to a skeleton of their differences
first; the operations are the same, at a fraction of the cost (benchmarks/mutate_core.py).
"""

from __future__ import annotations

from typing import Any

import jsonpatch

PatchOp = dict[str, Any]


def clone(obj: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars): several times faster than copy.deepcopy."""
    if isinstance(obj, dict):
        return {key: clone(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [clone(value) for value in obj]
    return obj


def make_patch(source: Any, desired: Any) -> tuple[PatchOp, ...]:
    """``jsonpatch.make_patch`` over the parts that differ: the same operations, a fraction of the work.

    jsonpatch copies and serializes whatever it is given, which costs more than everything else a
    mutation does. So it is given a skeleton: subtrees both pods share are stripped (equal dict
    members dropped, equal list members replaced by a per-position marker, so every path of what
    differs is kept), and each wholly new value is replaced by a unique marker that is swapped back
    into the operation afterwards. A list member that differs in a list whose length changed is
    kept whole on both sides, so any operation jsonpatch emits for it carries the full value.
    """
    added: dict[str, Any] = {}
    pruned_source, pruned_desired = _strip_shared(source, desired, added)
    operations = jsonpatch.make_patch(pruned_source, pruned_desired).patch
    for operation in operations:
        value = operation.get("value")
        if isinstance(value, str) and value in added:
            operation["value"] = added[value]
    return tuple(operations)


def _new(value: Any, added: dict[str, Any]) -> Any:
    """A marker standing for a value only the desired pod has (scalars stand for themselves)."""
    if not isinstance(value, (dict, list)):
        return value
    marker = f"\0new-{len(added)}"
    added[marker] = value
    return marker


def _strip_shared(source: Any, desired: Any, added: dict[str, Any]) -> tuple[Any, Any]:
    if isinstance(source, dict) and isinstance(desired, dict):
        kept_source: dict[str, Any] = {}
        kept_desired: dict[str, Any] = {}
        for key, value in source.items():
            if key not in desired:
                kept_source[key] = value
            elif _same(value, desired[key]):
                continue
            else:
                kept_source[key], kept_desired[key] = _strip_shared(value, desired[key], added)
        for key, value in desired.items():
            if key not in source:
                kept_desired[key] = _new(value, added)
        return kept_source, kept_desired
    if isinstance(source, list) and isinstance(desired, list):
        common = min(len(source), len(desired))
        same = [_same(source[i], desired[i]) for i in range(common)]
        # Only a lone differing member among unique markers, in a list that kept its length, is
        # certain to be paired by position (jsonpatch then diffs inside it): only it is stripped.
        # Two stripped members could look alike and be paired crosswise.
        lone = len(source) == len(desired) and same.count(False) == 1
        left: list[Any] = []
        right: list[Any] = []
        for i in range(common):
            if same[i]:
                left.append(f"\0same-{i}")
                right.append(f"\0same-{i}")
            elif lone:
                a, b = _strip_shared(source[i], desired[i], added)
                left.append(a)
                right.append(b)
            else:
                left.append(source[i])
                right.append(desired[i])
        return left + source[common:], right + [_new(v, added) for v in desired[common:]]
    return source, desired


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON: Python's == plus a type check, since 1 == True but "1" != "true" in JSON."""
    return type(a) is type(b) and a == b
