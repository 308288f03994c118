"""YAML as Kubernetes reads it for our purposes: safe, and a duplicated key is an error.

PyYAML keeps the last of two equal keys without a word; in a policy that silently drops half of
what a platform engineer wrote (``gpu:`` twice, say), so it is refused with its line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with a repeated key."""


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key: let the base constructor report it
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"found duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})", key_node.start_mark)
        seen[key] = key_node
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_all(data: str | bytes) -> Iterator[Any]:
    return yaml.load_all(data, Loader=StrictLoader)


def describe_error(err: yaml.YAMLError) -> str:
    """A YAML error as ", line L, column C: invalid YAML: what", to follow the file's name.

    PyYAML's own text names ``<unicode string>`` and spreads the position over several lines with
    the source echoed; this says only what the reader of the file needs.
    """
    mark = getattr(err, "problem_mark", None)
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).split("\n", 1)[0]
    return f"{where}: invalid YAML: {problem}"


FastLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""PyYAML's SafeLoader written in C (libyaml), when PyYAML was built with it: the same safe
constructors, several times faster on the stack's large files (CRDs, values, chart renders)."""


def fast_load(data: str | bytes) -> Any:
    """``yaml.safe_load`` through libyaml (duplicate keys are not checked: for our own generated and
    upstream files, never for what a person writes by hand and gpugate must judge)."""
    return yaml.load(data, Loader=FastLoader)
