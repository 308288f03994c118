"""The patch derivation (webhook.admission.patches) against jsonpatch, on any JSON documents.

The webhook derives its patches itself (jsonpatch's make_patch costs more than the rest of a
mutation); these properties hold it to the RFC: applying the derived patch with jsonpatch, an
independent implementation, turns the source into the target exactly, JSON types included.
"""

from __future__ import annotations

import copy
import json

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.admission import patchcheck, patches

keys = st.text(alphabet="ab/~.-", min_size=0, max_size=4)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 1.0]),
                    st.text(alphabet="xy", max_size=2))
json_values = st.recursive(scalars, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)), max_leaves=20)


def same_json(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@settings(max_examples=400, deadline=None)
@given(json_values, json_values)
def test_the_patch_turns_any_document_into_any_other(source, target) -> None:
    before = copy.deepcopy(source)
    ops = list(patches.make_patch(source, target))
    assert same_json(source, before), "derivation must not change its input"
    result = jsonpatch.apply_patch(source, copy.deepcopy(ops))
    assert same_json(result, target), ops
    patchcheck.check(source, json.dumps(ops))


@st.composite
def grown(draw: st.DrawFn):
    """A document and a copy changed the way mutation steps change pods: keys added, lists appended to."""
    source = draw(st.dictionaries(keys, json_values, min_size=1, max_size=4))
    target = copy.deepcopy(source)
    for key in draw(st.lists(st.sampled_from(sorted(source)), max_size=3)):
        value = target[key]
        if isinstance(value, list):
            value.extend(draw(st.lists(json_values, min_size=1, max_size=2)))
        elif isinstance(value, dict):
            value[draw(keys)] = draw(json_values)
        else:
            target[key] = draw(json_values)
    new_key = draw(keys.filter(lambda k: k not in source))
    target[new_key] = draw(json_values)
    return source, target


@settings(max_examples=300, deadline=None)
@given(grown())
def test_growth_is_expressed_as_adds_never_as_a_replaced_list(pair) -> None:
    source, target = pair
    ops = patches.make_patch(source, target)
    assert same_json(jsonpatch.apply_patch(source, copy.deepcopy(list(ops))), target)
    lists_grown = [k for k, v in source.items() if isinstance(v, list) and isinstance(target.get(k), list)
                   and len(target[k]) > len(v)]
    for key in lists_grown:
        assert not any(op["op"] == "replace" and op["path"] == f"/{patches.escape(key)}" for op in ops), ops


def test_keys_with_slash_and_tilde_are_escaped() -> None:
    ops = patches.make_patch({"metadata": {}}, {"metadata": {"gpugate.io/policy": "a", "x~y": 1}})
    assert [op["path"] for op in ops] == ["/metadata/gpugate.io~1policy", "/metadata/x~0y"]


def test_one_and_true_are_different_json() -> None:
    assert patches.make_patch({"a": [1]}, {"a": [True]}) == ({"op": "replace", "path": "/a/0", "value": True},)
