"""Fuzz a real server: random bodies and damaged real reviews never get a 5xx or a broken answer.

Every 200 must be a well-formed AdmissionReview for the request's uid whose patch (if any)
applies to the request's object; every refusal must be a 400 with a message.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import jsonpatch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.harness import REPO, example_pod, review_of
from webhook.admission import reviews

FUZZ = settings(max_examples=int(os.environ.get("GPUGATE_FUZZ_EXAMPLES", "120")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _sample_reviews() -> list[dict[str, Any]]:
    """The example pod and the pods of the policy golden cases, as reviews in their namespaces."""
    reviews = [review_of(example_pod())]
    for case in sorted((REPO / "policies" / "tests").glob("*/case.yaml")):
        pod_file = case.parent / "pod.yaml"
        if pod_file.exists():
            namespace = (yaml.safe_load(case.read_text()) or {}).get("namespace", "default")
            reviews.append(review_of(yaml.safe_load(pod_file.read_text()), namespace=str(namespace)))
    return reviews


SAMPLES = _sample_reviews()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | st.sampled_from(["", "0", "-1", "1e9", "4", "nvidia.com/gpu", "100m", "2Gi", "NaN"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += _paths(value, prefix + (index,))
    return out


@st.composite
def damaged_reviews(draw: st.DrawFn) -> dict[str, Any]:
    review = copy.deepcopy(draw(st.sampled_from(SAMPLES)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(review) if p]
        path = draw(st.sampled_from(paths))
        parent = review
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "delete", "insert"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = draw(json_values)
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = draw(json_values)
        else:
            parent.insert(path[-1], draw(json_values))
    return review


def _check(server, endpoint: str, body: bytes, request_doc: Any) -> None:
    http = server.post(endpoint, body)
    assert http.status_code < 500, http.text
    if http.status_code != 200:
        assert http.status_code == 400 and http.json()["error"], http.text
        return
    document = http.json()
    assert document["apiVersion"] == "admission.k8s.io/v1" and document["kind"] == "AdmissionReview"
    response = document["response"]
    request = request_doc["request"]
    assert response["uid"] == request["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["code"] == 403 and response["status"]["message"]
    assert all(isinstance(w, str) for w in response.get("warnings", []))
    failures = [w for w in response.get("warnings", []) if "internal error" in w]
    if failures:
        # The core raised on this (type-damaged) pod: admitted unchanged, with the uid to find the log line.
        assert response["allowed"] is True and "patch" not in response and request["uid"] in failures[0]
    if "patch" in response:
        assert response["patchType"] == "JSONPatch" and response["allowed"] is True
        ops = reviews.decode_patch(response["patch"])
        assert ops, "an empty patch must not be sent"
        jsonpatch.apply_patch(request["object"], ops)          # raises if it does not apply
    else:
        assert "patchType" not in response


@FUZZ
@given(body=st.binary(max_size=512) | json_values.map(lambda v: json.dumps(v).encode()),
       endpoint=st.sampled_from(["mutate", "validate"]))
def test_random_bodies_get_400_or_a_review(server, body, endpoint):
    http = server.post(endpoint, body)
    assert http.status_code in (200, 400), http.text
    if http.status_code == 400:
        assert http.json()["error"]


@FUZZ
@given(review=damaged_reviews(), endpoint=st.sampled_from(["mutate", "validate"]))
def test_damaged_reviews_get_a_well_formed_answer(server, review, endpoint):
    _check(server, endpoint, json.dumps(review).encode(), review)
