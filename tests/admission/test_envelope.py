"""A review's uid and kind are found in its first bytes whatever its object holds, so a review gpugate
cannot decode is still answered (denied by validation) instead of failing the API server's call."""

from __future__ import annotations

import json
import uuid

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.server.harness import example_pod, review_of
from webhook.admission import envelope, reviews

DEEP = "__deep__"


def _nested(depth: int) -> str:
    """JSON text nested ``depth`` objects deep (built as text: no recursive encoder reaches that far)."""
    return '{"f:a":' * depth + "{}" + "}" * depth


def _api_server_bytes(review: dict, deep: int = 0) -> bytes:
    """The review as the API server writes it: request's fields in AdmissionRequest's order, ``<`` escaped;
    the string ``DEEP`` anywhere in it becomes an object nested ``deep`` levels."""
    order = ["uid", "kind", "resource", "subResource", "name", "namespace", "operation", "object", "oldObject",
             "dryRun"]
    request = {key: review["request"][key] for key in order if key in review["request"]}
    text = json.dumps({"kind": review["kind"], "apiVersion": review["apiVersion"], "request": request},
                      separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(f'"{DEEP}"', _nested(deep)).encode()


def test_a_review_nested_past_the_decoders_limit_still_gives_its_uid():
    pod = example_pod()
    pod["metadata"]["managedFields"] = [{"manager": "x", "fieldsType": "FieldsV1", "fieldsV1": DEEP}]
    review = review_of(pod, namespace="web-shop")
    body = _api_server_bytes(review, deep=9_000)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(body)
    found = envelope.review(body)
    assert found is not None
    assert found.uid == review["request"]["uid"] and found.is_pod() and found.operation == "CREATE"
    assert found.namespace == "web-shop" and found.object is None


def test_an_integer_past_64_bits_does_not_hide_the_uid():
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
             "spec": {"devices": {"config": [{"opaque": {"driver": "x", "parameters": {"n": 10**40}}}]}}}
    body = _api_server_bytes(review_of(claim, namespace="web-shop"))
    found = envelope.review(body)
    assert found is not None and found.is_claim()


@pytest.mark.parametrize("body", [
    b"", b"[]", b'"x"', b"{", b'{"kind":"AdmissionReview"}', b"not json at all",
    b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1beta1","request":{"uid":"u"}}',
    b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":""}}',
    b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"object":{"uid":"u"}}}',
])
def test_what_is_not_an_admission_review_of_our_version_with_a_uid_gives_nothing(body):
    assert envelope.review(body) is None


def test_a_uid_inside_the_object_is_never_taken_for_the_requests():
    body = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"object":'
            b'{"metadata":{"uid":"forged"}},"uid":"real"}}')
    found = envelope.read(body)
    assert found is not None and found.uid == ""   # the walk stops at object: never past it


@settings(max_examples=200, deadline=None)
@given(uid=st.uuids(), namespace=st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
       env=st.lists(st.text(max_size=20), max_size=5), depth=st.integers(0, 3000))
def test_the_envelope_agrees_with_the_decoder_wherever_the_decoder_reads(uid, namespace, env, depth):
    pod = example_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": f"E{i}", "value": v} for i, v in enumerate(env)]
    pod["spec"]["overhead"] = DEEP
    review = reviews.wrap_pod(pod, uid=str(uid), namespace=namespace)
    body = _api_server_bytes(review, deep=depth)
    found = envelope.review(body)
    assert found is not None and found.uid == str(uid) and found.namespace == namespace
    if depth < 1000:
        decoded = reviews.decode(body)
        assert (decoded.uid, decoded.kind, decoded.operation) == (found.uid, found.kind, found.operation)


def test_the_walk_is_bounded_on_a_hand_made_body():
    filler = b"[" + b"1," * (envelope.MAX_TOKENS * 2) + b"1]"
    body = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","x":' + filler + \
        b',"request":{"uid":"' + str(uuid.uuid4()).encode() + b'"}}'
    assert envelope.review(body) is None
