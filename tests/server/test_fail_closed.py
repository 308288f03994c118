"""Validation fails closed on a real ``gpugate serve``: every review the API server can send gets HTTP 200,
and what the server cannot judge is denied with the reason (mutation leaves it unshaped).

The shapes are those a tenant used to get GPU pods past the policies while the validating webhook
answered with a non-200 status under failurePolicy: Ignore: a review made large by the API server's
``<`` escaping, JSON nested deeper than orjson's 1,024 levels, an integer past 64 bits in raw JSON.
"""

from __future__ import annotations

import pytest

from tests.admission.test_envelope import DEEP, _api_server_bytes
from tests.server.harness import Server, copy_policies, example_pod, review_of
from webhook.server.serverstate import API_SERVER_INPUT_BYTES, MAX_BODY_BYTES


@pytest.fixture(scope="module")
def server(module_tmp):
    srv = Server(module_tmp, policies=copy_policies(module_tmp / "policies"), workers=1).start()
    try:
        yield srv
    finally:
        srv.stop()


def _send(server: Server, endpoint: str, body: bytes) -> dict:
    http = server.session.post(f"{server.url}/{endpoint}?timeout=5s", data=body,
                               headers={"Content-Type": "application/json"}, timeout=30)
    assert http.status_code == 200, http.text[:300]
    return http.json()["response"]


def _deep_pod(where: str) -> dict:
    pod = example_pod()
    if where == "managedFields":
        pod["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                                             "fieldsType": "FieldsV1", "fieldsV1": DEEP}]
    else:
        pod["spec"]["containers"][0]["env"] = [{"name": "BIG", "value": DEEP}]
    return pod


@pytest.mark.parametrize("where", ["managedFields", "env"])
def test_a_review_nested_past_the_decoder_is_denied_by_validation_and_left_unshaped_by_mutation(server, where):
    review = review_of(_deep_pod(where), namespace="web-shop")
    body = _api_server_bytes(review, deep=1_500)
    denied = _send(server, "validate", body)
    assert denied["uid"] == review["request"]["uid"]
    assert denied["allowed"] is False and "nest" in denied["status"]["message"]
    unshaped = _send(server, "mutate", body)
    assert unshaped["allowed"] is True and "patch" not in unshaped and unshaped["warnings"]


def test_a_claim_holding_an_integer_past_64_bits_is_judged_not_refused_as_a_bad_request(server):
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "big", "namespace": "web-shop"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                            "count": 8}}],
                                  "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"n": 10**40}}}]}}}
    answer = _send(server, "validate", _api_server_bytes(review_of(claim, namespace="web-shop")))
    assert answer["allowed"] is False


def test_the_largest_review_the_api_server_makes_of_a_pod_is_judged(server):
    """3 MiB of ``<`` in an env value: six bytes each in the review, 18 MiB, judged by its namespace."""
    pod = example_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": "HTML", "value": "<" * API_SERVER_INPUT_BYTES}]
    body = _api_server_bytes(review_of(pod, namespace="web-shop"))
    assert 6 * API_SERVER_INPUT_BYTES < len(body) < MAX_BODY_BYTES
    answer = _send(server, "validate", body)
    assert answer["allowed"] is False and "GPUs are not available in web" in answer["status"]["message"]


def test_a_body_over_what_the_api_server_can_send_is_still_refused_unread(server):
    http = server.session.post(f"{server.url}/validate", data=b"{" + b" " * MAX_BODY_BYTES + b"}",
                               headers={"Content-Type": "application/json"}, timeout=30)
    assert http.status_code == 413


def test_fail_open_admits_what_it_cannot_judge_with_a_warning(module_tmp):
    workdir = module_tmp / "open"
    workdir.mkdir()
    srv = Server(workdir, policies=copy_policies(workdir / "policies"), workers=1, extra=["--fail-open"]).start()
    try:
        review = review_of(_deep_pod("managedFields"), namespace="web-shop")
        answer = _send(srv, "validate", _api_server_bytes(review, deep=1_500))
        assert answer["allowed"] is True and "admitted unchanged" in answer["warnings"][0]
    finally:
        srv.stop()
