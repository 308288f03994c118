"""patchcheck agrees with the jsonpatch library on whether a patch applies (differential fuzz)."""

from __future__ import annotations

import copy
import json

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.admission import patchcheck

keys = st.sampled_from(["a", "b", "c/d", "e~f", "0", "1", "-"])
values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)
documents = st.dictionaries(keys, values, max_size=4)
pointers = st.lists(st.sampled_from(["a", "b", "c~1d", "e~0f", "0", "1", "2", "-", "00", "x"]), max_size=3).map(
    lambda parts: "".join("/" + p for p in parts))
operations = st.one_of(
    st.builds(lambda p, v: {"op": "add", "path": p, "value": v}, pointers, values),
    st.builds(lambda p: {"op": "remove", "path": p}, pointers),
    st.builds(lambda p, v: {"op": "replace", "path": p, "value": v}, pointers, values),
    st.builds(lambda p, f: {"op": "move", "path": p, "from": f}, pointers, pointers),
    st.builds(lambda p, f: {"op": "copy", "path": p, "from": f}, pointers, pointers),
    st.builds(lambda p, v: {"op": "test", "path": p, "value": v}, pointers, values),
)


def _library_applies(doc: dict, ops: list) -> bool:
    try:
        jsonpatch.JsonPatch(ops).apply(copy.deepcopy(doc))
        return True
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError, IndexError):
        return False


def _ours_applies(doc: dict, ops: list) -> bool:
    try:
        patchcheck.check(doc, json.dumps(ops))
        return True
    except patchcheck.PatchError:
        return False


@settings(max_examples=200, deadline=None)
@given(source=documents, target=documents)
def test_patches_made_by_make_patch_always_apply(source, target):
    ops = jsonpatch.make_patch(source, target).patch
    before = copy.deepcopy(source)
    patchcheck.check(source, json.dumps(ops))
    assert source == before, "the checked document must not change"


@settings(max_examples=300, deadline=None)
@given(doc=documents, ops=st.lists(operations, min_size=1, max_size=4))
def test_agrees_with_jsonpatch_on_random_patches(doc, ops):
    assert _ours_applies(doc, ops) == _library_applies(doc, ops)


@pytest.mark.parametrize(("ops", "message"), [
    ([{"op": "add", "path": "/spec/tolerations/-", "value": {}}], "operation 0 (add /spec/tolerations/-)"),
    ([{"op": "replace", "path": "/metadata/labels/x", "value": "1"}], "does not apply"),
    ([{"op": "remove", "path": "/spec/containers/3"}], "out of range"),
])
def test_a_patch_the_api_server_would_refuse_is_named(ops, message):
    pod = {"metadata": {"labels": {}}, "spec": {"containers": [{"name": "c"}]}}
    with pytest.raises(patchcheck.PatchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        patchcheck.check(pod, json.dumps(ops))
