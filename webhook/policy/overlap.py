"""Prove that two policies' matches cannot select the same pod, or report the pair.

Equal priorities that could both match would make the outcome depend on file order, so the
loader refuses them. "Could" is decided conservatively: two matches are disjoint only when a
namespace-glob pair or a label requirement pair provably excludes every common pod.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

from webhook.kube.affinity import Requirement
from webhook.policy.model import GPUPolicy, LabelSelector, Match


def conflicts(policies: list[GPUPolicy]) -> list[str]:
    problems = []
    for first, second in combinations(policies, 2):
        if first.priority == second.priority and first.mode != "off" and second.mode != "off" \
                and matches_can_overlap(first.match, second.match):
            problems.append(
                f"{second.source}, spec.priority: policies '{first.name}' and '{second.name}' both have priority "
                f"{first.priority} and can match the same pod; give one a higher priority or make their "
                f"namespaces or podSelector disjoint"
            )
    return problems


def matches_can_overlap(a: Match, b: Match) -> bool:
    if not any(globs_intersect(x, y) and not _covered(y, a.exclude_namespaces) and not _covered(x, b.exclude_namespaces)
               for x in a.namespaces for y in b.namespaces):
        return False
    return selectors_can_overlap(a.pod_selector, b.pod_selector)


def selectors_can_overlap(a: LabelSelector, b: LabelSelector) -> bool:
    requirements = a.requirements() + b.requirements()
    by_key: dict[str, list[Requirement]] = {}
    for requirement in requirements:
        by_key.setdefault(requirement.key, []).append(requirement)
    return all(_satisfiable(group) for group in by_key.values())


def _satisfiable(group: list[Requirement]) -> bool:
    """Can one label value (or its absence) satisfy every requirement on the same key?"""
    must_exist = any(r.operator in ("In", "Exists") for r in group)
    must_be_absent = any(r.operator == "DoesNotExist" for r in group)
    if must_exist and must_be_absent:
        return False
    if must_be_absent:
        return True
    allowed: set[str] | None = None
    for requirement in group:
        if requirement.operator == "In":
            values = set(requirement.values)
            allowed = values if allowed is None else allowed & values
    forbidden = {v for r in group if r.operator == "NotIn" for v in r.values}
    if allowed is None:
        return True  # Exists / NotIn only: some other value, or absence, satisfies them
    return bool(allowed - forbidden)


def _covered(glob: str, excludes: tuple[str, ...]) -> bool:
    """True when every namespace matching ``glob`` is excluded (proved for the simple, common shapes)."""
    for exclude in excludes:
        if exclude == glob or exclude == "*":
            return True
        prefix = exclude[:-1]
        if exclude.endswith("*") and not any(c in prefix for c in "*?[") and glob.startswith(prefix):
            return True
    return False


def globs_intersect(a: str, b: str) -> bool:
    """True when some string matches both fnmatch globs (``*``, ``?`` and literals; ``[...]`` as ``?``)."""
    return _intersect(_tokens(a), _tokens(b))


def _tokens(glob: str) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if char == "[":
            end = glob.find("]", i + 1)
            if end != -1:
                out.append("?")  # a character class: over-approximate as any one character
                i = end + 1
                continue
        out.append(char)
        i += 1
    return tuple(out)


@lru_cache(maxsize=4096)
def _intersect(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    seen: set[tuple[int, int]] = set()
    stack = [(0, 0)]
    while stack:
        i, j = stack.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(a) and j == len(b):
            return True
        if i < len(a) and a[i] == "*":
            stack.append((i + 1, j))
        if j < len(b) and b[j] == "*":
            stack.append((i, j + 1))
        if i < len(a) and j < len(b):
            x, y = a[i], b[j]
            if x == "*" and y == "*":
                continue
            if x in "*?" or y in "*?" or x == y:
                stack.append((i if x == "*" else i + 1, j if y == "*" else j + 1))
    return False
