"""Two policies of equal priority may load only when no pod can match both."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from webhook.kube.affinity import Requirement
from webhook.policy import overlap
from webhook.policy.model import LabelSelector, Match


@pytest.mark.parametrize(("a", "b", "intersect", "witness"), [
    ("ml-*", "ml-train", True, "ml-train"),
    ("ml-*", "web-*", False, None),
    ("*", "anything", True, "anything"),
    ("*-prod", "ml-*", True, "ml-prod"),
    ("*a*", "*b*", True, "ab"),
    ("team-?", "team-ab", False, None),
    ("team-?", "team-a", True, "team-a"),
    ("a?c", "abc", True, "abc"),
    ("a?c", "ac", False, None),
    ("ml-*-gpu", "ml-*-cpu", False, None),
    ("ml-*", "*-cpu", True, "ml-cpu"),
    ("ml", "ml-*", False, None),
    ("*", "*", True, "x"),
    ("research-*", "ml-*", False, None),
    ("[ab]x", "cx", True, None),      # a character class is over-approximated as '?': refused to be safe
    ("x[ab]", "xa", True, "xa"),
], ids=lambda v: str(v))
def test_glob_intersection(a, b, intersect, witness):
    assert overlap.globs_intersect(a, b) is intersect
    assert overlap.globs_intersect(b, a) is intersect, "intersection is symmetric"
    if witness is not None:
        assert fnmatchcase(witness, a) and fnmatchcase(witness, b), "the table's witness really matches both"


def test_glob_intersection_agrees_with_fnmatch_on_a_brute_force_alphabet():
    """Every pair of short globs over {a, b, *, ?}: intersect iff some short string matches both."""
    from itertools import product
    alphabet = "ab*?"
    globs = ["".join(p) for n in range(1, 4) for p in product(alphabet, repeat=n)]
    strings = [""] + ["".join(p) for n in range(1, 7) for p in product("ab", repeat=n)]
    for a in globs:
        for b in globs:
            brute = any(fnmatchcase(s, a) and fnmatchcase(s, b) for s in strings)
            assert overlap.globs_intersect(a, b) is brute, (a, b)


def req(key: str, op: str, *values: str) -> Requirement:
    return Requirement(key, op, values)


@pytest.mark.parametrize(("a", "b", "can_overlap"), [
    (LabelSelector(), LabelSelector(), True),
    (LabelSelector(match_labels=(("profile", "training"),)), LabelSelector(match_labels=(("profile", "inference"),)),
     False),
    (LabelSelector(match_labels=(("profile", "training"),)), LabelSelector(match_labels=(("team", "a"),)), True),
    (LabelSelector(match_expressions=(req("profile", "In", "a", "b"),)),
     LabelSelector(match_expressions=(req("profile", "In", "b", "c"),)), True),
    (LabelSelector(match_expressions=(req("profile", "In", "a"),)),
     LabelSelector(match_expressions=(req("profile", "NotIn", "a"),)), False),
    (LabelSelector(match_expressions=(req("profile", "In", "a", "b"),)),
     LabelSelector(match_expressions=(req("profile", "NotIn", "a"),)), True),
    (LabelSelector(match_expressions=(req("profile", "Exists"),)),
     LabelSelector(match_expressions=(req("profile", "DoesNotExist"),)), False),
    (LabelSelector(match_labels=(("profile", "x"),)),
     LabelSelector(match_expressions=(req("profile", "DoesNotExist"),)), False),
    (LabelSelector(match_expressions=(req("profile", "NotIn", "a"),)),
     LabelSelector(match_expressions=(req("profile", "DoesNotExist"),)), True),   # absence satisfies NotIn
    (LabelSelector(match_expressions=(req("profile", "Exists"),)),
     LabelSelector(match_expressions=(req("profile", "NotIn", "a"),)), True),
    (LabelSelector(match_expressions=(req("profile", "Exists"), req("profile", "NotIn", "a"))),
     LabelSelector(match_expressions=(req("profile", "In", "a"),)), False),
], ids=[
    "empty selectors overlap",
    "matchLabels with different values are disjoint",
    "different keys can both hold",
    "In sets sharing a value overlap",
    "In x vs NotIn x is a contradiction",
    "In a,b vs NotIn a leaves b",
    "Exists vs DoesNotExist is a contradiction",
    "matchLabels vs DoesNotExist is a contradiction",
    "NotIn vs DoesNotExist both hold when the label is absent",
    "Exists vs NotIn both hold for another value",
    "contradiction spread over two requirements of one side",
])
def test_selector_overlap(a, b, can_overlap):
    assert overlap.selectors_can_overlap(a, b) is can_overlap
    assert overlap.selectors_can_overlap(b, a) is can_overlap


@pytest.mark.parametrize(("a", "b", "can_overlap"), [
    (Match(namespaces=("ml-*",)), Match(namespaces=("web-*",)), False),
    (Match(namespaces=("ml-*", "web-*")), Match(namespaces=("web-a",)), True),
    (Match(namespaces=("ml-*",), pod_selector=LabelSelector(match_labels=(("p", "a"),))),
     Match(namespaces=("ml-*",), pod_selector=LabelSelector(match_labels=(("p", "b"),))), False),
    (Match(namespaces=("*",)), Match(namespaces=("ml-x",)), True),
], ids=["disjoint namespaces", "one of several globs overlaps", "same namespaces, disjoint selectors",
        "catch-all overlaps everything"])
def test_matches_overlap_only_when_namespaces_and_selectors_both_can(a, b, can_overlap):
    assert overlap.matches_can_overlap(a, b) is can_overlap
